"""The DiT block's kernel ops (runtime/kernels/dit_block*.py): each Triton kernel against its torch
definition (Triton's interpreter on the CPU), the whole DiT forward with the registry's kernel sets
against its native forward, q/k/v packing, and the kernel-backend transform's routing and undo.

Shapes are small and odd (D = 48, not a power of two; 7-33 frames) so masked lanes and partial blocks
are exercised. Modulation tensors are chunks of one [B, 6D] adaLN output, as the DiT passes them.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import test_kernels_triton
import torch
import torch.nn.functional as F
from test_kernels import rel_l2
from test_kernels_triton import FP16_TOL, FP32_TOL, half, poisoned

from voicehub.models.gpt_sovits.acoustic_graphs import CfmGraphs
from voicehub.models.gpt_sovits.cfm.dit import NATIVE_KERNELS, DiT, DiTKernels
from voicehub.models.gpt_sovits.optimization import DIT_OPS, KernelBackendTransform, dit_kernels
from voicehub.optimization.config import KernelBackend
from voicehub.runtime import cuda_graphs
from voicehub.runtime.kernels import registry
from voicehub.runtime.kernels.registry import (
    DIT_ATTENTION_BIAS,
    DIT_DEPTHWISE_CONV,
    DIT_GATED_RESIDUAL,
    DIT_MODULATED_NORM,
    DIT_RESIDUAL_NORM,
    DIT_ROPE,
)

EPS = 1e-6
triton_kernel = test_kernels_triton.triton_kernel  # the interpreter fixture, shared
DIT_ARGS = dict(dim=64, depth=2, heads=4, dim_head=16, ff_mult=2, mel_dim=20, text_dim=24, n_conv_layers=1)


def _block_inputs(b: int = 2, n: int = 7, d: int = 48, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(b, n, d, generator=g), torch.randn(b, n, d, generator=g)
    shift, scale, gate = (c[:, None] for c in torch.randn(b, 6 * d, generator=g).chunk(6, dim=1)[:3])
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[-1, n - 3 :] = False
    return x, y, shift, scale, gate, mask


def test_modulated_norm_triton(triton_kernel):
    kernel, ref = triton_kernel(DIT_MODULATED_NORM), registry.reference(DIT_MODULATED_NORM)
    x, _, shift, scale, _, _ = _block_inputs()
    out = poisoned(x.shape, torch.float32)
    assert kernel(x, shift, scale, EPS, out=out) is out
    assert rel_l2(out, ref(x, shift, scale, EPS)) <= FP32_TOL / 100
    got16 = kernel(*half((x, shift, scale)), EPS)
    assert got16.dtype == torch.float16 and rel_l2(got16, ref(x, shift, scale, EPS)) <= FP16_TOL


@pytest.mark.parametrize("is_masked", [False, True], ids=["all_valid", "padded"])
def test_residual_norm_triton(triton_kernel, is_masked: bool):
    kernel, ref = triton_kernel(DIT_RESIDUAL_NORM), registry.reference(DIT_RESIDUAL_NORM)
    x, y, shift, scale, gate, mask = _block_inputs(seed=1)
    mask = mask if is_masked else None
    if is_masked:
        y[~mask] = float("inf")  # a padded frame's attention output never reaches the residual
    out = (poisoned(x.shape, torch.float32), poisoned(x.shape, torch.float32))
    res, norm = kernel(x, y, gate, mask, shift, scale, EPS, out=out)
    want_res, want_norm = ref(x, y, gate, mask, shift, scale, EPS)
    assert res is out[0] and norm is out[1]
    assert torch.equal(res, want_res)  # the residual stream: the same float ops, bit for bit
    assert rel_l2(norm, want_norm) <= FP32_TOL / 100
    args16 = half((x, y, gate))
    res16, norm16 = kernel(*args16, mask, *half((shift, scale)), EPS)
    want16 = ref(*args16, mask, *half((shift, scale)), EPS)
    assert torch.equal(res16, want16[0])  # fp16 residual rounded where torch rounds it
    assert rel_l2(norm16, want_norm) <= FP16_TOL


def test_gated_residual_triton(triton_kernel):
    kernel, ref = triton_kernel(DIT_GATED_RESIDUAL), registry.reference(DIT_GATED_RESIDUAL)
    x, y, _, _, gate, _ = _block_inputs(seed=2)
    out = poisoned(x.shape, torch.float32)
    assert kernel(x, y, gate, out=out) is out
    assert torch.equal(out, ref(x, y, gate))
    assert torch.equal(kernel(*half((x, y, gate))), ref(*half((x, y, gate))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope_triton_rotates_packed_qkv_in_place(triton_kernel, dtype):
    kernel, ref = triton_kernel(DIT_ROPE), registry.reference(DIT_ROPE)
    b, n, c, rot = 2, 33, 48, 16
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(b, n, 3 * c, generator=g).to(dtype)  # q, k as strided views, as the packed GEMM gives
    angles = torch.randn(n, rot // 2, generator=g).repeat_interleave(2, dim=-1)
    cos, sin = angles.cos(), angles.sin()
    q, k, v = qkv.split(c, dim=-1)
    want_q, want_k = ref(q.float(), k.float(), cos, sin)  # float32 inputs: the fp16 case's exact answer
    v_before = v.clone()
    got_q, got_k = kernel(q, k, cos, sin)
    assert got_q.data_ptr() == qkv.data_ptr() and got_k.data_ptr() == q.data_ptr() + c * q.element_size()
    tol = FP32_TOL / 100 if dtype == torch.float32 else FP16_TOL
    assert rel_l2(got_q, want_q) <= tol and rel_l2(got_k, want_k) <= tol
    assert torch.equal(v, v_before)  # v and every channel past the first head untouched
    if dtype == torch.float32:
        assert torch.equal(got_q[..., rot:], want_q[..., rot:])


def test_rope_op_for_compile_writes_new_tensors(triton_kernel):
    """The rotation as torch.compile calls it (the custom op voicehub::dit_rope) gives new tensors, q and
    k untouched, bit for bit the in-place kernel's result."""
    kernel = triton_kernel(DIT_ROPE)
    b, n, c, rot = 2, 21, 48, 16
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(b, n, 3 * c, generator=g)
    angles = torch.randn(n, rot // 2, generator=g).repeat_interleave(2, dim=-1)
    cos, sin = angles.cos(), angles.sin()
    before = qkv.clone()
    got_q, got_k = torch.ops.voicehub.dit_rope(*qkv.split(c, dim=-1)[:2], cos, sin)
    assert torch.equal(qkv, before)  # nothing written in place
    want_q, want_k = kernel(*qkv.split(c, dim=-1)[:2], cos, sin)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


def test_rope_reference_is_the_native_rotation():
    # interleaved pairs (x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin) on the first `rot` channels only
    x = torch.randn(1, 3, 8)
    angles = torch.randn(3, 2).repeat_interleave(2, dim=-1)
    q, _ = registry.reference(DIT_ROPE)(x, x, angles.cos(), angles.sin())
    x0, x1, a = x[..., 0:4:2], x[..., 1:4:2], angles[..., 0::2]
    assert torch.allclose(q[..., 0:4:2], x0 * a.cos() - x1 * a.sin())
    assert torch.allclose(q[..., 1:4:2], x1 * a.cos() + x0 * a.sin())
    assert torch.equal(q[..., 4:], x[..., 4:])


def test_attention_bias_gives_sdpa_the_boolean_masks_result():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 4, 9, 16, generator=g) for _ in range(3))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 5:] = False
    bias = registry.reference(DIT_ATTENTION_BIAS)(mask, q.dtype)
    assert bias.shape == (2, 1, 1, 9) and bias.dtype == q.dtype
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :].expand(2, 4, 9, 9))
    assert torch.allclose(F.scaled_dot_product_attention(q, k, v, attn_mask=bias), want, rtol=0, atol=1e-6)
    assert registry.get(DIT_ATTENTION_BIAS, "triton") is registry.get(DIT_ATTENTION_BIAS, "torch")


