"""Per-request decode parameters and the eager reference decode (upstream v3 `infer_panel_naive`).

This path is the reference every fast path is held to: it follows upstream's loop step by step,
including its quirks, so that for the same weights, inputs and seed it emits upstream's tokens:
- sampling order: repetition penalty over prompt + generated tokens, top-p, temperature, top-k,
  then the exponential-noise draw (`probs / q`, q ~ Exp(1));
- EOS is removed from the logits for the first 11 steps (the width shrinks, so the noise draw is
  1024 wide there, which is part of the RNG stream);
- a step stops on EOS when the sampled token is EOS *or* the argmax of the penalized logits is;
- the cap: after step idx, stop when idx + 1 > early_stop_num or idx == 1499; upstream's callers
  then keep `y[-idx:]`, i.e. the last early_stop_num of the early_stop_num + 1 tokens drawn.

Each step also records how close its decision was (`DecodeResult.decision_margins`), so that a
fast path can be held to eager's tokens wherever the decision was not a near-tie.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import torch
import torch.nn.functional as F

from voicehub.models.gpt_sovits.t2s.config import EOS_BLOCKED_STEPS, MAX_DECODE_STEPS
from voicehub.models.gpt_sovits.t2s.model import T2SModel, prompt_attention


class StopReason(StrEnum):
    EOS = "eos"
    MAX_TOKENS = "max_tokens"
    FORCED = "forced"


@dataclass(frozen=True)
class T2SSamplingParams:
    """One request's decoding choices; defaults are upstream get_tts_wav's (repetition: infer_panel's).

    max_new_tokens is upstream's early_stop_num (None: the checkpoint's 50 * data.max_sec).
    force_n_tokens suppresses EOS and stops after exactly N tokens (tests and benchmarks).
    seed None draws a fresh seed.
    """

    top_k: int = 20
    top_p: float = 0.6
    temperature: float = 0.6
    repetition_penalty: float = 1.35
    seed: int | None = None
    max_new_tokens: int | None = None
    force_n_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 (1 is greedy), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 turns nucleus filtering off), got {self.top_p}")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be >= 0 (upstream clamps it to 1e-5), got {self.temperature}")
        if self.repetition_penalty <= 0.0:
            raise ValueError(
                f"repetition_penalty must be > 0 (1.0 turns it off), got {self.repetition_penalty}"
            )
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1 or None, got {self.max_new_tokens}")
        if self.force_n_tokens is not None and self.force_n_tokens < 1:
            raise ValueError(f"force_n_tokens must be >= 1 or None, got {self.force_n_tokens}")

    @classmethod
    def greedy(cls, **overrides: object) -> T2SSamplingParams:
        """top_k 1, no nucleus, temperature 1, no repetition penalty unless overridden."""
        base = {"top_k": 1, "top_p": 1.0, "temperature": 1.0, "repetition_penalty": 1.0}
        return cls(**{**base, **overrides})


def _empty() -> torch.Tensor:
    return torch.zeros(0)


@dataclass(frozen=True)
class DecodeResult:
    """One decoded request; per-step tensors have one entry per step (n_steps), on the CPU.

    tokens: [N] long semantic tokens (EOS excluded).
    margins: [steps] float32, top-1 minus top-2 of the penalized logits (logit units).
    decision_margins: [steps] float32, the margin of the decision the step actually took:
      - a logit margin (as `margins`) where the step was an argmax: top_k 1, or filtering left a
        single candidate, so only the order of the penalized logits decides;
      - a sampled margin (natural-log units) on every other step: the smallest of
        * the race margin where the exponential race `argmax(probs / q)` chose among >= 2
          candidates: log r[token] - max over j != token of log r[j], with r = probs / q and
          log r = log(probs) - log(q) in float32 from eager's own probs and noise. It is
          scale-free (normalising probs or scaling q shifts every log r alike) and says how far
          the log-probabilities may move (by up to half of it each) before another token wins;
          a logit error d moves log r by about d / temperature. Negative only where eager's own
          lower-precision race and the float32 recomputation disagree (a tie in the model dtype);
        * the candidate-set margins (`boundary_margin`): how close the top-k cut and the top-p cut
          are to letting a token in or out (a token that enters can win the race);
        * where filtering left one candidate, the top-1/top-2 logit margin / temperature (the
          candidate is the top token, so an order flip changes it).
    is_race: [steps] bool, True where decision_margins is a sampled margin (log units), False for
      a logit margin (argmax steps: top_k 1).
    Paths other than eager may leave margins, decision_margins and is_race empty.
    """

    tokens: torch.Tensor
    stop_reason: StopReason
    n_steps: int
    margins: torch.Tensor
    decision_margins: torch.Tensor = field(default_factory=_empty)
    is_race: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    return reseed(torch.Generator(device=device), seed)


def reseed(gen: torch.Generator, seed: int | None) -> torch.Generator:
    """Seed `gen` in place (a fresh random seed for None); a graph-registered generator keeps working."""
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def reference_probs(
    logits: torch.Tensor, history: torch.Tensor, params: T2SSamplingParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream `logits_to_probs` with scalar parameters. logits: [1, V]; history: [1, L] long.
    Returns (probs [1, V], penalized logits [1, V]); `logits` is left untouched."""
    logits = logits.clone()
    if history.shape[1] > 0 and params.repetition_penalty != 1.0:
        score = logits.gather(1, history)
        score = torch.where(score < 0, score * params.repetition_penalty, score / params.repetition_penalty)
        logits.scatter_(1, history, score)  # duplicates write the same value: each token penalized once
    penalized = logits
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        remove = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1) > params.top_p
        remove[:, 0] = False  # upstream keeps the top token and does not shift the mask
        logits = logits.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    logits = logits / max(params.temperature, 1e-5)
    kth = torch.topk(logits, min(params.top_k, logits.shape[-1])).values[:, -1:]
    logits = torch.where(logits < kth, float("-inf"), logits)
    return torch.softmax(logits, dim=-1), penalized


