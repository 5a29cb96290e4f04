"""`AutoModelForTextToSpeech`: one entry point that picks the model family and loads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voicehub.models.base import TTSModel
from voicehub.models.registry import find_family, find_family_for_files, get_family
from voicehub.optimization.mixin import apply_load_time_config

DEFAULT_MODEL = "en_US-joe-medium"  # the embedded Piper voice, installed with the package


class AutoModelForTextToSpeech:
    """Loads any registered family: `AutoModelForTextToSpeech.from_pretrained("en_US-joe-medium")`."""

    def __init__(self) -> None:
        raise TypeError("use AutoModelForTextToSpeech.from_pretrained(name_or_path, ...)")

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path | None = None,
        model_type: str | None = None,
        device: str = "cpu",
        dtype: Any = None,
        lazy_load: bool = False,
        optimization_config: Any = None,
        **kwargs: Any,
    ) -> TTSModel:
        """Load a model from a path or an installed voice's name (default: the embedded voice).

        model_type: a registered family ('vits', ...); inferred from the files when omitted.
        lazy_load: read the configuration now and the weights on first use.
        optimization_config: a TTSOptimizationConfig applied once the weights are loaded.
        kwargs: family-specific load options (for example GPT-SoVITS checkpoint paths).
        """
        if name_or_path is None and not kwargs:
            name_or_path = DEFAULT_MODEL
        if model_type is not None:
            family = get_family(model_type)
            path = Path(name_or_path).expanduser() if name_or_path is not None else None
            if path is not None and not path.exists():
                path = family.resolve(str(name_or_path)) or path
        elif name_or_path is None:  # files named in kwargs only (gpt_path=, sovits_path=, ...)
            family, path = find_family_for_files(kwargs), None
        else:
            family, path = find_family(name_or_path)
        # With a config the weights are read after it is set pending, so a family applies it as part of its
        # load (GPT-SoVITS: before capturing graphs and warming up) instead of loading, then redoing work.
        defer = optimization_config is not None and not lazy_load
        model = family.load(path, device=device, dtype=dtype, lazy_load=lazy_load or defer, **kwargs)
        # None: nothing to do; a lazy model applies the policy when its weights load.
        apply_load_time_config(model, optimization_config)
        if defer:
            model.load_runtime()
        return model
