"""The meta-device builds of a GPT-SoVITS v3 load do no arithmetic on meta tensors.

Arithmetic on meta tensors (and `arange`, `randn`, `kaiser_window` on meta) runs through torch's Python
references, whose first use imports sympy, torch._dynamo and ~900 other modules: 2-3 s of process start.
Our loaders (T2S, SoVITS with its DiT, BigVGAN, HuBERT, BERT) must not import them, nor transformers
(importing its HuBERT/BERT model modules brings ~1,600 modules, the cascade among them: the runtime has
its own HuBERT and BERT modules for that reason). Each check runs in a fresh process.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from gpt_sovits_fixtures import REFERENCE_TEXT

from voicehub.models.gpt_sovits.weights import computed_buffer, meta_device

CASCADE = ("sympy", "torch._dynamo", "torch.fx.experimental.symbolic_shapes")

# Loads the tiny set's files in build_pipeline's order, noting after each load which CASCADE modules are
# imported, and, for each, the stack (file, function) of its first import.
LOAD_SCRIPT = r"""
import importlib.abc, json, sys, traceback
from pathlib import Path

CASCADE = set(sys.argv[2].split(","))
first = {}
python_kernels = []  # (torch function, nearest caller outside torch) while our loaders run

class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in CASCADE and name not in first:
            first[name] = [(f.filename, f.name) for f in traceback.extract_stack()[:-1]]
        return None

sys.meta_path.insert(0, Watch())
import torch

TORCH = str(Path(torch.__file__).parent) + "/"
KERNELS = tuple(TORCH + p for p in ("_refs/", "_decomp/", "_prims/", "_prims_common/", "_meta_registrations.py"))

