"""A blinded A/B listening kit: a folder with an HTML page and unlabeled audio, and a separate key.

Each pair puts the reference system (eager) against one candidate on the same item, in random
order; pairs are shuffled. The page names no system; its answers download as JSON, which
`score_answers` reads together with the key. Keep the key file away from listeners: by default
it is written beside the folder, not inside it. `read_bench_runs` gathers the audio that
`voicehub bench --save-audio` saved, one item per bench run.
"""

from __future__ import annotations

import hashlib
import html
import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from voicehub.audio.io import write_audio
from voicehub.audio.load import read_audio

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


def default_key_path(out_dir: str | Path) -> Path:
    """`<kit>-key.json` beside the kit folder, where the page cannot link to it."""
    folder = Path(out_dir)
    return folder.parent / f"{folder.name}-key.json"


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
    same items; `reference` is compared with each other system on every item.

    All or nothing: the folder and the key are written under temporary names beside their
    places and renamed at the end, so a failure leaves neither behind. Neither may exist yet
    (a key overwritten would no longer decode the answers of a kit already handed out).
    """
    if reference not in samples or len(samples) < 2:
        raise ValueError(f"samples need the reference {reference!r} and at least one other system")
    n_items = len(samples[reference])
    if n_items == 0 or any(len(v) != n_items for v in samples.values()):
        raise ValueError("every system needs the same, non-zero number of items")
    if texts is not None and len(texts) != n_items:
        raise ValueError(f"texts has {len(texts)} entries for {n_items} items")
    folder = Path(out_dir)
    key = Path(key_path) if key_path is not None else default_key_path(folder)
    if key.resolve().is_relative_to(folder.resolve()):
        raise ValueError(f"the key {str(key)!r} must not be inside the kit folder {str(folder)!r}")
    for path, what in ((folder, "kit folder"), (key, "key file")):
        if path.exists():
            raise ValueError(f"the {what} {str(path)!r} exists already; choose another path or remove it")
    folder.parent.mkdir(parents=True, exist_ok=True)
    key.parent.mkdir(parents=True, exist_ok=True)
    tmp_folder = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".partial", dir=folder.parent))
    fd, tmp_name = tempfile.mkstemp(prefix=f".{key.name}.", suffix=".partial", dir=key.parent)
    os.close(fd)
    tmp_key = Path(tmp_name)
    try:
        n_pairs = _write_kit(tmp_folder, tmp_key, samples, sample_rate, reference, texts, seed, title)
        tmp_folder.rename(folder)
        try:
            os.replace(tmp_key, key)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
    except BaseException:
        shutil.rmtree(tmp_folder, ignore_errors=True)
        tmp_key.unlink(missing_ok=True)
        raise
    return ListeningKit(folder, folder / "index.html", key, n_pairs)


def _write_kit(
    folder: Path,
    key: Path,
    samples: Mapping[str, Sequence[np.ndarray]],
    sample_rate: int,
    reference: str,
    texts: Sequence[str] | None,
    seed: int,
    title: str,
) -> int:
    rng = np.random.default_rng(seed)
    # The id also hashes the audio, so two kits made with one seed from other runs differ.
    digest = hashlib.sha256(rng.bytes(8))
    n_items = len(samples[reference])
    jobs = [(item, other) for other in sorted(samples) if other != reference for item in range(n_items)]
    order = rng.permutation(len(jobs))
    (folder / "audio").mkdir()
    blocks, key_pairs = [], []
    for n, j in enumerate(order, 1):
        item, other = jobs[j]
        a, b = (reference, other) if rng.random() < 0.5 else (other, reference)
        pid = f"p{n:03d}"
        for side, system in (("a", a), ("b", b)):
            audio = np.asarray(samples[system][item], np.float32)
            digest.update(audio.tobytes())
            write_audio(folder / "audio" / f"{pid}-{side}.wav", audio, sample_rate)
        text = f'<p class="text">{html.escape(texts[item])}</p>' if texts is not None else ""
        blocks.append(_PAIR.format(n=n, text=text, a=f"audio/{pid}-a.wav", b=f"audio/{pid}-b.wav", pid=pid))
        key_pairs.append({"pair": pid, "item": item, "A": a, "B": b})
    kit_id = digest.hexdigest()[:12]
    (folder / "index.html").write_text(
        _PAGE.format(title=html.escape(title), pairs="\n".join(blocks), kit_id_json=json.dumps(kit_id)),
        encoding="utf-8",
    )
    key.write_text(
        json.dumps({"kit_id": kit_id, "reference": reference, "seed": seed, "pairs": key_pairs}, indent=2),
        encoding="utf-8",
    )
    return len(key_pairs)


def read_bench_runs(
    bench_dirs: Sequence[str | Path], profiles: Sequence[str] | None = None, reference: str = "eager"
) -> tuple[dict[str, list[np.ndarray]], int, list[str]]:
    """The audio that `voicehub bench --save-audio` saved: (samples[profile][run], sample rate,
    the text of each run). Each folder holds bench.json and audio/<profile>.wav; each run is one
    item. `profiles` defaults to every profile the first run measured; every run must have them."""
    if not bench_dirs:
        raise ValueError("give at least one bench folder")
    samples: dict[str, list[np.ndarray]] = {}
    texts, rate = [], None
    for d in map(Path, bench_dirs):
        files, text = _saved_audio(d)
        if profiles is None:
            profiles = [reference] + sorted(n for n in files if n != reference)
        wanted = [reference] + [p for p in profiles if p != reference]
        missing = [p for p in wanted if p not in files]
        if missing:
            raise ValueError(
                f"{str(d)!r} has no saved audio for {', '.join(missing)} (it has {', '.join(sorted(files))}); "
                "choose profiles with --profiles"
            )
        if len(wanted) < 2:
            raise ValueError(f"{str(d)!r}: a listening test needs {reference} and at least one other profile")
        for name in wanted:
            audio, rate_n = read_audio(d / "audio" / files[name])
            if rate is not None and rate_n != rate:
                raise ValueError(
                    f"{str(d / 'audio' / files[name])!r} is at {rate_n} Hz, the others at {rate} Hz"
                )
            rate = rate_n
            samples.setdefault(name, []).append(audio)
        texts.append(text)
    assert rate is not None
    return samples, rate, texts


def _saved_audio(folder: Path) -> tuple[dict[str, str], str]:
    """{profile: audio file name} of the measured profiles in folder/bench.json, and the text."""
    if not folder.is_dir():
        raise ValueError(f"bench folder {str(folder)!r} does not exist")
    record = read_json(folder / "bench.json", "bench record (the --out folder of `voicehub bench`)")
    try:
        files = {
            r["name"]: r["audio_file"]
            for r in record["profiles"]
            if r.get("status") == "measured" and r.get("audio_file")
        }
        text = str(record["settings"]["text"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{str(folder / 'bench.json')!r} is not a bench record: no {exc}") from exc
    if not files:
        raise ValueError(f"{str(folder)!r} has no saved audio; run `voicehub bench` with --save-audio")
    return files, text


def read_json(path: str | Path, what: str) -> Any:
    """Parse a JSON file; a missing or unreadable one raises ValueError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{what} {str(path)!r} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{what} {str(path)!r} is not valid JSON: {exc}") from exc


