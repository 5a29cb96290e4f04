"""`voicehub make-checkpoint gpt-sovits-v3 ...`: parser and handler, wired in by voicehub/cli.py.

from voicehub.models.gpt_sovits import cli_commands as gpt_sovits_commands
gpt_sovits_commands.add_parsers(sub)                       # in _parser()
COMMANDS["make-checkpoint"] = gpt_sovits_commands.run
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from voicehub.models.gpt_sovits.sizes import SIZES

MODEL_TYPES = ("gpt-sovits-v3",)


def add_parsers(sub: Any) -> None:
    """Add the `make-checkpoint` subcommand to an argparse subparsers object."""
    p = sub.add_parser(
        "make-checkpoint",
        help="write a random-weight model file set in the official layouts (testing and benchmarking)",
        description=(
            "Write a complete GPT-SoVITS v3 file set from random weights: GPT .ckpt, SoVITS .pth, a SoVITS "
            "LoRA, and pretrained_models/ (HuBERT, BERT, BigVGAN, s2Gv3.pth). It speaks no words: it is for "
            "tests (tiny) and GPU benchmarks (full). A forced token count is a request parameter "
            "(force_n_tokens), not a file property."
        ),
    )
    p.add_argument("model_type", choices=MODEL_TYPES, help="the family whose files to write")
    p.add_argument("--size", choices=SIZES, default="tiny", help="tiny (CPU tests) or full (real sizes)")
    p.add_argument("--out", type=Path, required=True, help="folder to write the set into")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    p.add_argument("--lora-rank", type=int, default=8, help="rank of the SoVITS LoRA file (default 8)")
    p.add_argument(
        "--margin-tokens",
        type=int,
        default=200,
        help="greedy tokens over which the T2S logit margins are reported (0 skips; default 200)",
    )


def run(args: argparse.Namespace) -> int:
    """Write the set and print what was written and the T2S margins; returns the exit status."""
    from voicehub.models.gpt_sovits.make_checkpoint import make_checkpoint_set, margins_report

    made = make_checkpoint_set(
        args.out, size=args.size, seed=args.seed, lora_rank=args.lora_rank, margin_tokens=args.margin_tokens
    )
    print(f"wrote a {args.size} GPT-SoVITS v3 set (random weights, seed {args.seed}) to {made.out}")
    for label, path in (
        ("GPT", made.gpt),
        ("SoVITS", made.sovits),
        ("SoVITS LoRA", made.sovits_lora),
        ("pretrained", made.pretrained),
    ):
        print(f"  {label:<12} {path}")
    print(margins_report(made.margins))
    print(
        f"load it with AutoModelForTextToSpeech.from_pretrained({str(made.out)!r}, model_type='gpt-sovits-v3')"
    )
    sys.stdout.flush()
    return 0
