"""Reading Piper checkpoints into `VitsSynthesizer`: ONNX voices and PyTorch Lightning `.ckpt` files.

ONNX: most initializers keep their PyTorch names; the rest (`onnx::Conv_*`, `sid`, ...) are named
after the node that consumes them (`/flow/flows.6/enc/in_layers.0/Conv` -> `flow.flows.6.enc.
in_layers.0.weight`), and the duration flow's first affine layer was constant-folded into
`/dp/flows.0/Exp_output_0` = exp(-logs). Graph attributes give what shapes cannot (strides,
dilations). Lightning: the generator lives under `state_dict` with the `model_g.` prefix, still
weight-normalised (`weight_g`/`weight_v`), and the hyperparameters under `hyper_parameters`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voicehub.errors import CheckpointError
from voicehub.models.checkpoints import fold_weight_norm
from voicehub.models.vits.config import VitsArchitecture

AttrGetter = Callable[[str, str], list[int] | None]  # (module path, attribute) -> ints or None

# Tensors a Lightning checkpoint holds that inference never reads: the posterior encoder, the
# duration predictor's posterior flows, and the flow upstream drops when sampling durations.
TRAINING_ONLY = ("enc_q.", "dp.post_pre.", "dp.post_proj.", "dp.post_convs.", "dp.post_flows.", "dp.flows.1.")
GENERATOR_PREFIX = "model_g."
# ONNX op -> which input holds which parameter of the consuming module.
_PARAM_SLOTS = {
    "Conv": {1: "weight", 2: "bias"},
    "ConvTranspose": {1: "weight", 2: "bias"},
    "Gather": {0: "weight"},
}
_FOLDED_EXP = re.compile(r"^/(.+)/Exp_output_0$")


def _module_path(node_name: str) -> str:
    """'/flow/flows.6/enc/in_layers.0/Conv' -> 'flow.flows.6.enc.in_layers.0'."""
    return ".".join(node_name.strip("/").split("/")[:-1])


def read_onnx(path: Path) -> tuple[dict[str, torch.Tensor], AttrGetter]:
    """The state dict recovered from a Piper ONNX file, and a getter for its conv attributes."""
    import onnx
    from onnx import numpy_helper

    try:
        proto = onnx.load(str(path))
    except Exception as exc:  # protobuf raises its own DecodeError types; all mean "not an ONNX model"
        raise CheckpointError(
            f"{str(path)!r} is not a readable ONNX model ({type(exc).__name__}: {exc})"
        ) from exc
    graph = proto.graph
    if not graph.initializer:
        raise CheckpointError(f"{str(path)!r} holds no weights (no ONNX initializers); is it a Piper voice?")
    consumers: dict[str, list[tuple[Any, int]]] = {}
    attrs: dict[str, dict[str, list[int]]] = {}
    for node in graph.node:
        for slot, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, slot))
        if node.op_type in ("Conv", "ConvTranspose"):
            attrs[_module_path(node.name)] = {a.name: list(a.ints) for a in node.attribute if a.ints}
    state: dict[str, torch.Tensor] = {}
    folded: dict[str, torch.Tensor] = {}
    for init in graph.initializer:
        key = _onnx_key(init.name, consumers.get(init.name, []))
        if key is None:
            continue
        value = torch.from_numpy(np.array(numpy_helper.to_array(init), copy=True))
        if _FOLDED_EXP.match(init.name):
            folded[key] = -torch.log(value)  # exp(-logs) was folded; recover logs
            continue
        if key in state:
            raise CheckpointError(f"{str(path)!r}: two ONNX initializers map to {key!r}")
        state[key] = value
    # Only an affine flow's folded scale is a weight; any other folded Exp is a graph constant.
    state.update({k: v for k, v in folded.items() if k[: -len("logs")] + "m" in state})

    def get(module: str, attr: str) -> list[int] | None:
        return attrs.get(module, {}).get(attr)

    return state, get


def _onnx_key(name: str, uses: list[tuple[Any, int]]) -> str | None:
    """The state-dict key an ONNX initializer holds, or None for a graph constant."""
    if re.fullmatch(r"[A-Za-z_]\w*(\.\w+)+", name):
        return name  # kept its PyTorch name (unknown ones are reported by the strict load)
    folded = _FOLDED_EXP.match(name)
    if folded:
        return folded.group(1).replace("/", ".") + ".logs"
    for node, slot in uses:
        param = _PARAM_SLOTS.get(node.op_type, {}).get(slot)
        if param and node.name:
            return f"{_module_path(node.name)}.{param}"
    return None


def read_ckpt(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The generator's inference state dict (weight norm folded) and hyperparameters of a Piper `.ckpt`."""
    try:
        ckpt = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # zip/pickle errors of many types; all mean "not a loadable checkpoint"
        raise CheckpointError(
            f"cannot read {str(path)!r} as a PyTorch checkpoint ({type(exc).__name__}: {exc}); "
            "give a Piper training .ckpt, or the voice's .onnx file"
        ) from exc
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise CheckpointError(f"{str(path)!r} has no 'state_dict'; it is not a Piper (Lightning) checkpoint")
    gen = {
        k[len(GENERATOR_PREFIX) :]: v for k, v in ckpt["state_dict"].items() if k.startswith(GENERATOR_PREFIX)
    }
    if not gen:
        raise CheckpointError(
            f"{str(path)!r} has no '{GENERATOR_PREFIX}*' tensors; it is not a Piper VITS checkpoint"
        )
    gen = fold_weight_norm(gen)
    gen = {k: v for k, v in gen.items() if not k.startswith(TRAINING_ONLY)}
    return gen, dict(ckpt.get("hyper_parameters") or {})


