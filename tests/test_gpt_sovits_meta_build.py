"""The meta-device builds of a GPT-SoVITS v3 load do no arithmetic on meta tensors.

Arithmetic on meta tensors (and `arange`, `randn`, `kaiser_window` on meta) runs through torch's Python
references, whose first use imports sympy, torch._dynamo and ~900 other modules: 2-3 s of process start.
Our loaders (T2S, SoVITS with its DiT, BigVGAN) must not import them. transformers does, on importing
its HuBERT/BERT model modules (masking_utils imports torch._dynamo, torch.distributed.tensor imports
sympy; 4.57 and 5.x alike), before any constructor runs: the test checks that this import is where they
first come from, so a meta build in our code cannot hide behind it. Each check runs in a fresh process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gpt_sovits_fixtures import tiny_set  # noqa: F401 (fixture)

from voicehub.models.gpt_sovits.weights import computed_buffer, meta_device

CASCADE = ("sympy", "torch._dynamo", "torch.fx.experimental.symbolic_shapes")

# Loads the tiny set's files in build_pipeline's order, noting after each load which CASCADE modules are
# imported, and, for each, the stack (file, function) of its first import.
LOAD_SCRIPT = r"""
import importlib.abc, json, sys, traceback
from pathlib import Path

CASCADE = set(sys.argv[2].split(","))
first = {}

class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in CASCADE and name not in first:
            first[name] = [(f.filename, f.name) for f in traceback.extract_stack()[:-1]]
        return None

sys.meta_path.insert(0, Watch())
from voicehub.models.gpt_sovits.bert import BertFeatureExtractor
from voicehub.models.gpt_sovits.bigvgan import load_bigvgan
from voicehub.models.gpt_sovits.files import find_model_files
from voicehub.models.gpt_sovits.sovits import load_sovits_v3
from voicehub.models.gpt_sovits.ssl import HubertEncoder
from voicehub.models.gpt_sovits.t2s import load_t2s

root = Path(sys.argv[1])
files = find_model_files(root)
loads = {
    "import": lambda: None,
    "t2s": lambda: load_t2s(files.gpt, "cpu"),
    "sovits": lambda: load_sovits_v3(files.sovits, device="cpu"),
    "sovits_lora": lambda: load_sovits_v3(
        next((root / "lora").glob("*.pth")), base_path=files.pretrained / "s2Gv3.pth", device="cpu"
    ),
    "bigvgan": lambda: load_bigvgan(files.bigvgan, device="cpu"),
    "hubert": lambda: HubertEncoder.from_folder(files.hubert, "cpu"),
    "bert": lambda: BertFeatureExtractor.from_folder(files.bert, "cpu"),
}
after = {}
for name, load in loads.items():
    load()
    after[name] = sorted(CASCADE & set(sys.modules))
print(json.dumps({"after": after, "first": first, "n_modules": len(sys.modules)}))
"""


@pytest.fixture(scope="module")
def loaded(tiny_set):  # noqa: F811
    out = subprocess.run(
        [sys.executable, "-c", LOAD_SCRIPT, str(tiny_set), ",".join(CASCADE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _where(stack: list[tuple[str, str]]) -> str:
    return "\n".join(f"{path}: {name}" for path, name in stack[-12:])


def test_our_meta_builds_import_none_of_the_cascade(loaded):
    after = loaded["after"]
    for name in ("import", "t2s", "sovits", "sovits_lora", "bigvgan"):
        stacks = "\n".join(f"{m}:\n{_where(loaded['first'][m])}" for m in after[name])
        assert after[name] == [], (
            f"after the {name} load, {after[name]} are imported; first imports:\n{stacks}"
        )


def _in_module_import(stack: list[tuple[str, str]], package: str) -> bool:
    # a frame running a module body (`<module>`) of `package`: an import of it, not a call into it
    return any(name == "<module>" and f"/{package}/" in path.replace("\\", "/") for path, name in stack)


def test_the_cascade_comes_only_from_importing_transformers_models(loaded):
    transformers = pytest.importorskip("transformers")
    package = Path(transformers.__file__).parent.name
    for module, stack in loaded["first"].items():
        where = _where(stack)
        assert _in_module_import(stack, package), f"{module} first imported outside transformers:\n{where}"
        assert not any(path.endswith("weights.py") for path, _ in stack), (
            f"{module} from a meta build:\n{where}"
        )


def test_computed_buffer_is_empty_on_meta_and_computed_otherwise():
    table = lambda: torch.arange(6.0).view(2, 3)  # noqa: E731
    with meta_device():
        built = computed_buffer((2, 3), table)
    assert built.is_meta and built.shape == (2, 3) and built.dtype == torch.float32
    assert torch.equal(computed_buffer((2, 3), table), table())