@pytest.mark.parametrize("layout", ["transposed", "contiguous"])
def test_depthwise_conv_is_the_blocks_conv1d(layout: str):
    g = torch.Generator().manual_seed(8)
    conv = torch.nn.Conv1d(24, 24, kernel_size=7, padding=3, groups=24)
    x = torch.randn(2, 13, 24, generator=g).transpose(1, 2)  # [B, D, N], as the block passes it
    x = x.contiguous() if layout == "contiguous" else x
    ref = registry.reference(DIT_DEPTHWISE_CONV)
    with torch.no_grad():
        want = conv(x)
        assert torch.equal(ref(x, conv.weight, conv.bias, 3), want)
        got = registry.get(DIT_DEPTHWISE_CONV, "torch")(x, conv.weight, conv.bias, 3)
    assert got.shape == want.shape == (2, 24, 13) and rel_l2(got, want) <= FP32_TOL
    assert registry.get(DIT_DEPTHWISE_CONV, "triton") is registry.get(DIT_DEPTHWISE_CONV, "torch")


def _dit(seed: int = 0) -> DiT:
    torch.manual_seed(seed)
    dit = DiT(**DIT_ARGS).eval()
    for block in dit.transformer_blocks:  # a trained model's gates are far from 0: so are these
        torch.nn.init.normal_(block.attn_norm.linear.weight, std=0.3)
    return dit


