"""The Triton rotary embedding under the interpreter against its torch twin, and the twin
against transformers' ``apply_rotary_pos_emb``.

The interpreter rounds float32 to bfloat16 by truncation where the GPU rounds to nearest,
so bfloat16 results may differ from the twin's by an ulp per rounding; float16 and float32
are tight.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from vla_sched.kernels.rotary import rotary_embedding, rotary_embedding_torch, run_rotary_embedding
from vla_sched.model.config.architecture import RopeSpec
from vla_sched.model.layers.rope import rope_cos_sin, rope_inv_freq

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _tables(positions: list[int], head_dim: int, dtype: torch.dtype):
    """``cos``, ``sin`` and ``signed_sin``, each [T, head_dim], as the decoder builds them."""
    inv_freq = rope_inv_freq(RopeSpec(theta=10000.0), head_dim)
    cos, sin = rope_cos_sin(torch.tensor(positions), inv_freq, dtype)
    half = head_dim // 2
    return cos, sin, torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)


def _qkv(num_tokens: int, num_heads: int, head_dim: int, dtype: torch.dtype, seed: int):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((num_tokens, num_heads, head_dim), generator=generator).to(dtype)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize(
    'num_q_heads,num_kv_heads,head_dim', [(4, 2, 24), (3, 3, 128)], ids=['gqa-d24', 'mha-d128']
)
def test_rotary_kernel_matches_its_twin_on_a_merged_qkv_and_leaves_v_alone(
    dtype, num_q_heads, num_kv_heads, head_dim
):
    num_qk = num_q_heads + num_kv_heads
    qkv = _qkv(3, num_qk + num_kv_heads, head_dim, dtype, seed=head_dim)
    cos, _, signed_sin = _tables([0, 7, 300], head_dim, dtype)
    ours, expected = qkv.clone(), qkv.clone()
    rotary_embedding(qk=ours[:, :num_qk], cos=cos, signed_sin=signed_sin)
    rotary_embedding_torch(qk=expected[:, :num_qk], cos=cos, signed_sin=signed_sin)
    if dtype == torch.bfloat16:  # an ulp of truncation in the interpreter, see above
        torch.testing.assert_close(ours, expected, rtol=2**-6, atol=2**-4)
    else:
        torch.testing.assert_close(ours, expected)
    assert torch.equal(ours[:, num_qk:], qkv[:, num_qk:])
    assert not torch.equal(ours[1:, :num_qk], qkv[1:, :num_qk])  # position 0 is no rotation


@pytest.mark.parametrize('dtype', DTYPES)
def test_rotary_twin_is_transformers_apply_rotary_pos_emb(dtype):
    num_tokens, head_dim = 3, 24
    qkv = _qkv(num_tokens, 6, head_dim, dtype, seed=5)
    cos, sin, signed_sin = _tables([2, 9, 41], head_dim, dtype)
    q, k = qkv[:, :4], qkv[:, 4:]
    # transformers' layout: [batch, heads, tokens, head_dim], tables [batch, tokens, head_dim].
    expected_q, expected_k = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None]
    )
    rotary_embedding_torch(qk=qkv, cos=cos, signed_sin=signed_sin)
    torch.testing.assert_close(qkv[:, :4], expected_q[0].transpose(0, 1), rtol=0, atol=0)
    torch.testing.assert_close(qkv[:, 4:], expected_k[0].transpose(0, 1), rtol=0, atol=0)


def test_rotary_of_no_tokens_writes_nothing():
    # No rows of a larger buffer: a launch over zero tokens must leave every row as it was.
    storage = _qkv(4, 2, 8, torch.float32, seed=7)
    before = storage.clone()
    empty = storage[2:2]
    run_rotary_embedding(
        qk=empty, cos=torch.empty((0, 8)), signed_sin=torch.empty((0, 8)), backend='triton'
    )
    assert empty.shape == (0, 2, 8)
    torch.testing.assert_close(storage, before, rtol=0, atol=0)


def test_rotary_rejects_tables_of_another_length():
    qk = _qkv(3, 2, 8, torch.float32, seed=6)
    cos, _, signed_sin = _tables([0, 1], 8, torch.float32)
    with pytest.raises(ValueError, match='cos must have shape'):
        run_rotary_embedding(qk=qk, cos=cos, signed_sin=signed_sin)
