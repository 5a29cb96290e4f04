"""Bad input to the GPT-SoVITS v3 family: each raises a specific error that names the problem and the fix,
before any audio is made."""

from __future__ import annotations

import shutil

import pytest
from gpt_sovits_fixtures import REFERENCE_TEXT, write_signal

from voicehub import AutoModelForTextToSpeech, TTSInferencer
from voicehub.errors import AudioFormatError, CheckpointError, InvalidTextError, ModelNotFoundError
from voicehub.models.gpt_sovits import Voice, load
from voicehub.models.gpt_sovits.reference import ReferenceAudioError


def _explicit(tiny_set, **paths):
    files = dict(gpt_path=tiny_set / "gpt.ckpt", sovits_path=tiny_set / "sovits.pth")
    return load(None, pretrained_dir=tiny_set / "pretrained_models", **{**files, **paths})


def test_sovits_file_given_as_gpt(tiny_set):
    with pytest.raises(CheckpointError, match=r"SoVITS weights file.*not a GPT.*pass it as sovits_path"):
        _explicit(tiny_set, gpt_path=tiny_set / "sovits.pth")


def test_gpt_file_given_as_sovits(tiny_set):
    with pytest.raises(CheckpointError, match=r"GPT \(text-to-semantic\) checkpoint, not a SoVITS one"):
        _explicit(tiny_set, sovits_path=tiny_set / "gpt.ckpt")


@pytest.mark.parametrize("header, version", [(b"01", "v2"), (b"05", "v2Pro"), (b"04", "v4")])
def test_other_versions_are_named(tiny_set, tmp_path, header, version):
    # upstream's process_ckpt.py marks a file's version by overwriting the zip's "PK" with two bytes
    data = (tiny_set / "sovits.pth").read_bytes()
    other = tmp_path / f"{version}.pth"
    other.write_bytes(header + data[2:])
    with pytest.raises(
        CheckpointError, match=rf"GPT-SoVITS {version} SoVITS checkpoint; VoiceHub loads v3 only"
    ):
        _explicit(tiny_set, sovits_path=other)


def test_missing_pretrained_folder(tiny_set, tmp_path):
    for name in ("gpt.ckpt", "sovits.pth"):
        shutil.copy(tiny_set / name, tmp_path / name)
    with pytest.raises(ModelNotFoundError, match=r"no pretrained_models folder.*chinese-hubert-base"):
        load(tmp_path)
    with pytest.raises(ModelNotFoundError, match=r"pretrained_models folder .* does not exist"):
        load(tmp_path, pretrained_dir=tmp_path / "nowhere")
    partial = tmp_path / "pretrained_models"
    shutil.copytree(tiny_set / "pretrained_models" / "chinese-hubert-base", partial / "chinese-hubert-base")
    shutil.copytree(
        tiny_set / "pretrained_models" / "chinese-roberta-wwm-ext-large",
        partial / "chinese-roberta-wwm-ext-large",
    )
    with pytest.raises(ModelNotFoundError, match="no models--nvidia--bigvgan_v2_24khz_100band_256x/ folder"):
        load(tmp_path)


def test_lora_needs_its_base(tiny_set, tmp_path):
    pretrained = tmp_path / "pretrained_models"
    for name in (
        "chinese-hubert-base",
        "chinese-roberta-wwm-ext-large",
        "models--nvidia--bigvgan_v2_24khz_100band_256x",
    ):
        shutil.copytree(tiny_set / "pretrained_models" / name, pretrained / name)
    with pytest.raises(CheckpointError, match=r"LoRA; its base s2Gv3.pth is needed"):
        load(
            None,
            gpt_path=tiny_set / "gpt.ckpt",
            sovits_path=tiny_set / "lora/sovits_lora.pth",
            pretrained_dir=pretrained,
        )


