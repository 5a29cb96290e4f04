"""What `model` and `voice` names in a request mean.

- a voice names a configured model (its own default speaker), a voice from the config file, or
  a registry voice; a model names a configured model or a model family ('gpt-sovits-v3', 'vits');
- OpenAI's names (`tts-1`, `alloy`, ...) mean something only through the config's alias tables;
- anything else is a 404 that lists the valid names. No unknown name falls back to a default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voicehub.server.config import ModelSpec, ServerConfig
from voicehub.server.errors import BadRequestError, NotFoundError
from voicehub.server.pool import spec_key
from voicehub.voices import GPT_SOVITS_FAMILY, VoiceEntry, VoiceNotFoundError, VoiceRegistry, canonical_family


@dataclass(frozen=True)
class Target:
    """A resolved request: the model to run, what its `voice=` gets, and the voice's default params."""

    spec: ModelSpec
    voice_name: str
    voice: Any = None
    params: dict[str, Any] = field(default_factory=dict)


def model_voice(entry: VoiceEntry) -> Any:
    """What a family's `stream(voice=...)` takes for a registry voice."""
    if entry.family == GPT_SOVITS_FAMILY:
        from voicehub.models.gpt_sovits.reference import Voice

        return Voice(entry.reference_audio, entry.transcript, entry.language)
    return entry.params.get("speaker")  # VITS multi-speaker voices name their speaker


def _config_entry(name: str, table: dict[str, Any]) -> VoiceEntry:
    audio = table.get("reference_audio")
    return VoiceEntry(
        name=name,
        family=canonical_family(str(table.get("family", ""))),
        model_files=dict(table.get("model_files", {})),
        reference_audio=Path(audio).expanduser() if audio else None,
        transcript=str(table.get("transcript", "")),
        language=str(table.get("language", "")),
        params=dict(table.get("params", {})),
    )


class Catalog:
    def __init__(self, config: ServerConfig, registry: VoiceRegistry):
        self.config, self.registry = config, registry
        self.config_voices = {n: _config_entry(n, t) for n, t in config.voices.items()}

    def families(self) -> list[str]:
        found = {s.model_type for s in self.config.models.values() if s.model_type}
        found |= {v.family for v in self.config_voices.values()}
        found |= {v.family for v in self.registry.list()}
        return sorted(found)

    def model_names(self) -> list[str]:
        return sorted(set(self.config.models) | set(self.families()))

    def voice_names(self) -> list[str]:
        return sorted(set(self.config.models) | set(self.config_voices) | set(self.registry.names()))

    def resolve(self, model: str | None, voice: str | None) -> Target:
        """The Target for a request's names; aliases are applied first. 404 lists the valid names."""
        voice = self.config.voice_aliases.get(voice, voice) if voice else self.config.default_voice
        model = self.config.model_aliases.get(model, model) if model else None
        if model is not None and model not in self.model_names():
            raise NotFoundError(
                f"unknown model {model!r}; valid models: {', '.join(self.model_names() + sorted(self.config.model_aliases))}"
            )
        if voice in self.config.models:
            spec = self.config.models[voice]
            if model is not None and model not in (voice, spec.model_type):
                raise BadRequestError(
                    f"voice {voice!r} is the model {voice!r}; pass model={voice!r} or leave it out"
                )
            return Target(spec, voice)
        entry = self.config_voices.get(voice)
        if entry is None:
            try:
                entry = self.registry.get(voice)
            except (VoiceNotFoundError, ValueError):
                valid = self.voice_names() + sorted(self.config.voice_aliases)
                raise NotFoundError(f"unknown voice {voice!r}; valid voices: {', '.join(valid)}") from None
        params = {k: v for k, v in entry.params.items() if k != "speaker"}
        return Target(self._spec_for(entry, model), voice, model_voice(entry), params)

    def _spec_for(self, entry: VoiceEntry, model: str | None) -> ModelSpec:
        if model is not None and model in self.config.models:
            spec = self.config.models[model]
            if spec.model_type != entry.family:
                raise BadRequestError(
                    f"voice {entry.name!r} is a {entry.family} voice; model {model!r} is {spec.model_type or 'another family'}"
                )
            return spec
        if model is not None and model != entry.family:
            raise BadRequestError(f"voice {entry.name!r} is a {entry.family} voice, not a {model} one")
        if entry.model_files:
            return ModelSpec(
                spec_key(entry.family, entry.model_files),
                model_type=entry.family,
                device=None,
                options=dict(entry.model_files),
            )
        for spec in self.config.models.values():
            if spec.model_type == entry.family:
                return spec
        raise BadRequestError(
            f"voice {entry.name!r} names no model files and no configured model is a {entry.family} model; "
            "add model_files to the voice or a [models.NAME] table with that model_type"
        )
