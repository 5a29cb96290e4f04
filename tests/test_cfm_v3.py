"""CFM/DiT of v3: LoRA merge against the unmerged LoRA forward, solver step, rotary layout."""

from __future__ import annotations

import io

import pytest
import torch

from voicehub.models.gpt_sovits.cfm import euler_step, solve
from voicehub.models.gpt_sovits.cfm.dit import apply_rope_first_head
from voicehub.models.gpt_sovits.sovits import load_sovits_v3, make_sovits_checkpoint
from voicehub.models.gpt_sovits.sovits.checkpoint import LORA_PREFIX

RANK = 4


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cfm")
    base = make_sovits_checkpoint(d / "s2Gv3.pth", "tiny", seed=0)
    lora = make_sovits_checkpoint(d / "voice_e8_s100_l4.pth", "tiny", seed=5, lora_rank=RANK)
    return base, lora


def _lora_weights(path) -> dict[str, torch.Tensor]:
    data = bytearray(path.read_bytes())
    data[:2] = b"PK"  # undo the version header
    return torch.load(io.BytesIO(bytes(data)), weights_only=True)["weight"]


def _inputs(model, n: int = 37, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = model.arch
    x = torch.randn(1, n, a.mel_dim, generator=g)
    cond = torch.randn(1, n, a.mel_dim, generator=g)
    mu = torch.randn(1, n, a.inter2, generator=g)
    return x, cond, mu


def _velocity(model, x, cond, mu):
    est = model.cfm.estimator
    text_emb, d_emb = est.condition(mu, torch.full((1,), 0.25))
    return est(x, cond, text_emb, torch.full((1,), 0.5), d_emb)


def test_merged_lora_equals_unmerged_lora_forward(files):
    base_path, lora_path = files
    merged = load_sovits_v3(lora_path, base_path=base_path)
    unmerged = load_sovits_v3(base_path)
    lora = _lora_weights(lora_path)
    # Outside the CFM the file holds only layers LoRA training leaves trainable (and buffers);
    # they do not enter the DiT, so the base model stands in for them here.
    outside = {name.split(".")[0] for name in lora if not name.startswith(LORA_PREFIX)}
    assert outside == {"ref_enc", "bridge", "wns1", "linear_mel", "quantizer"}
    hooks = []
    # Run each target Linear as peft does before merging: W x + b + B (A x) * alpha / r.
    for name, module in unmerged.cfm.named_modules():
        key = LORA_PREFIX + name + ".lora_A.default.weight"
        if key in lora:
            a, b = lora[key].float(), lora[key.replace("lora_A", "lora_B")].float()
            hooks.append(module.register_forward_hook(lambda m, i, o, a=a, b=b: o + (i[0] @ a.t()) @ b.t()))
    assert len(hooks) == 4 * unmerged.arch.dit_depth
    x, cond, mu = _inputs(merged)
    with torch.no_grad():
        v_merged = _velocity(merged, x, cond, mu)
        v_unmerged = _velocity(unmerged, x, cond, mu)
        v_base = _velocity(load_sovits_v3(base_path), x, cond, mu)
    err = (v_merged - v_unmerged).norm() / v_unmerged.norm()
    assert err < 1e-5, f"merged vs unmerged LoRA rel. L2 {err:.2e}"
    # The LoRA must change the output for this comparison to mean anything.
    assert (v_base - v_unmerged).norm() / v_unmerged.norm() > 1e-3


def test_lora_file_overlays_its_trained_sovits_layers(files):
    base_path, lora_path = files
    merged = load_sovits_v3(lora_path, base_path=base_path)
    lora = _lora_weights(lora_path)
    assert torch.equal(merged.ref_enc.fc.fc.weight, lora["ref_enc.fc.fc.weight"].float())
    base = load_sovits_v3(base_path)
    assert torch.equal(
        merged.enc_p.text_embedding.weight, base.enc_p.text_embedding.weight
    )  # frozen: from base


def test_solve_is_a_loop_of_capturable_euler_steps(files):
    model = load_sovits_v3(files[0])
    est = model.cfm.estimator
    _, _, mu = _inputs(model, n=30)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randn(1, model.arch.mel_dim, 12, generator=g)
    noise = torch.randn(1, model.arch.mel_dim, 30, generator=g)
    with torch.no_grad():
        out = solve(est, mu, prompt, noise, 4)
        # The same integration written as a runtime would capture it: fixed tensors, one step function.
        keep = torch.ones(1, 1, 30)
        keep[..., :12] = 0
        x = noise * keep
        prompt_x = torch.zeros_like(noise)
        prompt_x[..., :12] = prompt
        text_emb, d_emb = est.condition(mu, torch.full((1,), 0.25))
        for i in range(4):
            x = euler_step(
                est, x, prompt_x, text_emb, d_emb, torch.full((1,), i * 0.25), torch.tensor(0.25), keep
            )
    assert torch.allclose(out, x, rtol=0, atol=1e-6)
    assert torch.count_nonzero(out[..., :12]) == 0 and out[..., 12:].std() > 0
    with pytest.raises(ValueError, match="sample_steps"):
        solve(est, mu, prompt, noise, 0)


def test_rope_rotates_only_the_first_head_in_interleaved_pairs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 64, generator=g)
    angles = torch.rand(5, 8, generator=g).repeat_interleave(2, dim=-1)  # dim_head 16
    y = apply_rope_first_head(x, angles.cos(), angles.sin())
    assert torch.equal(y[..., 16:], x[..., 16:])
    pair_norm = lambda t: t[..., :16].unflatten(-1, (8, 2)).norm(dim=-1)  # noqa: E731
    assert torch.allclose(pair_norm(y), pair_norm(x), atol=1e-6)
    # pair (x0, x1) rotated by theta: (x0 cos - x1 sin, x1 cos + x0 sin)
    c, s = angles[:, 0].cos(), angles[:, 0].sin()
    assert torch.allclose(y[..., 0], x[..., 0] * c - x[..., 1] * s, atol=1e-6)
    assert torch.allclose(y[..., 1], x[..., 1] * c + x[..., 0] * s, atol=1e-6)