def profile(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.startswith(KERNELS):
        caller = frame.f_back
        while caller is not None and (
            caller.f_code.co_filename.startswith(TORCH) or caller.f_code.co_filename.endswith("weights.py")
        ):  # the op's caller, past torch and the meta build's mode
            caller = caller.f_back
        where = f"{caller.f_code.co_filename}:{caller.f_lineno}" if caller is not None else "?"
        python_kernels.append((frame.f_code.co_name, where))

from voicehub.models.gpt_sovits.bert import BertFeatureExtractor
from voicehub.models.gpt_sovits.bigvgan import load_bigvgan
from voicehub.models.gpt_sovits.files import find_model_files
from voicehub.models.gpt_sovits.sovits import load_sovits_v3
from voicehub.models.gpt_sovits.ssl import HubertEncoder
from voicehub.models.gpt_sovits.t2s import load_t2s

OURS = ("t2s", "sovits", "sovits_lora", "bigvgan", "hubert", "bert")  # no Python kernel may run there
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
    sys.setprofile(profile if name in OURS else None)
    load()
    sys.setprofile(None)
    after[name] = sorted(CASCADE & set(sys.modules))
out = {"after": after, "first": first, "python_kernels": python_kernels[:50], "n_modules": len(sys.modules),
       "transformers": sorted(m for m in sys.modules if m.split(".")[0] == "transformers")[:5]}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def loaded(tiny_set):
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


def test_our_loads_run_none_of_torchs_python_kernels(loaded):
    # stricter than the imports (a version of torch may run a kernel in Python without importing more)
    ran = loaded["python_kernels"]
    assert not ran, f"torch's Python kernels (function, caller) ran in our loads: {ran[:10]}"


def test_our_meta_builds_import_none_of_the_cascade(loaded):
    after = loaded["after"]
    for name in ("import", "t2s", "sovits", "sovits_lora", "bigvgan", "hubert", "bert"):
        stacks = "\n".join(f"{m}:\n{_where(loaded['first'][m])}" for m in after[name])
        assert after[name] == [], (
            f"after the {name} load, {after[name]} are imported; first imports:\n{stacks}"
        )


def test_loading_every_model_imports_no_transformers(loaded):
    assert loaded["transformers"] == [], f"imported by a load: {loaded['transformers']}"


FACTORIES = {
    "zeros": lambda: torch.zeros(2, 3),
    "ones size=": lambda: torch.ones(size=(4,), dtype=torch.float16, requires_grad=True),
    "full float": lambda: torch.full((2, 2), 0.5),
    "full int": lambda: torch.full((3,), 7),
    "full bool": lambda: torch.full((1, 2), True),
    "full dtype": lambda: torch.full((2,), 1, dtype=torch.bfloat16),
    "zeros_like": lambda: torch.zeros_like(torch.empty(2, 5, dtype=torch.float64)),
    "ones_like dtype": lambda: torch.ones_like(torch.empty(3, 2).t(), dtype=torch.int32),
    "full_like": lambda: torch.full_like(torch.empty(2, 3, dtype=torch.float16), 3.0),
    "new_zeros": lambda: torch.empty(2, dtype=torch.int8).new_zeros(4, 4),
    "new_ones": lambda: torch.empty(2).new_ones((3,), requires_grad=True),
    "new_full": lambda: torch.empty(2, dtype=torch.float16).new_full((2, 3), 1.5),
    "parameter": lambda: torch.nn.Parameter(torch.ones(3)),
    "layer norm": lambda: torch.nn.LayerNorm(5).weight,
    "fill_": lambda: torch.empty(2, 2).fill_(3.0),
    "zero_": lambda: torch.empty(2, 2, dtype=torch.int64).zero_(),
    "init.constant_": lambda: torch.nn.init.constant_(torch.empty(3, 2), 0.1),
}


def _facts(t: torch.Tensor) -> tuple:
    return (type(t), t.device, t.shape, t.dtype, t.stride(), t.requires_grad)


@pytest.mark.parametrize("name", FACTORIES)
def test_the_meta_build_makes_what_torch_makes_on_meta(name):
    # the meta build skips values (constant factories made as `empty`, fills skipped): what it makes
    # must be what torch itself makes on the meta device, tensor for tensor
    with torch.device("meta"):
        want = FACTORIES[name]()
    with meta_device():
        got = FACTORIES[name]()
    assert _facts(got) == _facts(want)


def test_the_meta_build_leaves_other_devices_alone():
    with meta_device():
        cpu = torch.zeros(3, device="cpu")
        filled = torch.full((2,), 2.0, device="cpu").fill_(5.0)
    assert torch.equal(cpu, torch.zeros(3)) and torch.equal(filled, torch.full((2,), 5.0))


# A whole load (default voice warmed up: on CUDA the graph captures, Triton kernels chosen at load) and one
# request, every thread profiled: torch's Python kernels that ran with no import on the stack.
RUNTIME_SCRIPT = r"""
import json, sys, threading
from pathlib import Path

import torch

TORCH = str(Path(torch.__file__).parent) + "/"
KERNELS = tuple(TORCH + p for p in ("_refs/", "_decomp/", "_prims/", "_prims_common/", "_meta_registrations.py"))
outside = []

def profile(frame, event, arg):
    if event != "call" or not frame.f_code.co_filename.startswith(KERNELS):
        return
    f, where = frame.f_back, None
    while f is not None:
        path = f.f_code.co_filename
        if path.startswith("<frozen importlib"):
            return
        if where is None and not path.startswith(TORCH) and not path.endswith("weights.py"):
            where = f"{path}:{f.f_lineno}"
        f = f.f_back
    outside.append((frame.f_code.co_name, where))

root, wav, text, device = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
threading.setprofile(profile)
sys.setprofile(profile)
from voicehub import AutoModelForTextToSpeech
from voicehub.models.gpt_sovits import Voice
from voicehub.optimization.config import TTSOptimizationConfig

voice = Voice(wav, text, "en")
kw = dict(model_type="gpt-sovits-v3", device=device, default_voice=voice)
if device == "cuda":
    config = TTSOptimizationConfig(kernel_backend="triton", compile="disabled")
    kw.update(cuda_graph_preset="minimal", optimization_config=config)
model = AutoModelForTextToSpeech.from_pretrained(root, **kw)
model.generate("One request.", voice=voice, seed=0, force_n_tokens=16, speed=1.0, how_to_cut="none")
sys.setprofile(None)
threading.setprofile(None)
print(json.dumps({"outside": outside[:20], "n_outside": len(outside)}))
"""


@pytest.mark.gpu
def test_a_cuda_load_and_request_run_none_of_torchs_python_kernels(tiny_set, reference_wav):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    args = [str(tiny_set), str(reference_wav), REFERENCE_TEXT, "cuda"]
    out = subprocess.run(
        [sys.executable, "-c", RUNTIME_SCRIPT, *args], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-4000:]
    ran = json.loads(out.stdout.strip().splitlines()[-1])
    assert ran["n_outside"] == 0, f"torch's Python kernels (function, caller) ran: {ran['outside']}"


def test_computed_buffer_is_empty_on_meta_and_computed_otherwise():
    table = lambda: torch.arange(6.0).view(2, 3)  # noqa: E731
    with meta_device():
        built = computed_buffer((2, 3), table)
    assert built.is_meta and built.shape == (2, 3) and built.dtype == torch.float32
    assert torch.equal(computed_buffer((2, 3), table), table())


def test_prepared_loaders_copy_nothing_until_called_and_give_the_loaders_models(tiny_set, monkeypatch):
    """build_pipeline reads every file and builds every model on meta first (the CUDA context is still being
    made then): no tensor is copied to a device before the prepared functions' calls, which give the
    loaders' models."""
    from voicehub.models.gpt_sovits.bert import BertFeatureExtractor
    from voicehub.models.gpt_sovits.bigvgan import load_bigvgan, prepare_bigvgan
    from voicehub.models.gpt_sovits.files import find_model_files
    from voicehub.models.gpt_sovits.sovits import load_sovits_v3, prepare_sovits_v3
    from voicehub.models.gpt_sovits.ssl import HubertEncoder
    from voicehub.models.gpt_sovits.t2s import load_t2s, prepare_t2s

    files = find_model_files(tiny_set)
    cpu, dtype = torch.device("cpu"), torch.float32
    copies: list[str] = []
    to = torch.Tensor.to

    def recording(self, *args, **kwargs):
        if "device" in kwargs or any(isinstance(a, (torch.device, str)) for a in args):
            copies.append("to")
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", recording)
    prepared = {
        "t2s": prepare_t2s(files.gpt),
        "sovits": prepare_sovits_v3(files.sovits),
        "bigvgan": prepare_bigvgan(files.bigvgan),
        "hubert": HubertEncoder.prepare(files.hubert),
        "bert": BertFeatureExtractor.prepare(files.bert),
    }
    assert copies == []
    loads = {
        "t2s": lambda: load_t2s(files.gpt, cpu, dtype)[0],
        "sovits": lambda: load_sovits_v3(files.sovits, device=cpu, dtype=dtype),
        "bigvgan": lambda: load_bigvgan(files.bigvgan, device=cpu, dtype=dtype),
        "hubert": lambda: HubertEncoder.from_folder(files.hubert, cpu, dtype),
        "bert": lambda: BertFeatureExtractor.from_folder(files.bert, cpu, dtype),
    }
    for name, put in prepared.items():
        got = put(cpu, dtype)
        have = (got[0] if isinstance(got, tuple) else got).state_dict()
        want = loads[name]().state_dict()
        assert have.keys() == want.keys(), name
        assert all(torch.equal(have[k], want[k]) for k in want), name
    assert copies  # the calls did copy
