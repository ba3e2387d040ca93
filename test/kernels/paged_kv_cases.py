"""Builds small paged-KV inputs for the kernel tests: dense per-request K/V scattered into
shuffled pages, a slot table with spare rows, and NaN in every slot no request owns."""

from __future__ import annotations

from dataclasses import dataclass

import torch

GARBAGE_SLOT = 1 << 30


@dataclass(frozen=True, slots=True)
class PagedKV:
    """One layer's paged KV cache holding ``len(seq_lens)`` requests, plus their dense K/V."""

    k_cache: torch.Tensor  # [num_slots, Hkv, D]; unowned slots hold NaN
    v_cache: torch.Tensor  # [num_slots, Hkv, Dv]
    req_to_token: torch.Tensor  # int32 [num_rows, max_context_len]; unused entries garbage
    req_pool_indices: torch.Tensor  # int64 [B]
    dense_k: list[torch.Tensor]  # per request [seq_len, Hkv, D]
    dense_v: list[torch.Tensor]  # per request [seq_len, Hkv, Dv]
    slots: list[torch.Tensor]  # per request int64 [seq_len]


def build_paged_kv(
    *,
    seq_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    v_head_dim: int,
    page_size: int,
    dtype: torch.dtype,
    generator: torch.Generator,
    max_context_len: int | None = None,
) -> PagedKV:
    """Scatters random dense K/V of each request into shuffled pages of a fresh cache."""
    pages_per_req = [-(-length // page_size) for length in seq_lens]
    num_pages = sum(pages_per_req) + 2  # two spare pages nobody owns
    num_slots = num_pages * page_size
    page_order = torch.randperm(num_pages, generator=generator)
    k_cache = torch.full((num_slots, num_kv_heads, head_dim), float('nan'), dtype=dtype)
    v_cache = torch.full((num_slots, num_kv_heads, v_head_dim), float('nan'), dtype=dtype)
    max_context_len = max_context_len or max(max(seq_lens, default=1), 1) + 3
    num_rows = len(seq_lens) + 3
    req_to_token = torch.full((num_rows, max_context_len), GARBAGE_SLOT, dtype=torch.int32)
    req_pool_indices = torch.randperm(num_rows, generator=generator)[: len(seq_lens)]
    dense_k, dense_v, all_slots = [], [], []
    next_page = 0
    for i, length in enumerate(seq_lens):
        pages = page_order[next_page : next_page + pages_per_req[i]]
        next_page += pages_per_req[i]
        offsets = torch.arange(page_size)
        slots = (pages[:, None] * page_size + offsets[None, :]).reshape(-1)[:length]
        keys = torch.randn((length, num_kv_heads, head_dim), generator=generator).to(dtype)
        values = torch.randn((length, num_kv_heads, v_head_dim), generator=generator).to(dtype)
        k_cache[slots] = keys
        v_cache[slots] = values
        req_to_token[int(req_pool_indices[i]), :length] = slots.to(torch.int32)
        dense_k.append(keys)
        dense_v.append(values)
        all_slots.append(slots)
    return PagedKV(
        k_cache=k_cache,
        v_cache=v_cache,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices.to(torch.int64),
        dense_k=dense_k,
        dense_v=dense_v,
        slots=all_slots,
    )


def max_rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest |actual - expected| relative to the largest |expected| (0 for empty)."""
    if expected.numel() == 0:
        return 0.0
    scale = expected.float().abs().max().clamp_min(1e-30)
    return float((actual.float() - expected.float()).abs().max() / scale)
