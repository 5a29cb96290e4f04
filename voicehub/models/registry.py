"""The one registry of model families: model_type -> the module that defines its `FAMILY`.

Adding a family adds one line here and touches no other family's code. Modules are imported
only when their family is used, so `import voicehub` stays light.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from voicehub.errors import ModelNotFoundError
from voicehub.models.base import ModelFamily

FAMILY_MODULES: dict[str, str] = {
    "gpt-sovits-v3": "voicehub.models.gpt_sovits",
    "vits": "voicehub.models.vits",
}


def known_model_types() -> list[str]:
    return sorted(FAMILY_MODULES)


def get_family(model_type: str) -> ModelFamily:
    """The family registered as `model_type`; an unknown type raises and lists the known ones."""
    if model_type not in FAMILY_MODULES:
        raise ValueError(
            f"unknown model_type {model_type!r}; known model types: {', '.join(known_model_types())}"
        )
    family = importlib.import_module(FAMILY_MODULES[model_type]).FAMILY
    assert family.model_type == model_type, (family.model_type, model_type)
    return family


def find_family_for_files(options: dict[str, object]) -> ModelFamily:
    """Which family loads the files named in load options (e.g. gpt_path=, sovits_path=), by content."""
    files = [Path(v).expanduser() for v in options.values() if isinstance(v, (str, Path))]
    files = [f for f in files if f.is_file()]
    for family in (get_family(t) for t in known_model_types()):
        if any(family.detect(f) for f in files):
            return family
    named = ", ".join(f"{k}={v!r}" for k, v in options.items() if isinstance(v, (str, Path)))
    raise ModelNotFoundError(
        f"no model family recognises the files given ({named or 'none'}); check the paths, or pass "
        f"model_type= (known: {', '.join(known_model_types())})"
    )


def find_family(name_or_path: str | Path) -> tuple[ModelFamily, Path]:
    """Which family loads `name_or_path` (a path, or an installed voice's name), and the path to load."""
    path = Path(name_or_path).expanduser()
    families = [get_family(t) for t in known_model_types()]
    if path.exists():
        for family in families:
            if family.detect(path):
                return family, path
        raise ModelNotFoundError(
            f"no model family recognises {str(path)!r}; known model types: {', '.join(known_model_types())}. "
            "Pass model_type= to name one, and check that the files are complete."
        )
    for family in families:
        resolved = family.resolve(str(name_or_path))
        if resolved is not None:
            return family, resolved
    installed = [n for f in families for n in f.installed()]
    raise ModelNotFoundError(
        f"no model named {str(name_or_path)!r} and no such path. Installed voices: "
        f"{', '.join(installed) or 'none'}; or pass the path to a model's files."
    )
