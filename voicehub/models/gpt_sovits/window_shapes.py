"""The shapes a streamed sentence's windows take (streaming.py's chain, `window_ends`' schedule): frames of
its SoVITS features, of its first CFM pieces and of its first vocoder calls. Pure arithmetic, nothing runs
on a model: the graph presets capture these shapes at load (acoustic_graphs.py) and the stream engine at
its start (engine_start.py).
"""

from __future__ import annotations

from itertools import islice

import torch

from voicehub.models.gpt_sovits.bigvgan import BigVGAN
from voicehub.models.gpt_sovits.sovits.model import encp_lengths
from voicehub.models.gpt_sovits.sovits.synth import T_CHUNK
from voicehub.models.gpt_sovits.streaming import CFM_CONTEXT_FRAMES, VocoderStream, window_ends


def feature_frames(n_tokens: int, speed: float) -> int:
    """Frames `SynthesizerV3.decode_encp` makes from n_tokens semantic tokens at `speed` (`encp_lengths`)."""
    return encp_lengths(n_tokens, speed)[1]


def stream_window_frames(vocoder: BigVGAN, chunk_tokens: int, speed: float, n_windows: int) -> list[int]:
    """Mel frames of the first `n_windows` vocoder calls of a long streamed sentence (none its last), as
    `VocoderStream` makes them from the windows of `window_ends(chunk_tokens)`: the shapes a sentence's
    first chunks need. Nothing runs on the vocoder."""
    hop, num_mels = vocoder.conf.hop_size, vocoder.conf.num_mels
    lengths: list[int] = []

    def record(_: BigVGAN, mel: torch.Tensor) -> torch.Tensor:
        lengths.append(mel.shape[2])
        return mel.new_zeros(1, mel.shape[2] * hop)

    stream = VocoderStream(vocoder, vocode_window=record)
    made = 0
    # a call each window once the first is long enough
    for end in islice(window_ends(chunk_tokens), 4 * n_windows + 1):
        if len(lengths) >= n_windows:
            break
        total = feature_frames(end, speed)
        stream.push(torch.zeros(1, num_mels, total - made), is_last=False)
        made = total
    return lengths[:n_windows]


def cfm_piece_frames(prompt_frames: int, chunk_tokens: int, speed: float, n_pieces: int) -> list[int]:
    """Frames N of the first `n_pieces` CFM pieces of a long streamed sentence (`CfmStream`: the reference
    prompt, up to CFM_CONTEXT_FRAMES of output so far, the new frames of a window of `window_ends`)."""
    sizes, made = [], 0
    for end in islice(window_ends(chunk_tokens), n_pieces):
        new = feature_frames(end, speed) - made
        sizes.append(min(T_CHUNK, prompt_frames + min(CFM_CONTEXT_FRAMES, made) + new))
        made += new
    return sizes