def score_answers(key: Mapping[str, Any], answers: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Per candidate system: how often it was preferred, the reference was, or neither."""
    if not isinstance(answers, Mapping) or not isinstance(answers.get("answers"), Mapping):
        raise ValueError("answers must be the JSON the kit's page downloads: {kit_id, answers}")
    if answers.get("kit_id") != key["kit_id"]:
        raise ValueError(f"answers are for kit {answers.get('kit_id')!r}, the key is for {key['kit_id']!r}")
    unknown = set(answers["answers"]) - {p["pair"] for p in key["pairs"]}
    if unknown:
        raise ValueError(f"answers name pairs the key lacks: {', '.join(sorted(unknown))}")
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


def add_tallies(tallies: Sequence[Mapping[str, Mapping[str, int]]]) -> dict[str, dict[str, int]]:
    """Sum `score_answers` results, e.g. of several listeners."""
    total: dict[str, dict[str, int]] = {}
    for tally in tallies:
        for system, counts in tally.items():
            into = total.setdefault(system, dict.fromkeys(counts, 0))
            for name, n in counts.items():
                into[name] += n
    return dict(sorted(total.items()))


def sign_test_p(n_preferred: int, n_reference_preferred: int) -> float | None:
    """Two-sided exact sign test that neither side is preferred (ties left out); None without votes."""
    n = n_preferred + n_reference_preferred
    if n == 0:
        return None
    tail = sum(math.comb(n, k) for k in range(min(n_preferred, n_reference_preferred) + 1))
    return min(1.0, 2 * tail / 2**n)
