"""The end-to-end workload and how one request of it is timed: the texts and the token rule, the fast
preset, the synthetic reference, a profile's load, the first AudioChunk's time and where it goes, peak
GPU memory. Shared by e2e_bench.py and its process-start children (e2e_startup.py); e2e_bench.py's
docstring describes the workload, and other benchmarks (streams_bench.py) import it from there."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

TEXTS = {
    "short": "This is a short test sentence.",
    "medium": "The quick brown fox jumps over the lazy dog and then it runs far away into the quiet green forest.",
    "long": (
        "When the morning train finally pulled into the old station the passengers gathered their bags "
        "and stepped out onto the cold platform where a small crowd of friends and families had been "
        "waiting for more than an hour to welcome them home after the long journey across the mountains."
    ),
}
TOKENS_PER_CHAR = 1.5  # 25 semantic tokens/s over ~17 characters/s of read English
MIN_TOKENS = 30  # >= 1.2 s of audio: the first chunk must carry >= 0.25 s
# The issue-4 fast workload: the `fast` preset (speed 1.3, 4 CFM steps, temperature 0.6) with top_k 5
# (the value; the preset itself says 3), punctuation cut.
PRESET = "fast"
FAST = dict(how_to_cut="punctuation", sample_steps=4, top_k=5, top_p=1.0, temperature=0.6)
SEED = 1234
PROMPT_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest."
# the graph preset under each Triton profile: triton = full + Triton kernels, triton_minimal = minimal + ...
TRITON_PRESETS = {"triton": "full", "triton_minimal": "minimal"}


def n_tokens(text: str) -> int:
    return max(MIN_TOKENS, round(TOKENS_PER_CHAR * len(text)))


def write_reference(
    path: Path, seconds: float = 5.0, sample_rate: int = 24000, pitch_hz: float = 130.0
) -> Path:
    """A speech-like stand-in for a reference clip (no phonemizer on the GPU machine): 8 harmonics
    of a pitch gliding around pitch_hz, gated into ~4 syllables/s with two pauses; peak 0.5.
    The same kind of signal as tests/gpt_sovits_fixtures.write_synthetic_voice."""
    t = np.arange(int(round(seconds * sample_rate))) / sample_rate
    f0 = pitch_hz + 30 * np.sin(2 * np.pi * 0.35 * t) + 15 * np.sin(2 * np.pi * 1.7 * t + 1.0)  # Hz
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 9))
    syllables = np.clip(np.sin(2 * np.pi * 4.1 * t) + 0.3, 0.0, None) ** 0.7
    pauses = (np.abs(t - 1.6) > 0.15) & (np.abs(t - 3.4) > 0.2)
    audio = voiced * syllables * pauses * np.minimum(1.0, np.minimum(t, seconds - t) / 0.05)
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, (0.5 * audio / np.abs(audio).max()).astype(np.float32), sample_rate)
    return path


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def load_profile(set_dir: Path, device: str, dtype: str, profile: str, strict: bool = True, voice=None):
    """Load the set as `profile` (voice: its default_voice, warmed up at load); returns (model,
    optimization manifest or None). triton applies its kernels at load (from_pretrained's
    optimization_config); strict=False: if they cannot apply, the graphs-only model is loaded instead and
    the error is put in the manifest."""
    from voicehub import AutoModelForTextToSpeech
    from voicehub.models.gpt_sovits.model import MODEL_TYPE
    from voicehub.optimization.config import TTSOptimizationConfig

    # No CUDA graphs off CUDA: there `full` and `triton` load eagerly (and triton then says why it cannot run).
    preset = TRITON_PRESETS.get(profile, profile)
    preset = preset if device.startswith("cuda") else "off"
    kw = dict(
        model_type=MODEL_TYPE, device=device, dtype=dtype, cuda_graph_preset=preset, default_voice=voice
    )
    if profile not in TRITON_PRESETS:
        model = AutoModelForTextToSpeech.from_pretrained(set_dir, **kw)
        sync(device)
        return model, None
    # The kernels are chosen at load, as a user would: applied before the graphs are captured and warmed up.
    # compile off: auto turns it on for sm_90 since session 21 (~24 s at load); these profiles are Triton alone
    config = TTSOptimizationConfig(kernel_backend="triton", compile="disabled")
    try:
        model = AutoModelForTextToSpeech.from_pretrained(set_dir, optimization_config=config, **kw)
        manifest = model.optimization_result.to_dict()
    except Exception as err:
        if strict:
            raise
        model = AutoModelForTextToSpeech.from_pretrained(set_dir, **kw)
        manifest = {"error": repr(err), "fallback": "full (graphs only)"}
    sync(device)
    return model, manifest


def first_audio(model, voice, text: str, device: str, window: int | None = None) -> dict:
    """Ms from calling `model.stream` to its first AudioChunk, and that chunk's audio seconds.

    window: `stream_chunk_tokens` (None: one chunk per sentence, the reference path)."""
    sync(device)
    t0 = time.perf_counter()
    chunks = model.stream(
        text,
        voice=voice,
        seed=SEED,
        preset=PRESET,
        force_n_tokens=n_tokens(text),
        stream_chunk_tokens=window,
        **FAST,
    )
    chunk = next(iter(chunks))
    t_first = time.perf_counter() - t0
    chunks.close()
    return {"first_audio_ms": t_first * 1e3, "chunk_audio_s": len(chunk.audio) / chunk.sample_rate}


def first_chunk_stages(model, voice, text: str, device: str, window: int) -> dict:
    """Where the first chunk's time goes: one extra request (not among the timed ones) with a device
    sync around each stage of the streamed chain. Ms from the request to the first SoVITS encoder call
    (`t2s_and_text_ms`: text frontend, reference lookup, T2S prefill and the first window's tokens), split
    into the text frontend (`text_ms`: g2p and BERT of the sentences read before the first chunk), the T2S
    prefill (`prefill_ms`: the graph decoder's row load, or the eager `encode_prompt`), the first window's
    decode steps (`first_window_ms`: from the prefill's end to the first encoder call) and the rest
    (`t2s_other_ms`: reference lookup, request assembly); then the first chunk's SoVITS encoder, CFM and
    vocoder calls (graph replays where the model has acoustic graphs), and the rest (joins, copies,
    Python). The syncs add a little: `first_audio_ms` here is not the timed figure."""
    from voicehub.models.gpt_sovits import streaming

    pipe = model.pipeline
    graphs = pipe.acoustic_graphs
    decoder = pipe.t2s_decoder
    spans: dict[str, float] = {"encoder": 0.0, "cfm": 0.0, "vocoder": 0.0, "text": 0.0, "prefill": 0.0}
    starts: list[float] = []  # acoustic stages' start times
    prefill_ends: list[float] = []

    def timed(name: str, fn):
        def wrapper(*args, **kwargs):
            sync(device)
            t = time.perf_counter()
            if name not in ("text", "prefill"):
                starts.append(t)
            out = fn(*args, **kwargs)
            sync(device)
            end = time.perf_counter()
            spans[name] += end - t
            if name == "prefill":
                prefill_ends.append(end)
            return out

        return wrapper

    # Instance attributes shadow the methods; the eager path reads streaming's module-level solve/vocode.
    owner = graphs if graphs is not None else streaming
    vocode_name = "vocode_mel" if graphs is not None else "vocode"  # what the streamed path vocodes with
    saved = {"solve": owner.solve, "vocode": getattr(owner, vocode_name)}
    pipe.sovits.decode_encp = timed("encoder", pipe.sovits.decode_encp)
    if graphs is not None:  # the streamed path encodes through the graphs (encoder_graphs.py)
        graphs.encode = timed("encoder", graphs.encode)
    owner.solve = timed("cfm", saved["solve"])
    setattr(owner, vocode_name, timed("vocoder", saved["vocode"]))
    pipe.text_features = timed("text", pipe.text_features)
    if decoder is not None:  # decode_iter loads the row through the instance attribute
        decoder._load_row = timed("prefill", decoder._load_row)
    else:  # the eager step-wise decode prefills through streaming's encode_prompt
        saved["encode_prompt"] = streaming.encode_prompt
        streaming.encode_prompt = timed("prefill", saved["encode_prompt"])
    try:
        sync(device)
        t0 = time.perf_counter()
        chunks = model.stream(text, voice=voice, seed=SEED, preset=PRESET, force_n_tokens=n_tokens(text),
                              stream_chunk_tokens=window, **FAST)  # fmt: skip
        next(iter(chunks))
        total = time.perf_counter() - t0
        chunks.close()
    finally:
        del pipe.sovits.decode_encp, pipe.text_features
        if decoder is not None:
            del decoder._load_row
        else:
            streaming.encode_prompt = saved["encode_prompt"]
        if graphs is not None:
            del graphs.solve, graphs.vocode_mel, graphs.encode
        else:
            streaming.solve, streaming.vocode = saved["solve"], saved["vocode"]
    ms = {k: v * 1e3 for k, v in spans.items()}
    to_encoder = (starts[0] - t0) * 1e3 if starts else float("nan")
    first_window = (starts[0] - prefill_ends[0]) * 1e3 if starts and prefill_ends else float("nan")
    return {
        "first_audio_ms": total * 1e3,
        "t2s_and_text_ms": to_encoder,
        "text_ms": ms["text"],
        "prefill_ms": ms["prefill"],
        "first_window_ms": first_window,
        "t2s_other_ms": to_encoder - ms["text"] - ms["prefill"] - first_window,
        "encoder_ms": ms["encoder"],
        "cfm_ms": ms["cfm"],
        "vocoder_ms": ms["vocoder"],
        "other_ms": total * 1e3 - to_encoder - ms["encoder"] - ms["cfm"] - ms["vocoder"],
        "acoustic_graphs": graphs is not None,
    }


def memory(device: str) -> dict:
    if not device.startswith("cuda"):
        return {}
    return {
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
    }
