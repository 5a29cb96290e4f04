"""Where a stream's numbers stop being the same: one level run twice on one engine, and its first streams
run alone, the KV cache of every checked stream kept after each run and compared bit for bit.

A row's cache holds, for every layer, the K and V of each position it has seen: the prompt's (the prefill)
then one slot a decode step. So the first slot at which two runs' caches of a stream differ says whether the
prefill or a step differs first, at which step, and in which layer (the lowest layer differing there). The
tokens are compared too (a token that differs changes every later slot). The workload is
t2s_batch_bench's (its requests, buckets, kernels).

    python benchmarks/t2s_repeat_probe.py --level 64 --out benchmarks/results/t2s_repeat_probe_h100.json
    python benchmarks/t2s_repeat_probe.py --device cpu --size tiny --dtype float32 --level 3 --n-tokens 20
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from t2s_batch_bench import KV_BUCKETS, run_level, step_kernels, stream_request
from t2s_decode_bench import first_divergence, meta, timed

from voicehub.models.gpt_sovits.t2s.checkpoint import load_t2s
from voicehub.models.gpt_sovits.t2s.make_checkpoint import make_t2s_checkpoint
from voicehub.models.gpt_sovits.t2s.scheduler import T2SRowEngine
from voicehub.models.gpt_sovits.t2s.static import StaticDecodeConfig, T2SRequest


def kept_run(engine: T2SRowEngine, requests: list[T2SRequest], checked: int) -> tuple[list, list]:
    """run_level, then each of the first `checked` requests' tokens and cache (k, v [L, H, S, Dh], cloned
    on the device) from the row it was admitted to (released rows keep their cache until reused)."""
    rows: dict[int, int] = {}
    admit = engine.admit_rows

    def recording(row_ids, reqs):
        for row, req in zip(row_ids, reqs):
            rows[id(req)] = row
        return admit(row_ids, reqs)

    engine.admit_rows = recording
    try:
        tokens = run_level(engine, requests, poll_lag=1)["_tokens"]
    finally:
        del engine.admit_rows  # back to the class's method
    caches = []
    for req in requests[:checked]:
        row = rows[id(req)]
        caches.append((engine.cache.k[:, row].clone(), engine.cache.v[:, row].clone()))
    return tokens[:checked], caches


def first_difference(a: tuple, b: tuple, n_slots: int, n_prompt: int) -> dict:
    """The first slot below n_slots where the two caches differ, the lowest layer differing there and the
    largest difference at that slot; {"equal": True} where they are bitwise equal."""
    differs = [(x[..., :n_slots, :] != y[..., :n_slots, :]) for x, y in zip(a, b)]  # [L, H, S, Dh] each
    by_slot = (differs[0] | differs[1]).any(dim=3).any(dim=1)  # [L, S]
    slots = by_slot.any(dim=0).nonzero()
    if slots.numel() == 0:
        return {"equal": True}
    slot = int(slots[0])
    layer = int(by_slot[:, slot].nonzero()[0])
    gap = max(float((x[:, :, slot].float() - y[:, :, slot].float()).abs().max()) for x, y in zip(a, b))
    step = slot - n_prompt  # the decode step that wrote it (negative: the prompt's prefill)
    return {
        "equal": False,
        "slot": slot,
        "step": step,
        "in_prefill": step < 0,
        "layer": layer,
        "max_abs_diff": gap,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="full")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--level", type=int, default=64)
    p.add_argument("--n-tokens", type=int, default=500)
    p.add_argument("--checked", type=int, default=4, help="streams compared (the first ones: 0 and 1 greedy)")
    p.add_argument("--kernels", default="triton", choices=["native", "triton"])
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    args.reps = 2  # the level's runs (batch_a, batch_b), for meta
    t_start = time.perf_counter()
    ckpt, make_s = timed(lambda: make_t2s_checkpoint(f"/tmp/t2s_{args.size}.ckpt", args.size, seed=0))
    (model, config), load_s = timed(lambda: load_t2s(ckpt, device=args.device, dtype=args.dtype))
    on_gpu = torch.device(args.device).type == "cuda"
    cfg = StaticDecodeConfig(
        max_batch=args.level, max_seq_len=max(KV_BUCKETS), kv_buckets=KV_BUCKETS,
        batch_buckets=tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= args.level) or (1,),
    )  # fmt: skip
    engine = T2SRowEngine(model, cfg, preset="full" if on_gpu else "off")
    kernels = step_kernels(args.kernels, "mma", args.device)
    if kernels is not None:
        engine.set_step_kernels(kernels)
    requests = [stream_request(config, i, args.n_tokens) for i in range(args.level)]
    checked = min(args.checked, args.level)
    runs = {"batch_a": kept_run(engine, requests, checked), "batch_b": kept_run(engine, requests, checked)}
    alone = [kept_run(engine, [r], 1) for r in requests[:checked]]  # ([tokens], [cache]) each
    runs["alone"] = ([tokens[0] for tokens, _ in alone], [caches[0] for _, caches in alone])
    streams = []
    for i, req in enumerate(requests[:checked]):
        n_prompt = req.phone_ids.shape[0] + req.prompt_tokens.shape[0]
        # the slots written: the prompt's, then one a token but the last
        n_slots = n_prompt + int(runs["batch_a"][0][i].numel()) - 1
        row = {"stream": i, "greedy": i < 2, "n_prompt": n_prompt}
        for name in ("batch_b", "alone"):
            tokens, caches = runs[name]
            row[name] = {"tokens_first_divergence": first_divergence(runs["batch_a"][0][i], tokens[i]),
                         **first_difference(runs["batch_a"][1][i], caches[i], n_slots, n_prompt)}  # fmt: skip
        print(json.dumps(row), flush=True)
        streams.append(row)
    info = meta(args, make_s, load_s, time.perf_counter() - t_start)
    info["benchmark"] = "t2s_repeat_probe"
    info["sizes"] |= {"batch": args.level, "checked": checked}
    info["warmups"] = "none: capture at load, then batch_a, batch_b and the alone runs in that order"
    info["kernels"] = args.kernels
    info["what"] = "run batch_a against batch_b (the same level again) and against each stream alone, bitwise"
    result = {"streams": streams, "meta": info}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
