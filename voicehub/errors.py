"""Exceptions raised to VoiceHub callers; each message says what to do about it."""

from __future__ import annotations


class VoiceHubError(Exception):
    """Base class of every error VoiceHub raises on purpose."""


class InvalidTextError(VoiceHubError, ValueError):
    """The text is empty, unspeakable, or over the length limit."""


class ModelNotFoundError(VoiceHubError, FileNotFoundError):
    """A model name or path does not resolve to files VoiceHub can load."""


class CheckpointError(VoiceHubError, ValueError):
    """A checkpoint file is unreadable, of the wrong kind, or does not match the model's tensors."""


class MissingDependencyError(VoiceHubError, ImportError):
    """An optional package or program is needed; the message names the install command."""


class AudioFormatError(VoiceHubError, ValueError):
    """An audio format is unknown, or audio cannot be decoded or encoded."""
