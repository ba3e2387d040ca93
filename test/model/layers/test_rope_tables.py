"""RoPE tables built once and looked up per step rotate exactly as the rotate-half formula."""

from __future__ import annotations

import torch

from vla_sched.model.config.architecture import RopeSpec
from vla_sched.model.layers.rope import apply_rope, rope_cos_sin, rope_inv_freq, rope_tables


def _rotate_half_formula(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def test_rotation_by_tables_equals_the_rotate_half_formula():
    inv_freq = rope_inv_freq(RopeSpec(theta=500000.0, rope_type='llama3', factor=8.0), 16)
    positions = torch.tensor([0, 1, 7, 300, 9000])
    x = torch.randn((5, 3, 16), generator=torch.Generator().manual_seed(0))
    cos, sin = rope_cos_sin(positions, inv_freq, torch.float32)
    expected = _rotate_half_formula(x, cos, sin)
    assert torch.equal(apply_rope(x, rope_tables(positions, inv_freq, torch.float32)), expected)


def test_looked_up_tables_equal_tables_built_for_the_positions():
    inv_freq = rope_inv_freq(RopeSpec(), 64)
    table = rope_tables(torch.arange(512), inv_freq, torch.float32)
    positions = torch.tensor([511, 3, 3, 0, 100])
    built = rope_tables(positions, inv_freq, torch.float32)
    looked_up = table.at(positions)
    torch.testing.assert_close(looked_up.cos, built.cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(looked_up.signed_sin, built.signed_sin, rtol=0, atol=1e-6)
    assert looked_up.cos.shape == (5, 64)
