"""The float32 'torch' backend against F.scaled_dot_product_attention on dense inputs."""

from __future__ import annotations

import pytest
import torch
from paged_kv_cases import build_paged_kv, max_rel_error
from torch.nn import functional

from vla_sched.kernels.decode_attention import decode_attention_torch, run_decode_attention
from vla_sched.kernels.extend_attention import extend_attention_torch, run_extend_attention
from vla_sched.kernels.store_kv import run_store_kv, store_kv_torch

TOLERANCE = 1e-5


def _sdpa(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask, scale):
    """Dense attention of [Lq, Hq, D] over [L, Hkv, D] with a [Lq, L] bool mask."""
    out = functional.scaled_dot_product_attention(
        query.transpose(0, 1)[None].double(),
        keys.transpose(0, 1)[None].double(),
        values.transpose(0, 1)[None].double(),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)


@pytest.mark.parametrize('num_q_heads,num_kv_heads', [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize('page_size', [1, 16])
def test_decode_torch_matches_sdpa_over_gathered_kv(num_q_heads, num_kv_heads, page_size):
    generator = torch.Generator().manual_seed(num_q_heads * 100 + num_kv_heads + page_size)
    seq_lens = [1, 17, 40]
    paged = build_paged_kv(
        seq_lens=seq_lens,
        num_kv_heads=num_kv_heads,
        head_dim=80,
        v_head_dim=64,
        page_size=page_size,
        dtype=torch.float32,
        generator=generator,
    )
    q = torch.randn((len(seq_lens), num_q_heads, 80), generator=generator)
    scale = 80**-0.5
    out = decode_attention_torch(
        q=q,
        k_cache=paged.k_cache,
        v_cache=paged.v_cache,
        req_to_token=paged.req_to_token,
        req_pool_indices=paged.req_pool_indices,
        seq_lens=torch.tensor(seq_lens),
        sm_scale=scale,
    )
    assert out.shape == (3, num_q_heads, 64)
    for i in range(len(seq_lens)):
        expected = _sdpa(q[i : i + 1], paged.dense_k[i], paged.dense_v[i], None, scale)
        assert max_rel_error(out[i : i + 1], expected) <= TOLERANCE


def _extend_dense_mask(prefix_len: int, extend_len: int, span: tuple[int, int]) -> torch.Tensor:
    mask = torch.zeros((extend_len, prefix_len + extend_len), dtype=torch.bool)
    for i in range(extend_len):
        query_pos = prefix_len + i
        for key_pos in range(prefix_len + extend_len):
            both_in_span = span[0] <= query_pos < span[1] and span[0] <= key_pos < span[1]
            mask[i, key_pos] = key_pos <= query_pos or both_in_span
    return mask


@pytest.mark.parametrize('use_spans', [False, True])
@pytest.mark.parametrize('num_q_heads,num_kv_heads', [(2, 2), (4, 1)])
def test_extend_torch_matches_sdpa_with_prefix_causal_and_image_masks(
    use_spans, num_q_heads, num_kv_heads
):
    generator = torch.Generator().manual_seed(7 + num_q_heads + 10 * use_spans)
    prefix_lens, extend_lens = [0, 5, 19], [7, 1, 12]
    spans = [(2, 6), (0, 0), (15, 27)]  # the last one starts inside the prefix
    totals = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    paged = build_paged_kv(
        seq_lens=totals,
        num_kv_heads=num_kv_heads,
        head_dim=64,
        v_head_dim=64,
        page_size=4,
        dtype=torch.float32,
        generator=generator,
    )
    q = torch.randn((sum(extend_lens), num_q_heads, 64), generator=generator)
    k = torch.cat([dk[p:] for dk, p in zip(paged.dense_k, prefix_lens, strict=True)])
    v = torch.cat([dv[p:] for dv, p in zip(paged.dense_v, prefix_lens, strict=True)])
    starts = torch.tensor([0, *torch.cumsum(torch.tensor(extend_lens), 0)[:-1].tolist()])
    out = extend_attention_torch(
        q=q,
        k=k,
        v=v,
        k_cache=paged.k_cache,
        v_cache=paged.v_cache,
        req_to_token=paged.req_to_token,
        req_pool_indices=paged.req_pool_indices,
        prefix_lens=torch.tensor(prefix_lens),
        extend_lens=torch.tensor(extend_lens),
        extend_start_loc=starts,
        sm_scale=0.125,
        image_spans=torch.tensor(spans) if use_spans else None,
    )
    for i, (prefix_len, extend_len) in enumerate(zip(prefix_lens, extend_lens, strict=True)):
        rows = slice(int(starts[i]), int(starts[i]) + extend_len)
        span = spans[i] if use_spans else (0, 0)
        mask = _extend_dense_mask(prefix_len, extend_len, span)
        expected = _sdpa(q[rows], paged.dense_k[i], paged.dense_v[i], mask, 0.125)
        assert max_rel_error(out[rows], expected) <= TOLERANCE


def test_extend_torch_image_span_changes_only_queries_inside_the_span():
    generator = torch.Generator().manual_seed(3)
    paged = build_paged_kv(
        seq_lens=[10],
        num_kv_heads=1,
        head_dim=64,
        v_head_dim=64,
        page_size=1,
        dtype=torch.float32,
        generator=generator,
    )
    q = torch.randn((6, 2, 64), generator=generator)
    inputs = dict(
        q=q,
        k=paged.dense_k[0][4:],
        v=paged.dense_v[0][4:],
        k_cache=paged.k_cache,
        v_cache=paged.v_cache,
        req_to_token=paged.req_to_token,
        req_pool_indices=paged.req_pool_indices,
        prefix_lens=torch.tensor([4]),
        extend_lens=torch.tensor([6]),
        extend_start_loc=torch.tensor([0]),
        sm_scale=0.125,
    )
    causal = extend_attention_torch(**inputs)
    spanned = extend_attention_torch(**inputs, image_spans=torch.tensor([[5, 8]]))
    # Positions 4..9; span [5, 8) covers rows 1..3. Row 3 (position 7) is last in the span.
    changed = (causal - spanned).abs().amax(dim=(1, 2)) > 1e-6
    assert changed.tolist() == [False, True, True, False, False, False]


def test_store_kv_torch_writes_each_token_to_its_slot_only():
    generator = torch.Generator().manual_seed(11)
    k_cache = torch.zeros((12, 2, 64))
    v_cache = torch.zeros((12, 2, 80))
    k = torch.randn((3, 2, 64), generator=generator)
    v = torch.randn((3, 2, 80), generator=generator)
    locations = torch.tensor([9, 0, 4])
    store_kv_torch(k=k, v=v, k_cache=k_cache, v_cache=v_cache, out_cache_loc=locations)
    assert torch.equal(k_cache[locations], k)
    assert torch.equal(v_cache[locations], v)
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[locations] = False
    assert not k_cache[untouched].any()
    assert not v_cache[untouched].any()


def test_dispatchers_on_cpu_default_to_the_torch_backend():
    generator = torch.Generator().manual_seed(5)
    paged = build_paged_kv(
        seq_lens=[3, 9],
        num_kv_heads=2,
        head_dim=64,
        v_head_dim=64,
        page_size=2,
        dtype=torch.float32,
        generator=generator,
    )
    q = torch.randn((2, 4, 64), generator=generator)
    inputs = dict(
        q=q,
        k_cache=paged.k_cache,
        v_cache=paged.v_cache,
        req_to_token=paged.req_to_token,
        req_pool_indices=paged.req_pool_indices,
        seq_lens=torch.tensor([3, 9]),
        sm_scale=0.125,
    )
    assert torch.equal(run_decode_attention(**inputs), decode_attention_torch(**inputs))
    extend_inputs = dict(
        q=q,
        k=q[:, :2],
        v=q[:, :2],
        k_cache=paged.k_cache,
        v_cache=paged.v_cache,
        req_to_token=paged.req_to_token,
        req_pool_indices=paged.req_pool_indices,
        prefix_lens=torch.tensor([2, 8]),
        extend_lens=torch.tensor([1, 1]),
        extend_start_loc=torch.tensor([0, 1]),
        sm_scale=0.125,
    )
    assert torch.equal(
        run_extend_attention(**extend_inputs), extend_attention_torch(**extend_inputs)
    )
    k_cache = torch.zeros((4, 2, 64))
    run_store_kv(
        k=q[:, :2],
        v=q[:, :2],
        k_cache=k_cache,
        v_cache=k_cache.clone(),
        out_cache_loc=torch.tensor([3, 1]),
    )
    assert torch.equal(k_cache[torch.tensor([3, 1])], q[:, :2])
    with pytest.raises(ValueError, match='backend'):
        run_decode_attention(**inputs, backend='cuda')
