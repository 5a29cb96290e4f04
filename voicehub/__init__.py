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

# The GPT-SoVITS voice-conversation face, imported on first use so `import voicehub` loads no torch.
_LAZY = {
    "TTSInferencer": "voicehub.models.gpt_sovits.inferencer",
    "Voice": "voicehub.models.gpt_sovits.reference",
    "apply_preset": "voicehub.models.gpt_sovits.presets",
    "list_presets": "voicehub.models.gpt_sovits.presets",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'voicehub' has no attribute {name!r}")


__all__ = [
    "AudioChunk",
    "AudioFormatError",
    "AutoModelForTextToSpeech",
    "CheckpointError",
    "InvalidTextError",
    "MissingDependencyError",
    "ModelNotFoundError",
    "TTSInferencer",
    "TTSOptimizationConfig",
    "TTSOutput",
    "Voice",
    "VoiceHubError",
    "apply_preset",
    "get_tts_optimization_support",
    "list_presets",
    "list_tts_optimization_support",
]