def _forward(dit: DiT, mask: torch.Tensor | None, seed: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    b, n = 2, 19
    x, cond = torch.randn(b, n, 20, generator=g), torch.randn(b, n, 20, generator=g)
    mu, t, d = torch.randn(b, n, 24, generator=g), torch.rand(b, generator=g), torch.rand(b, generator=g)
    with torch.inference_mode():
        text_emb, d_emb = dit.condition(mu, d, mask)
        return dit(x, cond, text_emb, t, d_emb, mask)


def _kernel_set(backend: str) -> DiTKernels:
    return dit_kernels({op: registry.get(op, backend) for op in DIT_OPS})


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("is_masked", [False, True], ids=["all_valid", "padded"])
def test_dit_forward_with_kernels_equals_native(triton_kernel, backend: str, is_masked: bool):
    dit = _dit()
    mask = None
    if is_masked:
        mask = torch.ones(2, 19, dtype=torch.bool)
        mask[1, 11:] = False
    native = _forward(dit, mask)
    state = {k: v.clone() for k, v in dit.state_dict().items()}
    assert dit.set_kernels(_kernel_set(backend)) is NATIVE_KERNELS
    fused = _forward(dit, mask)
    valid = slice(None) if mask is None else mask
    assert rel_l2(fused[valid], native[valid]) <= FP32_TOL
    dit.set_kernels(NATIVE_KERNELS)
    assert torch.equal(_forward(dit, mask), native)  # unpacked again: the native path bit for bit
    assert dit.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in dit.state_dict().items())


def test_dit_blocks_with_triton_kernels_compile_whole(triton_kernel):
    """torch.compile (aot_eager: AOT autograd and functionalization, as inductor runs them) of the DiT
    blocks with the triton set: each op is one opaque custom op, so a block is one graph with no break
    (torch 2.11's dynamo broke at each kernel launch and failed on a symbolic launch width, on an H100),
    and the blocks' output equals the eager triton set's (masked and not: two shapes, one graph each)."""
    from torch._dynamo.utils import counters

    dit = _dit()
    dit.set_kernels(_kernel_set("triton"))
    mask = torch.ones(2, 19, dtype=torch.bool)
    mask[1, 11:] = False
    eager = [_forward(dit, None), _forward(dit, mask)]
    torch._dynamo.reset()
    counters.clear()
    blocks = list(dit.transformer_blocks)
    for block in blocks:
        block.forward = torch.compile(block.forward, backend="aot_eager", dynamic=True)
    try:
        compiled = [_forward(dit, None), _forward(dit, mask)]
    finally:
        for block in blocks:
            del block.forward
        torch._dynamo.reset()  # blocks share DiTBlock.forward's code: no cached graph for later tests
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] >= 1
    for got, want in zip(compiled, eager):
        assert rel_l2(got, want) <= FP32_TOL / 100


def test_qkv_packing_keeps_names_and_values_and_shares_storage():
    dit = _dit()
    attn = dit.transformer_blocks[0].attn
    before = {k: v.clone() for k, v in dit.state_dict().items()}
    dit.set_kernels(DiTKernels(is_qkv_packed=True))
    weight, bias = attn.qkv
    assert weight.shape == (3 * attn.to_q.out_features, attn.to_q.in_features)
    projs = (attn.to_q, attn.to_k, attn.to_v)
    assert [p.weight.data_ptr() for p in projs] == [weight[i * 64].data_ptr() for i in range(3)]
    assert all(torch.equal(v, before[k]) for k, v in dit.state_dict().items())
    with torch.no_grad():
        attn.to_k.weight.add_(1.0)  # an in-place weight update reaches the packed GEMM
    assert torch.equal(weight[64:128], before["transformer_blocks.0.attn.to_k.weight"] + 1.0)
    dit.set_kernels(NATIVE_KERNELS)
    assert attn.qkv is None and len({p.weight.data_ptr() for p in projs}) == 3


