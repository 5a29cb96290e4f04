"""What a never-seen length costs each kind of operation in the CFM's DiT, by layout and backend (issue 4).

`conv_plan_probe.py` found the DiT's first call at a new length costs 210-370 ms of host time with cuDNN
(its warm call ~15 ms), while it holds only six convolutions (four depthwise k=7 in the text embedding,
two grouped k=31 in the position embedding) and 22 attentions. The model feeds its convolutions a
transposed view ([B, N, D] -> [B, D, N], channels last in memory). This probe times, in fp16 at batch 2
(the guidance rows), each convolution's first call at lengths never seen (then again), for the input as
the model passes it (`transposed`) and made contiguous first (`contiguous`), with cuDNN and with ATen's
own convolutions (cuDNN off for the call); then its GPU time replayed from a CUDA graph at one length
(the mean of 20 calls in one graph, median of 10 replays); and the attention's first calls by SDPA's
default choice and by the memory-efficient kernel alone. Prints a table, writes JSON. On the GPU machine:

    python benchmarks/dit_conv_probe.py --out $OUT/dit_conv_probe.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import platform
import sys

import torch
import torch.nn.functional as F
from bench_meta import capture, event_ms, host_ms, tree_commit
from torch.nn.attention import SDPBackend, sdpa_kernel

BATCH = 2
CONVS = {  # name: (channels, kernel, groups) as the v3 DiT's
    "text_dwconv_k7": (512, 7, 512),
    "pos_conv_k31_g16": (1024, 31, 16),
}
NEW_LENGTHS = 3
WARM_LENGTH = 562  # frames of a 3 s chunk after a 5 s reference's prompt, roughly
GRAPH_CALLS = 20


def backend(name: str):
    return torch.backends.cudnn.flags(enabled=False) if name == "aten" else contextlib.nullcontext()


def conv_input(channels: int, n: int, layout: str) -> torch.Tensor:
    if layout == "transposed":
        return torch.randn(BATCH, n, channels, device="cuda", dtype=torch.float16).transpose(1, 2)
    return torch.randn(BATCH, channels, n, device="cuda", dtype=torch.float16)


def graph_ms(fn) -> float:
    """GPU ms of one call, from a graph of GRAPH_CALLS calls (median of 10 replays)."""

    def calls() -> None:
        for _ in range(GRAPH_CALLS):
            fn()

    return event_ms(capture(calls).replay, 1, 10) / GRAPH_CALLS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.manual_seed(0)
    rows, n = [], 301
    with torch.inference_mode():
        torch.nn.functional.conv1d(
            torch.ones(1, 8, 16, device="cuda"), torch.ones(8, 1, 3, device="cuda"), groups=8
        )
        for name, (channels, kernel, groups) in CONVS.items():
            w = torch.randn(channels, channels // groups, kernel, device="cuda", dtype=torch.float16) * 0.05
            b = torch.randn(channels, device="cuda", dtype=torch.float16)
            ref = None
            for layout in ("transposed", "contiguous"):
                for be in ("cudnn", "aten"):
                    firsts, agains = [], []
                    with backend(be):
                        for _ in range(NEW_LENGTHS):
                            x = conv_input(channels, n, layout)
                            call = functools.partial(F.conv1d, x, w, b, padding=kernel // 2, groups=groups)
                            firsts.append(host_ms(call))
                            agains.append(host_ms(call))
                            n += 7
                        x = conv_input(channels, WARM_LENGTH, layout)
                        x.copy_(torch.linspace(-2, 2, x.numel(), device="cuda").view_as(x))
                        out = F.conv1d(x, w, b, padding=kernel // 2, groups=groups).float()
                        gpu = graph_ms(
                            functools.partial(F.conv1d, x, w, b, padding=kernel // 2, groups=groups)
                        )
                    ref = out if ref is None else ref
                    rel = float((out - ref).norm() / ref.norm())
                    rows.append(dict(op=name, layout=layout, backend=be, first_ms=firsts, again_ms=agains,
                                     graph_gpu_us=gpu * 1e3, rel_l2_vs_first=rel))  # fmt: skip
                    print(f"{name:17} {layout:10} {be:5} first {' '.join(f'{t:6.1f}' for t in firsts)} ms  "
                          f"again {min(agains):5.2f} ms  graph {gpu * 1e3:7.1f} us  rel {rel:.1e}", flush=True)  # fmt: skip
        heads, dim_head = 16, 64
        for choice in ("default", "efficient"):
            firsts = []
            ctx = (
                sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION])
                if choice == "efficient"
                else contextlib.nullcontext()
            )
            with ctx:
                for _ in range(NEW_LENGTHS):
                    q, k, v = (
                        torch.randn(BATCH, heads, n, dim_head, device="cuda", dtype=torch.float16)
                        for _ in range(3)
                    )
                    bias = torch.zeros(BATCH, 1, 1, n, device="cuda", dtype=torch.float16).expand(
                        BATCH, heads, n, n
                    )
                    firsts.append(
                        host_ms(functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask=bias))
                    )
                    n += 7
                q, k, v = (
                    torch.randn(BATCH, heads, WARM_LENGTH, dim_head, device="cuda", dtype=torch.float16)
                    for _ in range(3)
                )
                bias = torch.zeros(BATCH, 1, 1, WARM_LENGTH, device="cuda", dtype=torch.float16).expand(
                    BATCH, heads, WARM_LENGTH, WARM_LENGTH
                )
                gpu = graph_ms(functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask=bias))
            rows.append(
                dict(
                    op="sdpa_float_bias",
                    layout="bhnd",
                    backend=choice,
                    first_ms=firsts,
                    graph_gpu_us=gpu * 1e3,
                )
            )
            print(f"{'sdpa_float_bias':17} {'bhnd':10} {choice:9} first {' '.join(f'{t:6.1f}' for t in firsts)} ms  "
                  f"graph {gpu * 1e3:7.1f} us", flush=True)  # fmt: skip
    meta = dict(
        benchmark="dit_conv_probe", machine=torch.cuda.get_device_name(), platform=platform.platform(),
        versions=dict(python=platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda,
                      cudnn=torch.backends.cudnn.version(), voicehub_commit=tree_commit() or None),
        precision="float16", sizes=f"batch {BATCH}; convolutions {CONVS} (channels, kernel, groups); SDPA 16 heads x 64, "
        f"float bias; new lengths from 301 in steps of 7; graph length {WARM_LENGTH}",
        warmups="one conv1d of another shape first (cuDNN's libraries); the graph: one eager call before capture",
        repetitions=f"new lengths: {NEW_LENGTHS} per variant, first + again; graph: {GRAPH_CALLS} calls a graph, median of 10 replays",
        command=" ".join(["python", *sys.argv]),
    )  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
