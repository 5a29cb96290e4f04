"""The eager reference pipeline of GPT-SoVITS v3: text + voice -> 24 kHz audio, sentence by sentence.

It reproduces upstream's v3 flow (inference_webui.py `get_tts_wav` at the pinned commit):
- the prompt text gets a final 。 (or . for English) when it has no final mark; each cut sentence too;
- the reference at 16 kHz plus upstream's trailing zeros -> HuBERT -> the quantizer's `extract_latent`
  -> the prompt's semantic tokens;
- T2S input: prompt phonemes + sentence phonemes, prompt BERT + sentence BERT (zeros unless Chinese),
  the token cap hz * max_sec;
- SoVITS v3: the reference's style, features and mel prompt the CFM; BigVGAN vocodes the mel;
- audio whose peak exceeds 1 is divided by its peak; sentences are separated by `pause_s` of silence.
Differences, on purpose: sentences are cut by `TextFrontend.cut` (upstream's TTS.py pre-segmentation
rules), the pause is put *between* sentences (upstream also appends one after the last), and each
sentence edge next to a pause gets a 5 ms fade so a sentence that ends mid-wave does not click; and the
CFM solves each chunk right-padded to a multiple of 64 frames and the SoVITS encoder runs at the stream
engine's token/phoneme buckets, both masked (`solve_bucketed`, `decode_encp_bucketed`: equal up to float
rounding), so sentences of every length reach cuDNN at a few shapes (BigVGAN at the sentence's own). With
acoustic graphs (CUDA), the CFM chunks replay the streamed path's CFM graphs, the mel replays masked
BigVGAN window graphs (vocoder_graphs.vocode_mel) and the encoder runs without cuDNN: no stage plans a
new shape for a new sentence length.

Every fast path (issue 4: static KV, graphs, sub-sentence streaming) is held to this one.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from voicehub.audio.fades import fade_in, fade_out
from voicehub.audio.mel import V3_MEL, MelSpectrogram
from voicehub.errors import InvalidTextError
from voicehub.models.gpt_sovits.acoustic_graphs import AcousticGraphs
from voicehub.models.gpt_sovits.bert import BertFeatureExtractor, phone_bert_features
from voicehub.models.gpt_sovits.bigvgan import BigVGAN, vocode
from voicehub.models.gpt_sovits.cfm.solver import solve_bucketed
from voicehub.models.gpt_sovits.encoder_graphs import decode_encp_bucketed, decode_encp_without_cudnn
from voicehub.models.gpt_sovits.params import GptSovitsParams
from voicehub.models.gpt_sovits.reference import (
    ReferenceAudio,
    ReferenceCache,
    SpecConfig,
    Voice,
    load_reference_audio,
    reference_log_mel,
    reference_spectrogram,
)
from voicehub.models.gpt_sovits.sovits import ReferencePrompt, SynthesizerV3, decode_mel, encode_reference
from voicehub.models.gpt_sovits.ssl import HubertEncoder, reference_pad_samples
from voicehub.models.gpt_sovits.streaming import decode_steps, stepwise_windows, stream_windows, window_ends
from voicehub.models.gpt_sovits.t2s import DecodeResult, StopReason, T2SModel, T2SRequest, decode
from voicehub.models.gpt_sovits.t2s.runner import T2SGraphDecoder
from voicehub.models.gpt_sovits.t2s.static import StepKernels
from voicehub.runtime.eager_conv import aten_convolutions
from voicehub.text.cut import SPLITS
from voicehub.text.frontend import TextFrontend, TextSegment
from voicehub.text.options import Language
from voicehub.types import AudioChunk

SAMPLE_RATE = 24000  # Hz, BigVGAN v2 24 kHz output
SPEC = SpecConfig()  # v3 reference spectrogram: 32 kHz, 2048 / 640 / 2048
EDGE_FADE_S = 0.005  # fade at sentence edges that meet a pause
MAX_SEED = 2**63
log = logging.getLogger("voicehub.models.gpt_sovits")


@dataclass(frozen=True, eq=False)
class ReferenceFeatures:
    """What a voice contributes to every sentence; computed once per voice (see `Pipeline.reference`)."""

    prompt_text: str  # as fed to the frontend (final mark added)
    prompt_tokens: torch.Tensor  # [Ty] long semantic tokens of the reference audio (25 Hz)
    phone_ids: list[int]  # prompt phonemes
    bert: torch.Tensor  # [1024, len(phone_ids)]
    acoustic: ReferencePrompt  # style, features and mel prompt of the CFM


@dataclass(frozen=True, eq=False)
class SentenceFeatures:
    """One cut sentence after the text frontend."""

    text: str
    phones: list[str]
    phone_ids: list[int]
    bert: torch.Tensor  # [1024, len(phone_ids)]


@dataclass(frozen=True, eq=False)
class SentenceAudio:
    """One sentence through the whole chain: its semantic tokens and float32 [n] audio at 24 kHz."""

    tokens: torch.Tensor  # [N] long
    stop_reason: StopReason
    audio: np.ndarray


def ensure_final_mark(text: str, language: Language) -> str:
    """Upstream: a text without a final mark gets 。, or . when its language is `en`."""
    text = text.strip("\n")
    if text and text[-1] not in SPLITS:
        text += "." if language == Language.EN else "。"
    return text


def sentence_seed(seed: int, index: int) -> int:
    """The seed of sentence `index` of a request seeded with `seed` (sentence 0 uses the seed itself)."""
    return (seed + index) % MAX_SEED


class Pipeline:
    """Strategy objects assembled once on a device and dtype; `stream` is the request entry point."""

    def __init__(
        self,
        frontend: TextFrontend,
        hubert: HubertEncoder,
        bert: BertFeatureExtractor,
        t2s: T2SModel,
        sovits: SynthesizerV3,
        vocoder: BigVGAN,
        device: torch.device,
        dtype: torch.dtype,
        cache: ReferenceCache | None = None,
        model_id: str = "",
        t2s_decoder: T2SGraphDecoder | None = None,
        acoustic_graphs: AcousticGraphs | None = None,
    ):
        """t2s_decoder: the graph-captured decoder that owns the T2S GPU state (None: the eager
        reference `decode`, as on the CPU or with cuda_graph_preset 'off'); acoustic_graphs: the CFM
        and vocoder graphs of the streamed path (None: eager calls)."""
        self.frontend, self.hubert, self.bert = frontend, hubert, bert
        self.t2s, self.sovits, self.vocoder = t2s, sovits, vocoder
        self.t2s_decoder = t2s_decoder
        self.acoustic_graphs = acoustic_graphs
        # The decoder's static buffers serve one decode at a time; a streamed sentence holds them
        # between its chunks (see `_claim_decoder`).
        self._t2s_lock = threading.Lock()
        self._t2s_owner: int | None = None  # the thread holding _t2s_lock
        self.device, self.dtype = device, dtype
        self.cache = cache if cache is not None else ReferenceCache()
        self.model_id = model_id or f"pipeline-{id(self)}"
        self.mel = MelSpectrogram(V3_MEL).to(device)

    def set_t2s_step_kernels(self, kernels: StepKernels) -> StepKernels:
        """Route the graph decoder's step through `kernels` (waiting for a running decode); returns
        the previous choice. The eager reference path takes no kernels: it raises without a decoder."""
        if self.t2s_decoder is None:
            raise RuntimeError("this pipeline decodes T2S eagerly (no graph decoder): no step kernels to set")
        if self._t2s_owner == threading.get_ident():
            raise RuntimeError(
                "a stream on this thread is mid-sentence on the graph decoder: finish or close it before "
                "changing the decoder's step kernels"
            )
        with self._t2s_lock:
            return self.t2s_decoder.set_step_kernels(kernels)

    @contextmanager
    def _claim_decoder(self, request: T2SRequest) -> Iterator[T2SGraphDecoder | None]:
        """The graph decoder, held for the block (waiting while another thread decodes), or None for the
        eager reference decode: without a decoder, for a request larger than its cache, or when a stream
        suspended on this thread holds it (a caller interleaving streams on one thread, as the server's
        worker can, would otherwise wait for itself). The last two are logged."""
        decoder = self.t2s_decoder
        if decoder is None:
            yield None
        elif not decoder.fits(request):
            log.warning(
                "T2S request needs %d KV slots, the graph decoder holds %d: decoding it eagerly",
                decoder.slots_needed(request), decoder.engine.max_seq_len,
            )  # fmt: skip
            yield None
        elif self._t2s_owner == threading.get_ident():
            log.warning(
                "the T2S graph decoder is held by a stream suspended mid-sentence on this thread "
                "(streams interleaved on one thread): decoding this sentence eagerly"
            )
            yield None
        else:
            with self._t2s_lock:
                self._t2s_owner = threading.get_ident()
                try:
                    yield decoder
                finally:
                    self._t2s_owner = None

    # -- text ------------------------------------------------------------------------------------

    def text_features(self, text: str, language: Language) -> SentenceFeatures | None:
        """Phonemes and BERT features of one sentence (upstream get_phones_and_bert); None if unspeakable."""
        segments = self.frontend.segments(text, language)
        if not segments:
            return None
        phones = [p for s in segments for p in s.phones]
        ids = [i for s in segments for i in s.phone_ids]
        return SentenceFeatures(text, phones, ids, self._bert(segments))

    def _bert(self, segments: list[TextSegment]) -> torch.Tensor:
        # [1024, n_phones]: Chinese segments through BERT, zeros for the rest
        parts = [
            phone_bert_features(
                self.bert, s.language, s.norm_text, s.word2ph, len(s.phone_ids), self.dtype, self.device
            )
            for s in segments
        ]
        return torch.cat(parts, dim=1)

    def sentences(self, text: str, params: GptSovitsParams) -> list[str]:
        """The cut sentences of a request, each ending with a mark (empty text raises InvalidTextError)."""
        pieces = self.frontend.cut(text, params.how_to_cut, params.text_language)
        return [ensure_final_mark(p, params.text_language) for p in pieces if p.strip()]

    # -- reference -------------------------------------------------------------------------------

    def reference(self, voice: Voice, language: Language | None = None) -> ReferenceFeatures:
        """The voice's reference features, from the cache when this file content and prompt were seen."""
        lang = language or voice.prompt_language
        prompt_text = ensure_final_mark(voice.prompt_text, lang)
        return self.cache.get_or_compute(
            voice.ref_audio_path,
            self.model_id,
            lambda: self._compute_reference(voice.ref_audio_path, prompt_text, lang),
            extra=(prompt_text, lang.value),
        )

    @torch.inference_mode()
    def _compute_reference(self, path: Path, prompt_text: str, language: Language) -> ReferenceFeatures:
        ref = load_reference_audio(path)  # raises on unreadable audio and outside 3-10 s
        prompt = self.text_features(prompt_text, language)
        if prompt is None:
            raise InvalidTextError(
                f"the prompt text {prompt_text!r} has nothing speakable in {language.value!r}"
            )
        phones = torch.tensor([prompt.phone_ids], dtype=torch.long, device=self.device)
        # Each reference has its own length, run once: on CUDA its convolutions (the resamplers', HuBERT's,
        # the quantizer projection's, the style and SoVITS encoders') go through ATen, where cuDNN would
        # build a plan for each that is not used again (`runtime/eager_conv.py`).
        with aten_convolutions(self.device):
            spec = reference_spectrogram(ref, SPEC, self.device).to(self.dtype)
            log_mel = reference_log_mel(ref, self.mel, self.device).to(self.dtype)  # normalised later
            tokens = self.prompt_tokens(ref)
            acoustic = encode_reference(self.sovits, tokens[None, None], phones, spec, log_mel)
        return ReferenceFeatures(prompt_text, tokens, prompt.phone_ids, prompt.bert, acoustic)

    def prompt_tokens(self, ref: ReferenceAudio) -> torch.Tensor:
        """Semantic tokens [Ty] of the reference: 16 kHz audio + zeros -> HuBERT -> extract_latent."""
        wav16k = torch.from_numpy(ref.wav16k).to(self.device)
        ssl = self.hubert(wav16k, pad_samples=reference_pad_samples(SPEC.sample_rate))  # [1, 768, T]
        codes = self.sovits.extract_latent(ssl.to(self.dtype))  # [n_q, 1, T // 2]
        return codes[0, 0]

    # -- one sentence ----------------------------------------------------------------------------

    def t2s_request(
        self, ref: ReferenceFeatures, sentence: SentenceFeatures, params: GptSovitsParams, seed: int
    ) -> T2SRequest:
        """The T2S input of one sentence: reference + sentence phonemes and BERT, the reference's tokens."""
        phone_ids = torch.tensor(ref.phone_ids + sentence.phone_ids, dtype=torch.long, device=self.device)
        bert = torch.cat([ref.bert, sentence.bert], dim=1)  # [1024, P_ref + P]
        return T2SRequest(phone_ids, bert, ref.prompt_tokens, params.sampling(seed))

    def decode_tokens(
        self, ref: ReferenceFeatures, sentence: SentenceFeatures, params: GptSovitsParams, seed: int
    ) -> DecodeResult:
        """T2S: semantic tokens of one sentence, prompted by the reference."""
        request = self.t2s_request(ref, sentence, params, seed)
        with self._claim_decoder(request) as decoder:
            if decoder is not None:
                return decoder.decode([request])[0]
        return decode(self.t2s, request.phone_ids, request.bert, request.prompt_tokens, request.params)

    def token_batches(self, request: T2SRequest, ends: Iterable[int] | None = None) -> Iterator[torch.Tensor]:
        """The sentence's semantic tokens as they are decoded, in batches [n] long on the device: one per
        stop check from the graph decoder's `decode_iter` (with window `ends`, one per window, each out as
        soon as its last token is drawn), else one per step of the eager reference.
        Where the decode ends on the cap, the first token is kept (see `decode_iter`). The graph decoder
        stays held between batches until the decode ends: closing the iterator early frees it."""
        with self._claim_decoder(request) as decoder:
            if decoder is not None:
                for item in decoder.decode_iter(request, ends):
                    if item.result is not None:
                        break  # decoded: the decoder is free for others before the last tokens go on
                    yield item.tokens
        if decoder is not None:
            yield item.tokens
            return
        r = request
        yield from decode_steps(self.t2s, r.phone_ids, r.bert, r.prompt_tokens, r.params)

    @torch.inference_mode()
    def synthesize_sentence(
        self, ref: ReferenceFeatures, sentence: SentenceFeatures, params: GptSovitsParams, seed: int
    ) -> SentenceAudio:
        """One sentence through the whole chain: T2S -> SoVITS/CFM -> BigVGAN -> peak-limited float32 audio."""
        result = self.decode_tokens(ref, sentence, params, seed)
        phones = torch.tensor([sentence.phone_ids], dtype=torch.long, device=self.device)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        graphs = self.acoustic_graphs
        # With graphs: the CFM chunks replay the streamed path's graphs, the mel replays masked vocoder
        # window graphs, the encoder runs on ATen's convolutions (no cuDNN plans at the sentence's shapes)
        solver, encoder = (
            (solve_bucketed, decode_encp_bucketed)
            if graphs is None
            else (graphs.solve, decode_encp_without_cudnn)
        )
        mel = decode_mel(
            self.sovits, ref.acoustic, result.tokens[None, None], phones, int(params.sample_steps),
            speed=float(params.speed), generator=generator, solver=solver, encoder=encoder,
        )  # fmt: skip
        voc = vocode(self.vocoder, mel) if graphs is None else graphs.vocode_mel(self.vocoder, mel)
        audio = voc[0].float()  # [n]
        peak = audio.abs().max()
        if peak > 1:  # upstream: "simple protection against 16-bit clipping"
            audio = audio / peak
        return SentenceAudio(result.tokens, result.stop_reason, audio.cpu().numpy().astype(np.float32))

    # -- a request -------------------------------------------------------------------------------

    def speakable(self, sentences: list[str], language: Language) -> Iterator[tuple[SentenceFeatures, bool]]:
        """Sentences with features and an is-last flag, looking one sentence ahead (g2p only)."""
        found = (f for s in sentences if (f := self.text_features(s, language)) is not None)
        current = next(found, None)
        if current is None:
            raise InvalidTextError("the text has nothing speakable after normalisation")
        for following in found:
            yield current, False
            current = following
        yield current, True

    def stream(self, text: str, voice: Voice, params: GptSovitsParams) -> Iterator[AudioChunk]:
        """Check the request and compute the voice's reference now; then yield the chunks.

        Without `params.stream_chunk_tokens` each chunk is one sentence, made through the whole chain
        before the next sentence is decoded; with it, a sentence leaves in several chunks (streaming.py).
        A sentence's last chunk carries the pause when another sentence follows.
        """
        sentences = self.sentences(text, params)
        if not sentences:
            raise InvalidTextError(f"nothing to speak in {text[:60]!r} after cutting")
        ref = self.reference(voice, params.prompt_language)
        seed = params.seed if params.seed is not None else secrets.randbelow(MAX_SEED)
        return self._stream(sentences, ref, params, seed)

    def _stream(
        self, sentences: list[str], ref: ReferenceFeatures, params: GptSovitsParams, seed: int
    ) -> Iterator[AudioChunk]:
        pause = np.zeros(round(params.pause_s * SAMPLE_RATE), np.float32)
        fade = round(EDGE_FADE_S * SAMPLE_RATE)
        offset, n_chunks = 0, 0
        for index, (sentence, is_last) in enumerate(self.speakable(sentences, params.text_language)):
            pieces = self._sentence_pieces(ref, sentence, params, sentence_seed(seed, index))
            for k, (audio, is_final_piece) in enumerate(pieces):
                if index > 0 and k == 0:
                    audio = fade_in(audio, fade)
                if is_final_piece and not is_last:
                    audio = np.concatenate([fade_out(audio, fade), pause])
                yield AudioChunk(
                    audio=audio,
                    sample_rate=SAMPLE_RATE,
                    text=sentence.text,
                    index=n_chunks,
                    start_s=offset / SAMPLE_RATE,
                    is_last=is_last and is_final_piece,
                    phonemes=" ".join(sentence.phones),
                )
                offset, n_chunks = offset + len(audio), n_chunks + 1

    def _sentence_pieces(
        self, ref: ReferenceFeatures, sentence: SentenceFeatures, params: GptSovitsParams, seed: int
    ) -> Iterator[tuple[np.ndarray, bool]]:
        """A sentence's audio as (float32 piece, is_final) pairs: one piece (the per-sentence reference
        path), or with `stream_chunk_tokens` the sub-sentence stream of streaming.py, yielded lazily."""
        if params.stream_chunk_tokens is None:
            yield self.synthesize_sentence(ref, sentence, params, seed).audio, True
            return
        yield from self.stream_sentence(ref, sentence, params, seed)

    def stream_sentence(
        self, ref: ReferenceFeatures, sentence: SentenceFeatures, params: GptSovitsParams, seed: int
    ) -> Iterator[tuple[np.ndarray, bool]]:
        """True streaming of one sentence: (float32 piece, is_final) pairs, the first as soon as the first
        `stream_chunk_tokens` tokens are through SoVITS, the CFM and the vocoder, while T2S decodes on:
        the graph decoder (or its eager static twin) step-wise through `decode_iter`, or the eager
        reference decode one step at a time. Both paths cut the same windows from the same tokens."""
        assert params.stream_chunk_tokens is not None
        phones = torch.tensor([sentence.phone_ids], dtype=torch.long, device=self.device)
        request = self.t2s_request(ref, sentence, params, seed)
        first = int(params.stream_chunk_tokens)
        windows = stepwise_windows(self.token_batches(request, window_ends(first)), first)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        yield from stream_windows(
            self.sovits, self.vocoder, ref.acoustic, windows, phones,
            int(params.sample_steps), float(params.speed), generator, self.acoustic_graphs,
        )  # fmt: skip
