"""VoiceHub: low-latency text-to-speech on a GPU, streamed as it is made."""

from voicehub.errors import (
    AudioFormatError,
    CheckpointError,
    InvalidTextError,
    MissingDependencyError,
    ModelNotFoundError,
    VoiceHubError,
)
from voicehub.hub import AutoModelForTextToSpeech
from voicehub.optimization import (
    TTSOptimizationConfig,
    get_tts_optimization_support,
    list_tts_optimization_support,
)
from voicehub.types import AudioChunk, TTSOutput

__version__ = "0.1.0"

__all__ = [
    "AudioChunk",
    "AudioFormatError",
    "AutoModelForTextToSpeech",
    "CheckpointError",
    "InvalidTextError",
    "MissingDependencyError",
    "ModelNotFoundError",
    "TTSOptimizationConfig",
    "TTSOutput",
    "VoiceHubError",
    "get_tts_optimization_support",
    "list_tts_optimization_support",
]
