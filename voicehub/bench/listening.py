"""A blinded A/B listening kit: a folder with an HTML page and unlabeled audio, and a separate key.

Each pair puts the reference system (eager) against one candidate on the same item, in random
order; pairs are shuffled. The page names no system; its answers download as JSON, which
`score_answers` reads together with the key. Keep the key file away from listeners: by default
it is written beside the folder, not inside it.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from voicehub.audio.io import write_audio

CHOICES = ("A", "B", "same")

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:46em;margin:2em auto}} .pair{{border:1px solid #ccc;
padding:.8em;margin:.8em 0}} audio{{vertical-align:middle}} .text{{color:#555}}</style></head>
<body><h1>{title}</h1>
<p>For each pair, listen to A and B and choose the one that sounds better, or "no difference".
Then press <b>Download answers</b> and send the file back.</p>
{pairs}
<p><button id="download">Download answers</button> <span id="status"></span></p>
<script>
const KIT = {kit_id_json};
document.getElementById("download").onclick = () => {{
  const answers = {{}};
  document.querySelectorAll("input[type=radio]:checked").forEach(r => answers[r.name] = r.value);
  const total = document.querySelectorAll(".pair").length;
  document.getElementById("status").textContent = Object.keys(answers).length + " of " + total + " answered";
  const blob = new Blob([JSON.stringify({{kit_id: KIT, answers: answers}}, null, 2)], {{type: "application/json"}});
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob); a.download = "answers-" + KIT + ".json"; a.click();
}};
</script></body></html>
"""

_PAIR = """<div class="pair"><h3>Pair {n}</h3>{text}
<p>A <audio controls preload="none" src="{a}"></audio></p>
<p>B <audio controls preload="none" src="{b}"></audio></p>
<p><label><input type="radio" name="{pid}" value="A"> A is better</label>
<label><input type="radio" name="{pid}" value="B"> B is better</label>
<label><input type="radio" name="{pid}" value="same"> no difference</label></p></div>"""


@dataclass(frozen=True)
class ListeningKit:
    folder: Path
    page: Path
    key: Path
    n_pairs: int


def make_listening_kit(
    out_dir: str | Path,
    samples: Mapping[str, Sequence[np.ndarray]],
    sample_rate: int,
    reference: str = "eager",
    texts: Sequence[str] | None = None,
    seed: int = 0,
    key_path: str | Path | None = None,
    title: str = "Listening test",
) -> ListeningKit:
    """Write the kit. `samples[system][i]` is float [n] audio of item i; every system has the
    same items; `reference` is compared with each other system on every item."""
    if reference not in samples or len(samples) < 2:
        raise ValueError(f"samples need the reference {reference!r} and at least one other system")
    n_items = len(samples[reference])
    if n_items == 0 or any(len(v) != n_items for v in samples.values()):
        raise ValueError("every system needs the same, non-zero number of items")
    if texts is not None and len(texts) != n_items:
        raise ValueError(f"texts has {len(texts)} entries for {n_items} items")
    folder = Path(out_dir)
    key = Path(key_path) if key_path is not None else folder.parent / f"{folder.name}-key.json"
    if key.resolve().is_relative_to(folder.resolve()):
        raise ValueError(f"the key {str(key)!r} must not be inside the kit folder {str(folder)!r}")
    rng = np.random.default_rng(seed)
    kit_id = f"{rng.integers(1 << 48):012x}"
    jobs = [(item, other) for other in sorted(samples) if other != reference for item in range(n_items)]
    order = rng.permutation(len(jobs))
    (folder / "audio").mkdir(parents=True, exist_ok=True)
    blocks, key_pairs = [], []
    for n, j in enumerate(order, 1):
        item, other = jobs[j]
        a, b = (reference, other) if rng.random() < 0.5 else (other, reference)
        pid = f"p{n:03d}"
        for side, system in (("a", a), ("b", b)):
            write_audio(
                folder / "audio" / f"{pid}-{side}.wav",
                np.asarray(samples[system][item], np.float32),
                sample_rate,
            )
        text = f'<p class="text">{html.escape(texts[item])}</p>' if texts is not None else ""
        blocks.append(_PAIR.format(n=n, text=text, a=f"audio/{pid}-a.wav", b=f"audio/{pid}-b.wav", pid=pid))
        key_pairs.append({"pair": pid, "item": item, "A": a, "B": b})
    page = folder / "index.html"
    page.write_text(
        _PAGE.format(title=html.escape(title), pairs="\n".join(blocks), kit_id_json=json.dumps(kit_id)),
        encoding="utf-8",
    )
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text(
        json.dumps({"kit_id": kit_id, "reference": reference, "seed": seed, "pairs": key_pairs}, indent=2),
        encoding="utf-8",
    )
    return ListeningKit(folder, page, key, len(key_pairs))


def score_answers(key: Mapping[str, Any], answers: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Per candidate system: how often it was preferred, the reference was, or neither."""
    if answers.get("kit_id") != key["kit_id"]:
        raise ValueError(f"answers are for kit {answers.get('kit_id')!r}, the key is for {key['kit_id']!r}")
    ref, tally = key["reference"], {}
    for pair in key["pairs"]:
        other = pair["B"] if pair["A"] == ref else pair["A"]
        counts = tally.setdefault(
            other, {"preferred": 0, "reference_preferred": 0, "same": 0, "unanswered": 0}
        )
        choice = answers["answers"].get(pair["pair"])
        if choice is None:
            counts["unanswered"] += 1
        elif choice not in CHOICES:
            raise ValueError(f"pair {pair['pair']}: unknown choice {choice!r}; valid: {', '.join(CHOICES)}")
        elif choice == "same":
            counts["same"] += 1
        else:
            counts["reference_preferred" if pair[choice] == ref else "preferred"] += 1
    return tally
