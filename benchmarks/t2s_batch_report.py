"""t2s_batch_bench's reading of a level's rounds (where the wall time goes) and its printed tables."""

from __future__ import annotations


def phases(rounds: list[tuple], n_streams: int) -> dict[str, list[int]]:
    """Round indices per phase: steady = rounds that stepped with every stream live and none waiting before
    and after; admission before the first steady round, tail after the last (all three when none is steady:
    everything is admission)."""
    steady = [
        i for i in range(1, len(rounds))
        if rounds[i - 1][2:4] == (n_streams, 0) and rounds[i][2] == n_streams and rounds[i][1] > rounds[i - 1][1]
    ]  # fmt: skip
    lo, hi = (steady[0], steady[-1]) if steady else (len(rounds), len(rounds))
    return {"admission": list(range(1, lo)), "steady": steady, "tail": list(range(hi + 1, len(rounds)))}


def span(rounds: list[tuple], idx: list[int], col: int) -> float:
    """Sum over rounds idx of the change of column col (0 time, 1 steps, 4 syncs)."""
    return sum(rounds[i][col] - rounds[i - 1][col] for i in idx)


def breakdown(run: dict, sync_run: dict | None, replay: float, n_replayed: int) -> dict:
    rounds, n = run["_rounds"], run["n_streams"]
    parts = phases(rounds, n)
    out: dict = {"admit_s": run["first_token_s"]["max"], "n_rounds": len(rounds) - 1}
    for name in ("admission", "tail"):
        out[name] = {
            "s": span(rounds, parts[name], 0),
            "steps": span(rounds, parts[name], 1),
            "rounds": len(parts[name]),
        }
    steady_s, steady_steps = span(rounds, parts["steady"], 0), span(rounds, parts["steady"], 1)
    out["steady"] = {"s": steady_s, "steps": steady_steps, "rounds": len(parts["steady"])}
    replay_us = replay / n_replayed * 1e6
    out["replay"] = {
        "s": replay,
        "steps": n_replayed,
        "us_per_step": replay_us,
        "tokens_per_s": n * n_replayed / replay,
    }
    if steady_steps:
        us = steady_s / steady_steps * 1e6
        out["steady"] |= {"us_per_step": us, "tokens_per_s": n * steady_steps / steady_s}
        out["steady_over_replay"] = us / replay_us
    out["wall_over_replay"] = (
        run["wall_s"] / (replay * run["n_steps"] / n_replayed) if run["n_steps"] else None
    )
    out["host_reads_per_step"] = run["_reads"] / max(run["n_steps"], 1)
    if sync_run is not None:
        r, p = sync_run["_rounds"], phases(sync_run["_rounds"], n)
        out["syncs"] = {name: span(r, p[name], 4) for name in p} | {"total": r[-1][4]}
        steps = span(r, p["steady"], 1)
        out["syncs"]["steady_per_step"] = out["syncs"]["steady"] / steps if steps else None
    return out


def _num(x, fmt: str) -> str:
    return format(x, fmt) if x is not None else "-"


def print_report(rows: list[dict], capture_s: float, n_graphs: int) -> None:
    """The levels' throughput and identity, their breakdown, per-run admissions and collections, and the
    timelines where traced."""
    print(
        f"{'streams':>7} {'wall_s':>8} {'tok/s':>9} {'tok/s/stream':>12} {'ttft_p50':>8} {'ttft_p95':>8}  identity"
    )
    for r in rows:
        ok = all(x.get("passes_margin_rule", x.get("identical")) for x in r["identity"])
        alone = all(x["against_alone_identical"] for x in r["identity"])
        print(
            f"{r['n_streams']:7d} {r['wall_s']:8.3f} {r['tokens_per_s']:9.0f} {r['per_stream_tokens_per_s']:12.0f}"
            f" {r['first_token_s']['p50']:8.3f} {r['first_token_s']['p95']:8.3f}  {'ok' if ok else 'DIVERGED'}"
            f"{'' if alone else ', NOT THE SAME ALONE'}"
        )
        for i, x in enumerate(r["identity"]):
            if not (x.get("identical") and x["against_alone_identical"]):
                print(f"        stream {i}: {x}")
    print(
        f"\n{'streams':>7} {'admit_s':>8} {'adm_phase':>9} {'steady_us':>9} {'steady_tok/s':>12} {'tail_s':>7}"
        f" {'replay_us':>9} {'steady/replay':>13} {'wall/replay':>11} {'syncs/step':>10} {'reads/step':>10}"
    )
    for r in rows:
        b = r["breakdown"]
        steady, syncs = b["steady"], b.get("syncs", {})
        print(
            f"{r['n_streams']:7d} {b['admit_s']:8.3f} {b['admission']['s']:9.3f} {_num(steady.get('us_per_step'), '9.0f')}"
            f" {_num(steady.get('tokens_per_s'), '12.0f')} {b['tail']['s']:7.3f} {b['replay']['us_per_step']:9.0f}"
            f" {_num(b.get('steady_over_replay'), '13.3f')} {_num(b['wall_over_replay'], '11.3f')}"
            f" {_num(syncs.get('steady_per_step'), '10.3f')} {b['host_reads_per_step']:10.3f}"
        )
    for r in rows:
        gcs = " ".join(f"{g['n']}/{g['gen2']}/{g['s'] * 1e3:.0f}ms" for g in r["gc_all"])
        admits = " ".join(f"{a:.3f}" for a in r["admit_all_s"])
        print(f"{r['n_streams']:7d} admit_s per run: {admits}; gc (collections/full/time) per run: {gcs}")
        if r.get("first_pumps_all"):  # recorded from tree a1217fa
            pumps = " | ".join(" ".join(_pump(p) for p in run) for run in r["first_pumps_all"])
            print(f"{r['n_streams']:7d} first pumps per run, host/device ms after each: {pumps}")
    print("capture:", round(capture_s, 2), "s;", n_graphs, "graphs")
    for r in rows:
        if "timeline" not in r:
            continue
        t = r["timeline"]
        for part in ("loop", "replay"):
            x = t[part]
            print(f"{r['n_streams']:7d} {part:6} middle half {x['window_us'] / 1e3:.0f} ms: idle {x['idle_share']:.1%};"
                  f" gaps >= 2 us: " +
                  "; ".join(f"{g['after'][:24]} -> {g['before'][:24]} {g['count']}x {g['us']:.0f}us" for g in x["gaps"][:4]))  # fmt: skip
        if "kernels" in (x := t["replay"]):  # recorded from session 33: the replay's largest kernels
            print(f"{r['n_streams']:7d} replay kernels (count, us each, summed ms): " +
                  "; ".join(f"{k[:28]} {v['count']}x {v['us'] / v['count']:.1f}us {v['us'] / 1e3:.1f}ms"
                            for k, v in x["kernels"].items()))  # fmt: skip
        print(f"{r['n_streams']:7d} loop-only kernels: " +
              "; ".join(f"{k[:32]} {v['count']}x {v['us']:.0f}us" for k, v in t["loop_only_kernels"].items()))  # fmt: skip


def _pump(p: dict) -> str:
    """A first pump's host and device times, ms from the run's start ('-' without a device clock)."""
    device = "-" if p["device_s"] is None else f"{p['device_s'] * 1e3:.0f}"
    return f"{p['host_s'] * 1e3:.0f}/{device}"
