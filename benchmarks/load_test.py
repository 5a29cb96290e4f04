"""Load test: N concurrent streaming clients against a VoiceHub server on loopback.

Each client posts to /tts (raw PCM) in a loop until it has made `--requests` requests, and times
the first audio byte and the whole stream. Reports first-audio p50/p95/p99, audio seconds made
per wall second, requests per second and errors, as JSON.

    python benchmarks/load_test.py --url http://127.0.0.1:8000 --clients 16 --requests 4
    python benchmarks/load_test.py --self-serve --clients 8     # a sine-model server, no weights

Bounded (at most 256 clients, 10,000 requests, `--max-seconds` of wall time) and loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import numpy as np

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_CLIENTS = 256
MAX_REQUESTS = 10_000
TEXTS = (
    "Hello there.",
    "The quick brown fox jumps over the lazy dog, twice, before breakfast.",
    "Streaming speech means the first words play while the rest of the sentence is still being made. "
    "That is what this test measures.",
)


async def _client(
    http: httpx.AsyncClient, n: int, voice: str | None, deadline: float, out: list[dict[str, Any]]
) -> None:
    for i in range(n):
        if time.monotonic() > deadline:
            return
        body: dict[str, Any] = {"text": TEXTS[i % len(TEXTS)], "format": "s16le"}
        if voice:
            body["voice"] = voice
        t0 = time.perf_counter()
        first = None
        n_bytes = 0
        try:
            async with http.stream("POST", "/tts", json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    out.append({"ok": False, "status": r.status_code, "error": r.text[:200]})
                    continue
                rate = int(r.headers["x-sample-rate"])
                async for piece in r.aiter_raw():
                    if first is None:
                        first = time.perf_counter() - t0
                    n_bytes += len(piece)
        except httpx.HTTPError as exc:
            out.append({"ok": False, "status": None, "error": f"{type(exc).__name__}: {exc}"})
            continue
        total = time.perf_counter() - t0
        out.append({"ok": True, "first_audio_s": first, "total_s": total, "audio_s": n_bytes / 2 / rate})


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 1) if values else None


async def run_load(
    url: str,
    clients: int,
    requests: int,
    voice: str | None = None,
    api_key: str | None = None,
    max_seconds: float = 120.0,
) -> dict[str, Any]:
    """Run the load and return the JSON-ready summary (latencies in milliseconds)."""
    if urlparse(url).hostname not in LOOPBACK:
        raise SystemExit(f"refusing to load-test {url}: loopback addresses only")
    if not 1 <= clients <= MAX_CLIENTS or not 1 <= clients * requests <= MAX_REQUESTS:
        raise SystemExit(f"keep 1 <= clients <= {MAX_CLIENTS} and clients * requests <= {MAX_REQUESTS}")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=clients)
    results: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60.0, limits=limits) as http:
        t0 = time.perf_counter()
        deadline = time.monotonic() + max_seconds
        await asyncio.gather(*(_client(http, requests, voice, deadline, results) for _ in range(clients)))
        wall = time.perf_counter() - t0
    ok = [r for r in results if r["ok"]]
    firsts = [r["first_audio_s"] for r in ok if r["first_audio_s"] is not None]
    audio = sum(r["audio_s"] for r in ok)
    errors: dict[str, int] = {}
    for r in results:
        if not r["ok"]:
            errors[str(r["status"])] = errors.get(str(r["status"]), 0) + 1
    return {
        "clients": clients,
        "requests": len(results),
        "ok": len(ok),
        "errors": errors,
        "wall_s": round(wall, 3),
        "first_audio_ms": {"p50": _pct(firsts, 50), "p95": _pct(firsts, 95), "p99": _pct(firsts, 99)},
        "stream_ms": {
            "p50": _pct([r["total_s"] for r in ok], 50),
            "p95": _pct([r["total_s"] for r in ok], 95),
        },
        "audio_s_per_wall_s": round(audio / wall, 3) if wall else None,
        "requests_per_s": round(len(ok) / wall, 3) if wall else None,
    }


def _self_serve(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_server_helpers import running_server, sine_config  # the tests' loopback server

    from voicehub.server.fake import SineModel

    with tempfile.TemporaryDirectory() as data:
        config = sine_config(
            Path(data), limits={"max_queue": max(32, args.clients), "max_active_streams": args.active}
        )
        with running_server(config, SineModel(delay_s=args.delay)) as (url, _):
            return asyncio.run(run_load(url, args.clients, args.requests, "sine", None, args.max_seconds))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=4, help="requests per client")
    parser.add_argument("--voice", default=None)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--output", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--self-serve", action="store_true", help="start a sine-model server on loopback")
    parser.add_argument("--delay", type=float, default=0.005, help="self-serve: seconds per sine chunk")
    parser.add_argument("--active", type=int, default=4, help="self-serve: streams the worker interleaves")
    args = parser.parse_args()
    if args.self_serve:
        result = _self_serve(args)
    else:
        result = asyncio.run(
            run_load(args.url, args.clients, args.requests, args.voice, args.api_key, args.max_seconds)
        )
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