def test_missing_or_ambiguous_files(tiny_set, tmp_path):
    with pytest.raises(ModelNotFoundError, match="GPT checkpoint .*does not exist"):
        _explicit(tiny_set, gpt_path=tmp_path / "none.ckpt")
    with pytest.raises(ModelNotFoundError, match="no file or folder"):
        load(tmp_path / "absent")
    shutil.copy(tiny_set / "sovits.pth", tmp_path / "a.pth")
    shutil.copy(tiny_set / "sovits.pth", tmp_path / "b.pth")
    shutil.copy(tiny_set / "gpt.ckpt", tmp_path / "g.ckpt")
    with pytest.raises(
        ModelNotFoundError, match=r"exactly one SoVITS v3 weights file.*a.pth, b.pth.*sovits_path="
    ):
        load(tmp_path)
    # With pretrained_models present the hub recognises the folder by content and says what to pass.
    (tmp_path / "pretrained_models").symlink_to(tiny_set / "pretrained_models")
    with pytest.raises(ModelNotFoundError, match=r"exactly one SoVITS v3 weights file.*sovits_path="):
        AutoModelForTextToSpeech.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="needs gpt_path"):
        TTSInferencer(sovits_path=tiny_set / "sovits.pth")


@pytest.mark.parametrize("seconds", [2.0, 11.0])
def test_reference_outside_3_to_10_seconds(model, tmp_path, seconds):
    ref = write_signal(tmp_path / "ref.wav", seconds)
    with pytest.raises(ReferenceAudioError, match=rf"{seconds:.2f} s long.*3 to 10 s"):
        model.stream("Hello there.", voice=Voice(ref, "Some words here.", "en"), text_language="en")


def test_unreadable_reference(model, tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF....this is not audio")
    with pytest.raises(AudioFormatError, match="bad.wav"):
        model.stream("Hello there.", voice=Voice(bad, "Some words here.", "en"), text_language="en")
    with pytest.raises(AudioFormatError, match="does not exist"):
        model.stream("Hello there.", voice=Voice(tmp_path / "gone.wav", "Words.", "en"), text_language="en")


def test_empty_prompt_text_and_empty_text(model, voice, reference_wav):
    with pytest.raises(InvalidTextError, match="prompt text is empty"):
        Voice(reference_wav, "  ", "en")
    with pytest.raises(InvalidTextError, match="text is empty"):
        model.stream("   ", voice=voice)
    with pytest.raises(InvalidTextError, match="no letters or digits"):
        model.stream("。。。!!!", voice=voice)


@pytest.mark.parametrize(
    "params, error, message",
    [
        ({"text_language": "klingon"}, ValueError, r"unknown language 'klingon'.*all_zh.*auto"),
        ({"prompt_language": "xx"}, ValueError, r"unknown language 'xx'"),
        ({"how_to_cut": "cut9"}, ValueError, r"unknown cut method 'cut9'.*every_50_chars.*punctuation"),
        ({"preset": "turbo"}, ValueError, r"unknown preset 'turbo'; valid presets: fast, balanced, quality"),
        ({"speed": 0}, ValueError, r"speed must be in"),
        ({"sample_steps": 0}, ValueError, r"sample_steps"),
        ({"top_k": 0}, ValueError, r"top_k must be >= 1"),
        ({"top_p": 1.5}, ValueError, r"top_p must be in \(0, 1\]"),
        ({"force_n_tokens": 0}, ValueError, r"force_n_tokens must be >= 1"),
        ({"pause_s": -1}, ValueError, r"pause_s"),
        ({"length_scale": 1.2}, TypeError, r"unknown GPT-SoVITS parameter\(s\) length_scale; valid: preset"),
    ],
)
def test_bad_request_parameters(model, voice, params, error, message):
    with pytest.raises(error, match=message):
        model.stream("Hello there.", voice=voice, **params)


def test_voice_language_is_checked(reference_wav):
    with pytest.raises(ValueError, match=r"unknown language 'elvish'.*中文"):
        Voice(reference_wav, REFERENCE_TEXT, "elvish")