def race_noise(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The race's noise q ~ Exp(1), [B, V] in probs' dtype (one draw of V values per row from `generator`)."""
    return torch.empty_like(probs).exponential_(1, generator=generator)


def draw_token(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Exponential-race draw, as gpt-fast's `multinomial_sample_one_no_sync`: [B, V] -> [B] long."""
    return torch.argmax(probs / race_noise(probs, generator), dim=-1)


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    # logits: [B, V] -> [B] float32
    top = torch.topk(logits.float(), 2, dim=-1).values
    return top[:, 0] - top[:, 1]


def race_margin(probs: torch.Tensor, q: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """log r[token] - max_{j != token} log r[j], r = probs / q, in float32 (see DecodeResult).
    probs, q: [B, V]; token: [B] long -> [B] float32; +inf where token is the only candidate."""
    log_r = probs.float().log() - q.float().log()  # zero probs give -inf: never a rival
    chosen = log_r.gather(1, token[:, None])[:, 0]
    rival = log_r.scatter(1, token[:, None], float("-inf")).amax(dim=-1)
    return chosen - rival


def boundary_margin(penalized: torch.Tensor, params: T2SSamplingParams) -> torch.Tensor:
    """How far the candidate set is from changing, in natural-log units, [B] float32 (+inf where no
    cut binds). penalized: [B, V] logits after the repetition penalty.

    top-p (upstream removes every sorted token whose cumulative probability exceeds top_p, the top
    one kept): with m the first removed index, min(log(cum[m] / top_p), log(top_p / cum[m - 1]))
    (the second only where cum[m - 1] <= top_p: the top token stays whatever its probability);
    a logit error d changes a sum of probabilities by a factor within exp(+-2d).
    top-k: s[k-1] - s[k] of the sorted temperature-scaled logits that survive top-p (the race's
    log-probability units), +inf when fewer than k + 1 tokens survive."""
    x = penalized.float()
    margin = torch.full(x.shape[:1], float("inf"), device=x.device)
    if params.top_p < 1.0:
        ordered, order = torch.sort(x, dim=-1, descending=True)
        cum = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        removed = cum > params.top_p
        removed[:, 0] = False
        has_cut = removed.any(dim=-1)
        m = removed.float().argmax(dim=-1).clamp(min=1)[:, None]
        kept = cum.gather(1, m - 1)  # above top_p only when it is the top token, kept regardless
        kept_room = torch.where(kept <= params.top_p, (params.top_p / kept).log(), float("inf"))
        cut = torch.minimum((cum.gather(1, m) / params.top_p).log(), kept_room)[:, 0]
        margin = torch.where(has_cut, torch.minimum(margin, cut), margin)
        x = x.masked_fill(removed.scatter(1, order, removed), float("-inf"))
    k = min(params.top_k, x.shape[-1])
    if k < x.shape[-1]:
        top = torch.topk(x / max(params.temperature, 1e-5), k + 1, dim=-1).values
        gap = top[:, k - 1] - top[:, k]
        margin = torch.minimum(margin, torch.where(torch.isfinite(top[:, k]), gap, float("inf")))
    return margin


def decision_margin(
    probs: torch.Tensor,
    q: torch.Tensor,
    token: torch.Tensor,
    penalized: torch.Tensor,
    params: T2SSamplingParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(margin [B] float32, is_race [B] bool) of one step's decision, computed on the device (no sync).
    probs, q, penalized: [B, V]; token: [B] long. See DecodeResult.decision_margins."""
    logit = top2_margin(penalized)
    if params.top_k == 1:
        return logit, torch.zeros_like(logit, dtype=torch.bool)
    several = (probs > 0).sum(dim=-1) >= 2
    own = torch.where(several, race_margin(probs, q, token), logit / max(params.temperature, 1e-5))
    return torch.minimum(own, boundary_margin(penalized, params)), torch.ones_like(several)


def _step_layers(model: T2SModel, x: torch.Tensor, keys: list, values: list) -> torch.Tensor:
    # x: [1, 1, D]; keys/values[i]: [1, H, T, D/H], grown by one (upstream concatenates too)
    for i, layer in enumerate(model.h.layers):
        q, k, v = layer.project_qkv(x)
        keys[i] = torch.cat([keys[i], k], dim=2)
        values[i] = torch.cat([values[i], v], dim=2)
        x = layer.finish(x, F.scaled_dot_product_attention(q, keys[i], values[i]))
    return x


def _is_done(idx: int, n_generated: int, cap: int, forced: int | None) -> bool:
    if forced is not None:
        return n_generated >= forced
    return n_generated > cap or idx == MAX_DECODE_STEPS - 1


def encode_prompt(
    model: T2SModel, phone_ids: torch.Tensor, bert: torch.Tensor, prompt: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Prefill [phonemes | prompt tokens]. phone_ids: [Tx] long; bert: [1024, Tx]; prompt: [Ty] long
    (all on the model's device). Returns the next-token logits [1, V] and per-layer K, V [1, H, T, D/H]."""
    dtype = model.ar_predict_layer.weight.dtype
    xy = model.embed_text(phone_ids[None], bert.to(dtype)[None])
    if prompt.shape[0]:
        xy = torch.cat([xy, model.embed_audio(prompt[None])], dim=1)
    attend = prompt_attention(phone_ids.shape[0], prompt.shape[0], phone_ids.device)
    hidden, keys, values = model.prefill(xy, attend)
    return model.logits(hidden[:, -1]), keys, values


@torch.inference_mode()
def decode(
    model: T2SModel,
    phone_ids: torch.Tensor,
    bert: torch.Tensor,
    prompt_tokens: torch.Tensor,
    params: T2SSamplingParams,
) -> DecodeResult:
    """Eager reference decode of one request.

    phone_ids: [Tx] long, reference phonemes then target phonemes; bert: [1024, Tx] features
    (zeros where not Chinese); prompt_tokens: [Ty] long semantic tokens of the reference audio.
    """
    cfg = model.config
    dev = model.ar_predict_layer.weight.device
    phone_ids, prompt = phone_ids.to(dev).long(), prompt_tokens.to(dev).long()
    n_audio = prompt.shape[0]
    logits, keys, values = encode_prompt(model, phone_ids, bert.to(dev), prompt)
    gen = make_generator(params.seed, dev)
    cap = params.max_new_tokens or cfg.early_stop_num
    forced = params.force_n_tokens
    history, margins, decisions, races = prompt[None], [], [], []
    for idx in range(forced or MAX_DECODE_STEPS):
        if forced is not None or idx < EOS_BLOCKED_STEPS:
            logits = logits[:, : cfg.eos]  # upstream slices EOS off (EOS is the last id)
        probs, penalized = reference_probs(logits, history, params)
        q = race_noise(probs, gen)
        token = torch.argmax(probs / q, dim=-1)  # draw_token, with q kept for the margin
        margins.append(top2_margin(penalized))
        decision, is_race = decision_margin(probs, q, token, penalized, params)
        decisions.append(decision)
        races.append(is_race)
        history = torch.cat([history, token[:, None]], dim=1)
        is_eos = forced is None and bool(token[0] == cfg.eos or penalized.argmax(-1)[0] == cfg.eos)
        if is_eos:
            history = history[:, :-1]
        if is_eos or _is_done(idx, idx + 1, cap, forced):
            break
        x = model.embed_audio_at(token, torch.full_like(token, n_audio + idx))
        logits = model.logits(_step_layers(model, x, keys, values)[:, -1])
    generated = history[0, n_audio:]
    if forced is not None:
        reason = StopReason.FORCED
    elif is_eos:
        reason = StopReason.EOS
    else:
        reason = StopReason.MAX_TOKENS
        generated = generated[generated.shape[0] - idx :]  # upstream's y[:, -idx:]
    return DecodeResult(
        generated.clone(),
        reason,
        idx + 1,
        torch.cat(margins).cpu(),
        torch.cat(decisions).cpu(),
        torch.cat(races).cpu(),
    )