def _indices(state: dict[str, torch.Tensor], pattern: str) -> list[int]:
    return sorted({int(m.group(1)) for k in state if (m := re.fullmatch(pattern, k))})


def _hparam(hparams: dict[str, Any], key: str) -> Any:
    value = hparams.get(key)
    return ast.literal_eval(value) if isinstance(value, str) else value


def architecture(
    state: dict[str, torch.Tensor], attr: AttrGetter, hparams: dict[str, Any], source: Path
) -> VitsArchitecture:
    """Read the network's shape from its tensors, graph attributes (ONNX) or hyperparameters (.ckpt)."""
    try:
        return _architecture(state, attr, hparams)
    except KeyError as exc:
        raise CheckpointError(
            f"{str(source)!r} lacks the tensor {exc.args[0]!r}; it is not a Piper VITS voice"
        ) from exc
    except (TypeError, IndexError, ValueError) as exc:
        raise CheckpointError(f"{str(source)!r}: cannot read the VITS architecture ({exc})") from exc


def _architecture(
    state: dict[str, torch.Tensor], attr: AttrGetter, hparams: dict[str, Any]
) -> VitsArchitecture:
    shape = {k: tuple(v.shape) for k, v in state.items()}

    def need(key: str) -> tuple[int, ...]:
        if key not in shape:
            raise KeyError(key)
        return shape[key]

    n_vocab, hidden = need("enc_p.emb.weight")
    n_rel, rel_len, head_dim = need("enc_p.encoder.attn_layers.0.emb_rel_k")
    ffn = need("enc_p.encoder.ffn_layers.0.conv_1.weight")
    resblock = "1" if "dec.resblocks.0.convs1.0.weight" in shape else "2"
    conv_names = ["convs1"] if resblock == "1" else ["convs"]
    n_ups = len(_indices(state, r"dec\.ups\.(\d+)\.weight"))
    n_kernels = len(_indices(state, r"dec\.resblocks\.(\d+)\..*weight")) // max(n_ups, 1)
    kernels, dilations = [], []
    hp_dil = _hparam(hparams, "resblock_dilation_sizes")
    for j in range(n_kernels):
        convs = _indices(state, rf"dec\.resblocks\.{j}\.{conv_names[0]}\.(\d+)\.weight")
        kernels.append(need(f"dec.resblocks.{j}.{conv_names[0]}.0.weight")[2])
        found = [attr(f"dec.resblocks.{j}.{conv_names[0]}.{i}", "dilations") for i in convs]
        dilations.append(tuple(d[0] for d in found) if all(found) else tuple(hp_dil[j]))
    hp_rates = _hparam(hparams, "upsample_rates")
    rates = []
    for i in range(n_ups):
        stride = attr(f"dec.ups.{i}", "strides")
        rates.append(stride[0] if stride else int(hp_rates[i]))
    flow_layers = _indices(state, r"flow\.flows\.0\.enc\.in_layers\.(\d+)\.weight")
    flow_dil = attr("flow.flows.0.enc.in_layers.1", "dilations") if len(flow_layers) > 1 else None
    use_sdp = "dp.flows.0.m" in shape
    dp_key = "dp.pre.weight" if use_sdp else "dp.conv_1.weight"
    dp_kernel = need("dp.convs.convs_sep.0.weight")[2] if use_sdp else need("dp.conv_1.weight")[2]
    sdp_flows = _indices(state, r"dp\.flows\.(\d+)\.pre\.weight")
    n_speakers, gin = need("emb_g.weight") if "emb_g.weight" in shape else (1, 0)
    return VitsArchitecture(
        n_vocab=n_vocab,
        hidden_channels=hidden,
        inter_channels=need("enc_p.proj.weight")[0] // 2,
        filter_channels=ffn[0],
        n_heads=hidden // head_dim,
        n_layers=len(_indices(state, r"enc_p\.encoder\.attn_layers\.(\d+)\.conv_q\.weight")),
        kernel_size=ffn[2],
        window_size=(rel_len - 1) // 2,
        heads_share=n_rel == 1,
        resblock=resblock,
        resblock_kernel_sizes=tuple(kernels),
        resblock_dilation_sizes=tuple(dilations),
        upsample_rates=tuple(rates),
        upsample_kernel_sizes=tuple(need(f"dec.ups.{i}.weight")[2] for i in range(n_ups)),
        upsample_initial_channel=need("dec.conv_pre.weight")[0],
        flow_n_flows=len(_indices(state, r"flow\.flows\.(\d+)\.pre\.weight")),
        flow_hidden_channels=need("flow.flows.0.pre.weight")[0],
        flow_kernel_size=need("flow.flows.0.enc.in_layers.0.weight")[2],
        # Upstream fixes the flow's dilation rate at 1; ONNX graphs say so explicitly.
        flow_dilation_rate=flow_dil[0] if flow_dil else 1,
        flow_n_layers=len(flow_layers),
        use_sdp=use_sdp,
        dp_filter_channels=need(dp_key)[0],
        dp_kernel_size=dp_kernel,
        sdp_n_flows=(max(sdp_flows) + 1) // 2 if use_sdp else 4,
        sdp_num_bins=(need(f"dp.flows.{max(sdp_flows)}.proj.weight")[0] + 1) // 3 if use_sdp else 10,
        n_speakers=n_speakers,
        gin_channels=gin,
    )
