"""`VoiceRegistry`: named voices (model family, model files, reference audio, transcript, language,
default parameters) kept in SQLite under a data folder, shared by the server, the CLI and Python.

Writes are atomic: reference audio goes to a temporary file that is renamed into place, and only
then is the row committed in one transaction; a failure before the commit removes the new file.
A crash between the rename and the commit can leave a whole file with no row; opening the
registry sweeps such orphans and any temporary files, so a row always points at a whole file and
no file outlives its row. The audio side (decoding and checking uploads, the atomic file write,
the sweep) is voice_store.py; this module owns the rows and the order of the two.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voicehub.errors import VoiceHubError
from voicehub.voice_store import (
    MAX_REFERENCE_S,
    MIN_REFERENCE_S,
    VoiceError,
    decode_reference,
    read_audio_arg,
    store_audio,
    sweep_audio,
)

__all__ = [
    "GPT_SOVITS_FAMILY",
    "MAX_REFERENCE_S",
    "MIN_REFERENCE_S",
    "REFERENCE_FAMILIES",
    "VoiceEntry",
    "VoiceError",
    "VoiceExistsError",
    "VoiceNotFoundError",
    "VoiceRegistry",
    "canonical_family",
    "check_name",
    "decode_reference",
]

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")  # no dots or slashes: never a path
MAX_TRANSCRIPT_CHARS = 1000
DB_FILE = "voices.sqlite3"
AUDIO_DIR = "voices"
GPT_SOVITS_FAMILY = "gpt-sovits-v3"  # a voice's family is the model_type of the hub family that runs it
# Families whose voices are cloned from reference audio, and the rate each stores it at. None keeps
# the file's own rate: GPT-SoVITS resamples the reference itself to 16, 24 and 32 kHz, and
# resampling it once more here would change its features.
REFERENCE_FAMILIES: dict[str, int | None] = {GPT_SOVITS_FAMILY: None}
# Registries written before families were named by model type stored GPT-SoVITS voices as
# "gpt_sovits". The old name is translated here, at the registry's edge (writes, and the stored rows
# when a registry is opened), and nowhere else.
LEGACY_FAMILIES = {"gpt_sovits": GPT_SOVITS_FAMILY}


class VoiceNotFoundError(VoiceHubError, KeyError):
    """No voice of that name is in the registry."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it a plain sentence
        return str(self.args[0]) if self.args else ""


class VoiceExistsError(VoiceHubError, ValueError):
    """A voice of that name already exists (use update, or delete it first)."""


