"""The Triton KV store under the interpreter: exact copies into the named slots only."""

from __future__ import annotations

import pytest
import torch

from vla_sched.kernels.store_kv import run_store_kv, store_kv, store_kv_torch


def _fresh_caches(num_slots: int, num_kv_heads: int, head_dim: int, v_head_dim: int):
    k_cache = torch.full((num_slots, num_kv_heads, head_dim), float('nan'))
    v_cache = torch.full((num_slots, num_kv_heads, v_head_dim), float('nan'))
    return k_cache, v_cache


@pytest.mark.parametrize('head_dim,v_head_dim', [(64, 64), (80, 80), (96, 128)])
@pytest.mark.parametrize('num_kv_heads', [1, 3])
@pytest.mark.parametrize('location_dtype', [torch.int64, torch.int32])
def test_store_kv_kernel_writes_exactly_what_the_reference_writes(
    head_dim, v_head_dim, num_kv_heads, location_dtype
):
    generator = torch.Generator().manual_seed(head_dim + v_head_dim + num_kv_heads)
    num_tokens, num_slots = 7, 23
    k = torch.randn((num_tokens, num_kv_heads, head_dim), generator=generator)
    v = torch.randn((num_tokens, num_kv_heads, v_head_dim), generator=generator)
    locations = torch.randperm(num_slots, generator=generator)[:num_tokens].to(location_dtype)
    k_kernel, v_kernel = _fresh_caches(num_slots, num_kv_heads, head_dim, v_head_dim)
    k_ref, v_ref = _fresh_caches(num_slots, num_kv_heads, head_dim, v_head_dim)
    store_kv(k=k, v=v, k_cache=k_kernel, v_cache=v_kernel, out_cache_loc=locations, debug=True)
    store_kv_torch(k=k, v=v, k_cache=k_ref, v_cache=v_ref, out_cache_loc=locations)
    assert torch.allclose(k_kernel, k_ref, equal_nan=True, rtol=0, atol=0)
    assert torch.allclose(v_kernel, v_ref, equal_nan=True, rtol=0, atol=0)
    written = torch.zeros(num_slots, dtype=torch.bool)
    written[locations.long()] = True
    assert not k_kernel[written].isnan().any()
    assert k_kernel[~written].isnan().all()


def test_store_kv_kernel_reads_strided_slices_of_a_fused_projection():
    generator = torch.Generator().manual_seed(1)
    num_tokens, num_q_heads, num_kv_heads, head_dim = 5, 4, 2, 80
    qkv = torch.randn((num_tokens, num_q_heads + 2 * num_kv_heads, head_dim), generator=generator)
    k = qkv[:, num_q_heads : num_q_heads + num_kv_heads]
    v = qkv[:, num_q_heads + num_kv_heads :]
    assert not k.is_contiguous()
    locations = torch.tensor([11, 0, 3, 8, 6])
    k_cache, v_cache = _fresh_caches(12, num_kv_heads, head_dim, head_dim)
    run_store_kv(
        k=k, v=v, k_cache=k_cache, v_cache=v_cache, out_cache_loc=locations, backend='triton'
    )
    assert torch.equal(k_cache[locations], k)
    assert torch.equal(v_cache[locations], v)


def test_store_kv_kernel_copies_bf16_bits_unchanged():
    generator = torch.Generator().manual_seed(2)
    k = torch.randn((4, 2, 64), generator=generator).to(torch.bfloat16)
    v = torch.randn((4, 2, 64), generator=generator).to(torch.bfloat16)
    k_cache = torch.zeros((9, 2, 64), dtype=torch.bfloat16)
    v_cache = torch.zeros((9, 2, 64), dtype=torch.bfloat16)
    locations = torch.tensor([8, 2, 5, 0])
    store_kv(k=k, v=v, k_cache=k_cache, v_cache=v_cache, out_cache_loc=locations)
    assert torch.equal(k_cache[locations], k)
    assert torch.equal(v_cache[locations], v)


def test_store_kv_with_no_tokens_leaves_the_cache_alone():
    k_cache, v_cache = _fresh_caches(4, 1, 64, 64)
    empty = torch.empty((0, 1, 64))
    store_kv(
        k=empty,
        v=empty,
        k_cache=k_cache,
        v_cache=v_cache,
        out_cache_loc=torch.empty(0, dtype=torch.int64),
    )
    assert k_cache.isnan().all()
