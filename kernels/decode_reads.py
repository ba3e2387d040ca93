"""The 'torch' backend of paged decode attention as a per-step plan and per-layer arithmetic.

``decode_reads`` works out the KV slots each request reads (once per step: every layer
reads the same slots); ``decode_attention_over_reads`` is the float32 arithmetic of
``decode_attention_torch`` on them. Neither checks its inputs: ``decode_attention_torch``
checks, then runs both; a model's runner checks its batch once, then calls them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True, eq=False)
class DecodeReads:
    """The KV slots a decode step reads, worked out once for all layers.

    ``slots [B * L]`` holds request ``i``'s slots at positions ``0 .. seq_lens[i] - 1`` and
    slot 0 past them (``L = max(seq_lens)``), request after request; ``padding [B, L]``
    marks those filler positions, or is None when every request reads all ``L`` positions.
    """

    slots: torch.Tensor  # int64 [B * L]
    max_len: int
    padding: torch.Tensor | None  # bool [B, L]


def decode_reads(
    *, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
) -> DecodeReads:
    """The slots ``req_to_token[req_pool_indices[i], 0:seq_lens[i]]`` of each request (a
    host sync: the longest length sizes the result). Values are not checked here."""
    min_len, max_len = (int(x) for x in seq_lens.aminmax())
    slots = req_to_token[req_pool_indices.long(), :max_len].long()
    if min_len == max_len:
        return DecodeReads(slots=slots.view(-1), max_len=max_len, padding=None)
    positions = torch.arange(max_len, device=slots.device)
    padding = positions[None, :] >= seq_lens[:, None]
    # Padding positions read slot 0, which may hold anything: their K/V are zeroed.
    slots = slots.masked_fill(padding, 0).view(-1)
    return DecodeReads(slots=slots, max_len=max_len, padding=padding)


def decode_attention_over_reads(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    reads: DecodeReads,
    sm_scale: float,
) -> torch.Tensor:
    """The arithmetic of :func:`decode_attention_torch` on slots it already worked out (no
    checks: the caller checked the inputs once for every layer)."""
    batch_size, num_q_heads, head_dim = q.shape
    num_kv_heads, v_head_dim = v_cache.shape[1], v_cache.shape[2]
    size = (batch_size, reads.max_len, num_kv_heads)
    keys = k_cache.index_select(0, reads.slots).view(*size, head_dim).float()  # [B, L, Hkv, D]
    values = v_cache.index_select(0, reads.slots).view(*size, v_head_dim).float()
    padding = reads.padding
    if padding is not None:
        keys = keys.masked_fill(padding[:, :, None, None], 0.0)
        values = values.masked_fill(padding[:, :, None, None], 0.0)
    group = num_q_heads // num_kv_heads
    queries = q.float().reshape(batch_size, num_kv_heads, group, head_dim)
    # [B, Hkv, group, D] @ [B, Hkv, D, L]: the batched product einsum('bkgd,blkd->bkgl') is
    scores = torch.matmul(queries, keys.permute(0, 2, 3, 1)) * sm_scale
    if padding is not None:
        scores = scores.masked_fill(padding[:, None, None, :], float('-inf'))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, values.transpose(1, 2))  # [B, Hkv, group, Dv]
    return out.reshape(batch_size, num_q_heads, v_head_dim).to(q.dtype)