@dataclass(frozen=True)
class VoiceEntry:
    """One registry entry. reference_audio: absolute path of the stored mono file, or None."""

    name: str
    family: str
    model_files: dict[str, str] = field(default_factory=dict)
    reference_audio: Path | None = None
    transcript: str = ""
    language: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    sample_rate: int | None = None
    duration_s: float | None = None
    created_at: float = 0.0
    updated_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields; the audio path is left out (it is the server's business)."""
        return {
            "name": self.name,
            "family": self.family,
            "model_files": dict(self.model_files),
            "has_reference_audio": self.reference_audio is not None,
            "transcript": self.transcript,
            "language": self.language,
            "params": dict(self.params),
            "sample_rate": self.sample_rate,
            "duration_s": self.duration_s,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


def check_name(name: Any) -> str:
    """The name, if it is a safe identifier (letters, digits, '_' and '-', up to 64); else VoiceError."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise VoiceError(
            f"invalid voice name {str(name)[:80]!r}: use 1-64 letters, digits, '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def canonical_family(family: str) -> str:
    """The family's model type, translating the legacy name ('gpt_sovits' -> 'gpt-sovits-v3')."""
    return LEGACY_FAMILIES.get(family, family) if isinstance(family, str) else family


def _canonical_language(family: str, language: str) -> str:
    """GPT-SoVITS voices store the language code its text frontend reads ('en', 'all_zh', ...)."""
    if family != GPT_SOVITS_FAMILY or not isinstance(language, str) or not language.strip():
        return language
    from voicehub.text.options import parse_language

    try:
        return parse_language(language).value
    except ValueError as exc:
        raise VoiceError(str(exc)) from None


class VoiceRegistry:
    """Named voices persisted under `data_dir` (SQLite file plus a folder of reference audio).

    Safe across threads and processes: every operation opens its own connection, and writes run
    in an IMMEDIATE transaction.
    """

    def __init__(
        self,
        data_dir: str | Path,
        *,
        min_reference_s: float = MIN_REFERENCE_S,
        max_reference_s: float = MAX_REFERENCE_S,
    ):
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.audio_dir = self.data_dir / AUDIO_DIR
        self.db_path = self.data_dir / DB_FILE
        self.min_reference_s = min_reference_s
        self.max_reference_s = max_reference_s
        self.audio_dir.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS voices (name TEXT PRIMARY KEY, family TEXT NOT NULL, "
                "model_files TEXT NOT NULL, audio_file TEXT, transcript TEXT NOT NULL, language TEXT NOT NULL, "
                "params TEXT NOT NULL, sample_rate INTEGER, duration_s REAL, created_at REAL, updated_at REAL)"
            )
        with self._transaction() as db:
            for old, new in LEGACY_FAMILIES.items():
                db.execute("UPDATE voices SET family = ? WHERE family = ?", (new, old))
        self.sweep()

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.db_path, timeout=30.0, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # a committed voice survives a power cut
            yield db
        finally:
            db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _row_to_voice(self, row: tuple) -> VoiceEntry:
        name, family, files, audio_file, transcript, language, params, rate, duration, created, updated = row
        return VoiceEntry(
            name=name,
            family=family,
            model_files=json.loads(files),
            reference_audio=self.audio_dir / audio_file if audio_file else None,
            transcript=transcript,
            language=language,
            params=json.loads(params),
            sample_rate=rate,
            duration_s=duration,
            created_at=created,
            updated_at=updated,
        )

    def list(self) -> list[VoiceEntry]:
        """All voices, sorted by name."""
        with self._connect() as db:
            rows = db.execute("SELECT * FROM voices ORDER BY name").fetchall()
        return [self._row_to_voice(r) for r in rows]

    def names(self) -> list[str]:
        with self._connect() as db:
            return [r[0] for r in db.execute("SELECT name FROM voices ORDER BY name")]

    def get(self, name: str) -> VoiceEntry:
        """The voice `name`; VoiceNotFoundError lists the known names."""
        check_name(name)
        with self._connect() as db:
            row = db.execute("SELECT * FROM voices WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise VoiceNotFoundError(f"no voice named {name!r}; voices: {', '.join(self.names()) or 'none'}")
        return self._row_to_voice(row)

    def __contains__(self, name: object) -> bool:
        try:
            self.get(name)  # type: ignore[arg-type]
        except (VoiceNotFoundError, VoiceError):
            return False
        return True

    def add(
        self,
        name: str,
        family: str,
        *,
        reference_audio: bytes | str | Path | None = None,
        transcript: str = "",
        language: str = "",
        model_files: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
    ) -> VoiceEntry:
        """Add a voice; reference_audio is the file's bytes or a local path (read and copied in)."""
        check_name(name)
        return self._write(name, family, reference_audio, transcript, language, model_files, params, None)

    def update(
        self,
        name: str,
        *,
        family: str | None = None,
        reference_audio: bytes | str | Path | None = None,
        transcript: str | None = None,
        language: str | None = None,
        model_files: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
    ) -> VoiceEntry:
        """Change some fields of an existing voice; fields left None keep their values."""
        old = self.get(name)
        return self._write(
            name,
            family if family is not None else old.family,
            reference_audio,
            transcript if transcript is not None else old.transcript,
            language if language is not None else old.language,
            model_files if model_files is not None else old.model_files,
            params if params is not None else old.params,
            old,
        )

    def delete(self, name: str) -> None:
        """Remove the voice's row, then its audio file."""
        old = self.get(name)
        with self._transaction() as db:
            db.execute("DELETE FROM voices WHERE name = ?", (name,))
        if old.reference_audio is not None:
            old.reference_audio.unlink(missing_ok=True)

    def _check_fields(
        self, family: str, transcript: str, language: str, files: dict, params: dict, has_audio: bool
    ) -> None:
        if not isinstance(family, str) or not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", family):
            raise VoiceError(
                f"invalid family {family!r}: a model type such as '{GPT_SOVITS_FAMILY}' or 'vits'"
            )
        if not isinstance(transcript, str) or len(transcript) > MAX_TRANSCRIPT_CHARS:
            raise VoiceError(f"transcript must be text of at most {MAX_TRANSCRIPT_CHARS} characters")
        if not isinstance(language, str) or len(language) > 32:
            raise VoiceError("language must be a short code such as 'en', 'zh' or 'ja'")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise VoiceError("model_files must map names (e.g. 'gpt_path') to file paths, all strings")
        try:
            json.dumps(params)
        except (TypeError, ValueError):
            raise VoiceError("params must be JSON-serialisable (numbers, strings, lists, objects)") from None
        if family in REFERENCE_FAMILIES:
            if not has_audio:
                raise VoiceError(
                    f"a {family} voice needs reference audio ({self.min_reference_s:g}-{self.max_reference_s:g} s)"
                )
            if not transcript.strip() or not language.strip():
                raise VoiceError(f"a {family} voice needs the reference audio's transcript and its language")

    def _write(
        self,
        name: str,
        family: str,
        audio: bytes | str | Path | None,
        transcript: str,
        language: str,
        files: dict[str, str] | None,
        params: dict[str, Any] | None,
        old: VoiceEntry | None,
    ) -> VoiceEntry:
        files, params = dict(files or {}), dict(params or {})
        family = canonical_family(family)
        language = _canonical_language(family, language)
        has_audio = audio is not None or (old is not None and old.reference_audio is not None)
        self._check_fields(family, transcript, language, files, params, has_audio)
        new_file: Path | None = None
        rate, duration = (old.sample_rate, old.duration_s) if old else (None, None)
        if audio is not None:
            samples, rate = decode_reference(
                read_audio_arg(audio),
                sample_rate=REFERENCE_FAMILIES.get(family),
                min_s=self.min_reference_s,
                max_s=self.max_reference_s,
            )
            duration = len(samples) / rate
            new_file = store_audio(self.audio_dir, name, samples, rate)
        audio_file = (
            new_file.name if new_file else (old.reference_audio.name if old and old.reference_audio else None)
        )
        now = time.time()
        row = (
            name,
            family,
            json.dumps(files),
            audio_file,
            transcript,
            language,
            json.dumps(params),
            rate,
            duration,
        )
        try:
            with self._transaction() as db:
                if old is None:
                    if db.execute("SELECT 1 FROM voices WHERE name = ?", (name,)).fetchone():
                        raise VoiceExistsError(f"a voice named {name!r} exists; update it or delete it first")
                    db.execute("INSERT INTO voices VALUES (?,?,?,?,?,?,?,?,?,?,?)", (*row, now, now))
                else:
                    cur = db.execute(
                        "UPDATE voices SET family=?, model_files=?, audio_file=?, transcript=?, language=?, "
                        "params=?, sample_rate=?, duration_s=?, updated_at=? WHERE name=?",
                        (*row[1:], now, name),
                    )
                    if cur.rowcount != 1:
                        raise VoiceNotFoundError(f"voice {name!r} was deleted while being updated")
        except BaseException:
            if new_file is not None:
                new_file.unlink(missing_ok=True)
            raise
        if new_file is not None and old is not None and old.reference_audio is not None:
            old.reference_audio.unlink(missing_ok=True)  # the committed row no longer points at it
        return self.get(name)

    def sweep(self, min_age_s: float = 60.0) -> list[Path]:
        """Remove temporary files and audio files no row points at (left by a crash); returns them.

        Files younger than `min_age_s` are kept: they may belong to a write in progress in another process.
        """
        with self._connect() as db:
            referenced = {
                r[0] for r in db.execute("SELECT audio_file FROM voices WHERE audio_file IS NOT NULL")
            }
        return sweep_audio(self.audio_dir, referenced, min_age_s)
