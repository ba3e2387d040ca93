"""The 'torch' backend of paged extend attention as a per-step plan and per-layer arithmetic.

``extend_runs`` groups neighbouring requests of one shape (prefix length, extend length,
image span) and works out their prefix slots and mask once per step; ``extend_attention_
over_runs`` is the float32 arithmetic of ``extend_attention_torch`` on them, one batched
product per run. Neither checks its inputs: ``extend_attention_torch`` checks, then runs
both; a model's runner checks its batch once, then calls them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _extend_mask(
    prefix_len: int, extend_len: int, span: tuple[int, int] | None, device: torch.device
) -> torch.Tensor:
    """[extend_len, prefix_len + extend_len] bool: which keys each new query sees."""
    query_pos = prefix_len + torch.arange(extend_len, device=device)
    key_pos = torch.arange(prefix_len + extend_len, device=device)
    mask = key_pos[None, :] <= query_pos[:, None]
    if span is not None and span[0] < span[1]:
        query_in = (query_pos >= span[0]) & (query_pos < span[1])
        key_in = (key_pos >= span[0]) & (key_pos < span[1])
        mask |= query_in[:, None] & key_in[None, :]
    return mask


@dataclass(frozen=True, slots=True, eq=False)
class ExtendRun:
    """Requests next to each other in the batch with the same prefix length, extend length
    and image span: their attention runs as one batched product.

    Their new tokens are rows ``first_row : first_row + num_requests * extend_len`` of
    q/k/v, one request after the other.
    """

    first_row: int
    num_requests: int
    prefix_len: int
    extend_len: int
    prefix_slots: torch.Tensor  # int64 [num_requests, prefix_len]
    hidden: torch.Tensor  # bool [extend_len, prefix_len + extend_len]: keys a query skips


def extend_runs(
    *,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    image_spans: torch.Tensor | None = None,
) -> list[ExtendRun]:
    """The batch's requests as runs of one shape, worked out once for all layers (reads the
    lengths back to the host; requests that extend by nothing are left out). Values are not
    checked here."""
    prefix = prefix_lens.tolist()
    extend = extend_lens.tolist()
    starts = extend_start_loc.tolist()
    spans = [None] * len(prefix) if image_spans is None else image_spans.tolist()
    groups: list[list[int]] = []
    keys: list[tuple] = []
    for i, extend_len in enumerate(extend):
        if extend_len == 0:
            keys.append(None)
            continue
        span = spans[i]
        key = (prefix[i], extend_len, tuple(span) if span and span[0] < span[1] else None)
        last = i - 1
        follows = groups and keys[last] == key and starts[i] == starts[last] + extend_len
        if follows and groups[-1][-1] == last:
            groups[-1].append(i)
        else:
            groups.append([i])
        keys.append(key)
    runs = []
    rows = req_pool_indices.long()
    for members in groups:
        first = members[0]
        prefix_len, extend_len, span = keys[first]
        table_rows = rows[first : members[-1] + 1]
        runs.append(
            ExtendRun(
                first_row=starts[first],
                num_requests=len(members),
                prefix_len=prefix_len,
                extend_len=extend_len,
                prefix_slots=req_to_token[table_rows, :prefix_len].long(),
                hidden=~_extend_mask(prefix_len, extend_len, span, req_to_token.device),
            )
        )
    return runs


def extend_attention_over_runs(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    runs: list[ExtendRun],
    sm_scale: float,
) -> torch.Tensor:
    """The arithmetic of :func:`extend_attention_torch` on runs it already worked out (no
    checks: the caller checked the inputs once for every layer)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, v_head_dim = v_cache.shape[1], v_cache.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.empty((num_tokens, num_q_heads, v_head_dim), dtype=torch.float32, device=q.device)
    for run in runs:
        n, extend_len = run.num_requests, run.extend_len
        rows = slice(run.first_row, run.first_row + n * extend_len)
        keys = k[rows].float().reshape(n, extend_len, num_kv_heads, head_dim)
        values = v[rows].float().reshape(n, extend_len, num_kv_heads, v_head_dim)
        if run.prefix_len:
            keys = torch.cat([k_cache[run.prefix_slots].float(), keys], dim=1)  # [n, L, Hkv, D]
            values = torch.cat([v_cache[run.prefix_slots].float(), values], dim=1)
        queries = q[rows].float().reshape(n, extend_len, num_kv_heads, group, head_dim)
        scores = torch.einsum('nqkgd,nlkd->nkgql', queries, keys) * sm_scale
        probs = torch.softmax(scores.masked_fill(run.hidden, float('-inf')), dim=-1)
        out_run = torch.einsum('nkgql,nlkd->nqkgd', probs, values)
        out[rows] = out_run.reshape(n * extend_len, num_q_heads, v_head_dim)
    return out.to(q.dtype)