def test_replaced_weights_after_packing_fail_loudly():
    dit = _dit()
    dit.set_kernels(DiTKernels(is_qkv_packed=True))
    dit.double()  # new storage for every parameter: the packed buffer is stale
    with pytest.raises(RuntimeError, match="set_kernels again"):
        _forward(dit.float(), None)


@pytest.fixture
def model():
    """What KernelBackendTransform reaches of a GptSovitsModel: the vocoder, the T2S decoder, the DiT."""
    vocoder = SimpleNamespace(kernel=None)

    def set_activation_kernel(kernel):
        previous, vocoder.kernel = vocoder.kernel, kernel
        return previous

    vocoder.set_activation_kernel = set_activation_kernel
    sovits = SimpleNamespace(cfm=SimpleNamespace(estimator=_dit()))
    pipeline = SimpleNamespace(vocoder=vocoder, t2s_decoder=None, sovits=sovits)
    return SimpleNamespace(pipeline=pipeline, device=torch.device("cpu"))


@pytest.mark.parametrize("backend", [KernelBackend.TORCH, KernelBackend.TRITON])
def test_kernel_backend_transform_routes_the_dit_and_undoes(model, triton_kernel, backend, monkeypatch):
    # Other families' kernels are stubbed: importing them here, interpreted, would leave their modules
    # in a state their own test modules do not expect. The DiT's are the real registry functions.
    stubs = {op: (lambda *args: None) for op in registry.ops()}
    resolve = registry.resolve
    monkeypatch.setattr(
        registry, "resolve", lambda op, b, dev: resolve(op, b, dev) if op in DIT_OPS else stubs[op]
    )
    est = model.pipeline.sovits.cfm.estimator
    transform = KernelBackendTransform(model, backend)
    assert set(DIT_OPS) <= set(transform.ops)
    transform.validate()  # triton: the interpreter fixture makes every op available on the CPU
    undo = transform.apply()
    try:
        assert est.kernels == _kernel_set(backend.value)
        assert all(
            block.kernels is est.kernels and block.attn.qkv is not None for block in est.transformer_blocks
        )
        assert all(block.kernels is est.kernels for block in est.text_embed.text_blocks)
        assert est.kernels.depthwise_conv is registry.get(DIT_DEPTHWISE_CONV, backend.value)
        assert model.pipeline.vocoder.kernel is stubs[registry.ANTI_ALIAS_SNAKE]
    finally:
        undo()
    assert model.pipeline.vocoder.kernel is None
    assert est.kernels is NATIVE_KERNELS
    assert all(block.kernels is NATIVE_KERNELS and block.attn.qkv is None for block in est.transformer_blocks)
    assert all(block.kernels is NATIVE_KERNELS for block in est.text_embed.text_blocks)


def test_cfm_graphs_are_dropped_when_the_dit_kernels_change(model, monkeypatch):
    init = cuda_graphs.BucketedGraphRunner.__init__

    def on_cuda(self, step, buckets, preset, device, **kw):  # runners only: nothing is captured here
        init(self, step, buckets, preset, torch.device("cuda"), **kw)

    monkeypatch.setattr(cuda_graphs.BucketedGraphRunner, "__init__", on_cuda)
    est = model.pipeline.sovits.cfm.estimator
    graphs = CfmGraphs(est, torch.device("cuda"))
    first = graphs.runner(4)
    assert graphs.runner(4) is first
    previous = est.set_kernels(_kernel_set("torch"))
    try:
        assert graphs.runner(4) is not first
    finally:
        est.set_kernels(previous)
    # torch -> native -> torch with no CFM call between: the same kernel set as captured, but q/k/v
    # were packed into new storage, so graphs of the old storage must not replay
    est.set_kernels(_kernel_set("torch"))
    try:
        packed = graphs.runner(4)
        est.set_kernels(previous)
        est.set_kernels(_kernel_set("torch"))
        assert graphs.runner(4) is not packed
    finally:
        est.set_kernels(previous)


