"""Per-request parameters of GPT-SoVITS v3 synthesis: one frozen dataclass, validated in one place.

A preset (`fast`, `balanced`, `quality`; see presets.py) fills speed, CFM steps and the sampler;
any value given explicitly overrides it. `preset=None` starts from upstream get_tts_wav's own
defaults instead (top_k 20, top_p 0.6, temperature 0.6, speed 1.0, 8 CFM steps).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from voicehub.models.gpt_sovits.presets import GenerationPreset, apply_preset
from voicehub.models.gpt_sovits.t2s import T2SSamplingParams
from voicehub.text.options import CutMethod, Language, parse_cut_method, parse_language

DEFAULT_PRESET = "balanced"
UPSTREAM_DEFAULTS = GenerationPreset(speed=1.0, sample_steps=8, top_k=20, top_p=0.6, temperature=0.6)
DEFAULT_PAUSE_S = 0.3  # upstream's pause_second: silence between sentences
MAX_PAUSE_S = 10.0
MAX_SAMPLE_STEPS = 128
STREAM_CHUNK_TOKENS_RANGE = (4, 500)  # semantic tokens (25 per second of speech at speed 1) per window
SPEED_RANGE = (0.25, 4.0)  # beyond these the length regulator gives unintelligible speech
PRESET_FIELDS = tuple(f.name for f in fields(GenerationPreset))


@dataclass(frozen=True)
class GptSovitsParams:
    """One request's choices. Build it with `GptSovitsParams.build(...)`, which applies the preset.

    text_language: how the text's languages are read (upstream codes: `auto`, `en`, `zh`, `all_zh`,
    `ja`, `all_ja`, ... or upstream labels such as 中文). prompt_language: overrides the voice's own
    when given. how_to_cut: sentence cut method (`punctuation`, `none`, ... or cut0-cut5 / upstream
    labels). force_n_tokens: suppress EOS and decode exactly N semantic tokens per sentence (tests and
    benchmarks). max_new_tokens: the per-sentence token cap (None: the checkpoint's 50 * max_sec).
    pause_s: silence between sentences, in seconds. stream_chunk_tokens: None (default) makes each
    sentence whole and yields one chunk per sentence (the reference path); a number streams within a
    sentence: the first window has that many semantic tokens (25 is ~1 s), each later one twice the
    one before, up to 100 (streaming.window_ends).
    """

    text_language: Language = Language.AUTO
    prompt_language: Language | None = None
    how_to_cut: CutMethod = CutMethod.PUNCTUATION
    top_k: int = 5
    top_p: float = 1.0
    temperature: float = 0.6
    repetition_penalty: float = 1.35
    speed: float = 1.1
    sample_steps: int = 4
    seed: int | None = None
    force_n_tokens: int | None = None
    max_new_tokens: int | None = None
    pause_s: float = DEFAULT_PAUSE_S
    stream_chunk_tokens: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "text_language", parse_language(self.text_language))
        if self.prompt_language is not None:
            object.__setattr__(self, "prompt_language", parse_language(self.prompt_language))
        object.__setattr__(self, "how_to_cut", parse_cut_method(self.how_to_cut))
        lo, hi = SPEED_RANGE
        if not lo <= float(self.speed) <= hi:
            raise ValueError(f"speed must be in [{lo}, {hi}] (1.0 is the voice's own rate), got {self.speed}")
        if isinstance(self.sample_steps, bool) or not 1 <= int(self.sample_steps) <= MAX_SAMPLE_STEPS:
            raise ValueError(
                f"sample_steps (CFM solver steps) must be an integer in [1, {MAX_SAMPLE_STEPS}]; "
                f"4 is fast, 32 upstream's best; got {self.sample_steps}"
            )
        if not 0.0 <= float(self.pause_s) <= MAX_PAUSE_S:
            raise ValueError(f"pause_s must be in [0, {MAX_PAUSE_S}] seconds, got {self.pause_s}")
        if self.seed is not None and (isinstance(self.seed, bool) or not 0 <= int(self.seed) < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63) or None, got {self.seed}")
        lo_t, hi_t = STREAM_CHUNK_TOKENS_RANGE
        if self.stream_chunk_tokens is not None and (
            isinstance(self.stream_chunk_tokens, bool) or not lo_t <= int(self.stream_chunk_tokens) <= hi_t
        ):
            raise ValueError(
                f"stream_chunk_tokens must be None (one chunk per sentence) or an integer in [{lo_t}, {hi_t}] "
                f"semantic tokens per streamed window (25 is about 1 s); got {self.stream_chunk_tokens}"
            )
        self.sampling()  # the T2S sampler checks top_k, top_p, temperature, penalty and token counts

    @classmethod
    def build(cls, preset: str | None = DEFAULT_PRESET, **values: Any) -> GptSovitsParams:
        """Parameters from a preset plus explicit values; a value of None means "the preset's".

        Unknown names raise TypeError listing the valid ones (as a Python call would).
        """
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - valid)
        if unknown:
            raise TypeError(
                f"unknown GPT-SoVITS parameter(s) {', '.join(unknown)}; valid: preset, {', '.join(sorted(valid))}"
            )
        given = {k: v for k, v in values.items() if v is not None}
        overrides = {k: given.pop(k) for k in PRESET_FIELDS if k in given}
        if preset is None:
            chosen = replace(UPSTREAM_DEFAULTS, **overrides)
        else:
            chosen = apply_preset(preset, overrides=overrides)
        return cls(**chosen.to_dict(), **given)

    def sampling(self, seed: int | None = None) -> T2SSamplingParams:
        """The T2S decoder's parameters for one sentence (seed: that sentence's seed)."""
        return T2SSamplingParams(
            top_k=int(self.top_k),
            top_p=float(self.top_p),
            temperature=float(self.temperature),
            repetition_penalty=float(self.repetition_penalty),
            seed=seed,
            max_new_tokens=self.max_new_tokens,
            force_n_tokens=self.force_n_tokens,
        )
