"""Server configuration: one TOML file (models, voices, aliases, limits, keys), read once at start.

Engine-lifetime settings only; per-request parameters live in `schemas.py`. Every value is checked
here, and an unknown key raises naming the valid ones, so a typo never passes silently.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from voicehub.voices import check_name

API_KEY_ENV = "VOICEHUB_API_KEY"
DEFAULT_MODEL = "en_US-joe-medium"
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


class ConfigError(ValueError):
    """The server configuration is invalid; the message names the key and the fix."""


@dataclass(frozen=True)
class Limits:
    max_text_chars: int = 5000  # per request; the WebSocket limit is per session
    max_body_bytes: int = 12_000_000  # any request body, uploads included
    max_upload_bytes: int = 10_000_000  # one reference audio file
    min_reference_s: float = 3.0
    max_reference_s: float = 10.0
    max_queue: int = 32  # requests waiting for the worker; one more gets 503
    max_active_streams: int = 1  # streams the worker interleaves chunk by chunk (1: one at a time)
    max_batch_streams: int = 64  # GPT-SoVITS streams one batching engine decodes at once (its T2S rows)
    request_timeout_s: float = 120.0
    ws_idle_timeout_s: float = 300.0
    memory_budget_mb: float = 0.0  # loaded models' total; 0: no budget (never unload)
    drain_timeout_s: float = 30.0  # SIGTERM waits this long for in-flight streams

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"limits.{f.name} must be a non-negative number, got {value!r}")
        if min(self.max_active_streams, self.max_queue, self.max_batch_streams) < 1:
            raise ConfigError(
                "limits.max_active_streams, limits.max_queue and limits.max_batch_streams must be at least 1"
            )


@dataclass(frozen=True)
class ModelSpec:
    """A model the server may load. `factory` ('module:callable') builds it instead of the hub."""

    name: str
    path: str | None = None
    model_type: str | None = None
    device: str | None = None  # None: the server's device
    factory: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # family load options
    memory_mb: float = 0.0  # estimate used on the CPU; on CUDA the measured allocation is used
    preload: bool = False  # the default voice's model is always preloaded


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = Path("~/.local/share/voicehub").expanduser()
    device: str = "cpu"
    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    default_voice: str = DEFAULT_MODEL
    models: dict[str, ModelSpec] = field(
        default_factory=lambda: {DEFAULT_MODEL: ModelSpec(DEFAULT_MODEL, preload=True)}
    )
    voices: dict[str, dict[str, Any]] = field(default_factory=dict)  # read-only voices from the file
    model_aliases: dict[str, str] = field(default_factory=dict)  # e.g. tts-1 -> en_US-joe-medium
    voice_aliases: dict[str, str] = field(default_factory=dict)  # e.g. alloy -> en_US-joe-medium
    limits: Limits = field(default_factory=Limits)
    warmup_text: str = "Ready."
    # GPT-SoVITS jobs run on batching stream engines; False keeps one stream at a time per model
    # (`voicehub serve --no-batching`, for single-stream latency tests).
    batching: bool = True

    @property
    def is_loopback(self) -> bool:
        return self.host in LOOPBACK_HOSTS or self.host.startswith("127.")

    def check(self) -> None:
        """Cross-field checks: names resolve, aliases point at real names, a key guards a public bind."""
        if not self.models:
            raise ConfigError("no models configured; add a [models.NAME] table")
        for alias, target in self.model_aliases.items():
            if target not in self.models:
                raise ConfigError(
                    f"model alias {alias!r} points at {target!r}, not a configured model ({', '.join(self.models)})"
                )
        if not self.is_loopback and not self.api_keys:
            raise ConfigError(
                f"refusing to listen on {self.host} without an API key: pass --api-key, set {API_KEY_ENV}, "
                "or bind to 127.0.0.1"
            )
        if not isinstance(self.batching, bool):
            raise ConfigError(f"server.batching must be true or false, got {self.batching!r}")
        if any(len(k) < 8 for k in self.api_keys):
            raise ConfigError("API keys must be at least 8 characters")


def _take(table: dict[str, Any], cls: type, where: str, **extra: Any) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in [{where}]; valid keys: {', '.join(sorted(known))}")
    try:
        return cls(**table, **extra)
    except TypeError as exc:
        raise ConfigError(f"[{where}]: {exc}") from None


def _models(table: dict[str, Any]) -> dict[str, ModelSpec]:
    models = {}
    for name, spec in table.items():
        check_name(name.replace(".", "-"))  # names go into URLs and logs: keep them plain
        if not isinstance(spec, dict):
            raise ConfigError(f"[models.{name}] must be a table")
        models[name] = _take(
            {k: v for k, v in spec.items() if k != "name"}, ModelSpec, f"models.{name}", name=name
        )
        if models[name].path is None and models[name].factory is None:
            models[name] = ModelSpec(**{**models[name].__dict__, "path": name})
    return models


def load_config(path: str | Path | None = None, **overrides: Any) -> ServerConfig:
    """Read a TOML file (optional) and apply command-line overrides (None values are ignored).

    The API key also comes from the VOICEHUB_API_KEY environment variable.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).expanduser().read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {str(path)!r}: {exc}") from None
    top = {"server", "limits", "models", "voices", "aliases"}
    if set(raw) - top:
        raise ConfigError(
            f"unknown table(s) {sorted(set(raw) - top)} in the config; valid: {', '.join(sorted(top))}"
        )
    server = dict(raw.get("server", {}))
    keys = list(server.pop("api_keys", []))
    for key in (overrides.pop("api_key", None), os.environ.get(API_KEY_ENV)):
        if key:
            keys.append(key)
    server.update({k: v for k, v in overrides.items() if v is not None})
    aliases = raw.get("aliases", {})
    if set(aliases) - {"models", "voices"}:
        raise ConfigError("[aliases] holds two tables: [aliases.models] and [aliases.voices]")
    kwargs: dict[str, Any] = dict(
        api_keys=tuple(keys),
        limits=_take(raw.get("limits", {}), Limits, "limits"),
        model_aliases=dict(aliases.get("models", {})),
        voice_aliases=dict(aliases.get("voices", {})),
        voices={check_name(n): dict(v) for n, v in raw.get("voices", {}).items()},
    )
    if "models" in raw:
        kwargs["models"] = _models(raw["models"])
    for key in ("data_dir",):
        if key in server:
            server[key] = Path(server[key]).expanduser()
    for key in ("cors_origins",):
        if key in server:
            server[key] = tuple(server[key])
    config = _take(server, ServerConfig, "server", **kwargs)
    config.check()
    return config