def _cuda_triton() -> DiTKernels:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return dit_kernels({op: registry.resolve(op, "triton", "cuda") for op in DIT_OPS})


@pytest.mark.gpu
def test_cuda_ops_fp16_on_realistic_shapes():
    _cuda_triton()
    x, y, shift, scale, gate, mask = (t.cuda() for t in _block_inputs(b=2, n=640, d=1024, seed=6))
    mask[1, 500:] = False
    get = lambda op: (registry.get(op, "triton"), registry.reference(op))  # noqa: E731
    kernel, ref = get(DIT_MODULATED_NORM)
    assert rel_l2(kernel(*half((x, shift, scale)), EPS), ref(x, shift, scale, EPS)) <= FP16_TOL
    kernel, ref = get(DIT_RESIDUAL_NORM)
    got, want = (
        kernel(*half((x, y, gate)), mask, *half((shift, scale)), EPS),
        ref(x, y, gate, mask, shift, scale, EPS),
    )
    assert rel_l2(got[0], want[0]) <= FP16_TOL and rel_l2(got[1], want[1]) <= FP16_TOL
    kernel, ref = get(DIT_GATED_RESIDUAL)
    assert rel_l2(kernel(*half((x, y, gate))), ref(x, y, gate)) <= FP16_TOL
    kernel, ref = get(DIT_ROPE)
    qkv = torch.randn(2, 640, 3 * 1024, device="cuda")
    angles = torch.randn(640, 32, device="cuda").repeat_interleave(2, dim=-1)
    want_q, want_k = ref(qkv[..., :1024], qkv[..., 1024:2048], angles.cos(), angles.sin())
    q, k, _ = qkv.half().split(1024, dim=-1)
    got_q, got_k = kernel(q, k, angles.cos(), angles.sin())
    assert rel_l2(got_q, want_q) <= FP16_TOL and rel_l2(got_k, want_k) <= FP16_TOL
    kernel, ref = get(DIT_DEPTHWISE_CONV)
    conv = torch.nn.Conv1d(512, 512, 7, padding=3, groups=512, device="cuda")
    text = torch.randn(2, 640, 512, device="cuda").transpose(1, 2)
    with torch.no_grad():
        want = ref(text, conv.weight, conv.bias, 3)
        got = kernel(*half((text, conv.weight, conv.bias)), 3)
    assert rel_l2(got, want) <= FP16_TOL


@pytest.mark.gpu
def test_cuda_full_size_dit_with_triton_kernels_fp16_and_graphed():
    kernels = _cuda_triton()
    torch.manual_seed(0)
    with torch.device("cuda"):  # random init of ~320 M parameters: on the GPU, not the CPU
        full = dict(dim=1024, depth=22, heads=16, dim_head=64, ff_mult=2, mel_dim=100, text_dim=512)
        dit = DiT(**full, n_conv_layers=4)
        for block in dit.transformer_blocks:
            torch.nn.init.normal_(block.attn_norm.linear.weight, std=0.02)
    dit = dit.half().eval()
    g = torch.Generator(device="cuda").manual_seed(7)
    b, n = 2, 640
    x, cond = (torch.randn(b, n, 100, device="cuda", generator=g).half() for _ in range(2))
    mu = torch.randn(b, n, 512, device="cuda", generator=g).half()
    t, d = torch.rand(b, device="cuda", generator=g).half(), torch.rand(b, device="cuda", generator=g).half()
    mask = torch.ones(b, n, dtype=torch.bool, device="cuda")
    mask[1, 500:] = False

    def forward() -> torch.Tensor:
        text_emb, d_emb = dit.condition(mu, d, mask)
        return dit(x, cond, text_emb, t, d_emb, mask)

    with torch.inference_mode():
        native = forward()
        dit.set_kernels(kernels)
        fused = forward()
        assert rel_l2(fused[mask], native[mask]) <= FP16_TOL
        out = torch.empty_like(fused)
        forward()  # warm up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out.copy_(forward())
        graph.replay()
        torch.cuda.synchronize()
        assert rel_l2(out, fused) <= 1e-5  # the graph replays the same kernels
        dit.set_kernels(NATIVE_KERNELS)
