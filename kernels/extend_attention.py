"""Paged extend (prefill) attention: a step's new tokens over the cached prefix and themselves.

Layout, per decoder layer: ``k_cache [num_slots, num_kv_heads, head_dim]`` and
``v_cache [num_slots, num_kv_heads, v_head_dim]`` (contiguous). The step's new tokens of
all requests lie back to back in ``q [T, Hq, D]``, ``k [T, Hkv, D]`` and ``v [T, Hkv, Dv]``;
request ``i`` owns rows ``extend_start_loc[i] : extend_start_loc[i] + extend_lens[i]``,
which are positions ``prefix_lens[i] ..`` of its sequence. Its cached prefix (positions
``0 .. prefix_len - 1``) is read through ``req_to_token[req_pool_indices[i]]``; the new
tokens' own K/V come from ``k``/``v`` (they are also in the cache already, written by
``store_kv``).

Mask: a new token at position ``p`` sees every prefix position and the new positions
``<= p`` (causal). With ``image_spans [B, 2]`` (absolute ``[start, end)`` positions,
``start == end`` for none), a query inside its request's span also sees the later new
tokens inside that span: bidirectional attention over an image, as prefix-LM VLAs use.

The Triton kernel (after SGLang's ``extend_attention.py``) runs one program per (request,
query head, block of query rows): stage 1 streams the prefix through the slot table,
stage 2 the new tokens with the mask, both in one online softmax.

Entry points: ``extend_attention`` (Triton launcher), ``extend_attention_ref`` (float32
torch reference), ``run_extend_attention`` (dispatcher). The reference is ``extend_runs``
(neighbouring requests of one shape grouped, with their prefix slots and mask) then
``extend_attention_over_runs`` (the arithmetic, one batched product per run); a model works
the runs out once per step and runs the arithmetic per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vla_sched.kernels import _validate as checks


def _check_extend_inputs(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    image_spans: torch.Tensor | None,
) -> None:
    checks.check_kv_cache(k_cache, v_cache)
    checks.check_rank('q', q, 3)
    num_tokens, num_q_heads, head_dim = q.shape
    _, num_kv_heads, cache_head_dim = k_cache.shape
    if head_dim != cache_head_dim:
        raise ValueError(f'q head_dim {head_dim} != k_cache head_dim {cache_head_dim}')
    checks.check_gqa_heads(num_q_heads, num_kv_heads)
    checks.check_shape('k', k, (num_tokens, num_kv_heads, head_dim))
    checks.check_shape('v', v, (num_tokens, num_kv_heads, v_cache.shape[2]))
    checks.check_same_dtype({'k_cache': k_cache, 'q': q, 'k': k, 'v': v})
    checks.check_last_dim_unit_stride({'q': q, 'k': k, 'v': v})
    checks.check_rank('req_to_token', req_to_token, 2)
    checks.check_dtype('req_to_token', req_to_token, checks.INDEX_DTYPES)
    checks.check_contiguous({'req_to_token': req_to_token})
    per_request = {
        'req_pool_indices': req_pool_indices,
        'prefix_lens': prefix_lens,
        'extend_lens': extend_lens,
        'extend_start_loc': extend_start_loc,
    }
    checks.check_rank('req_pool_indices', req_pool_indices, 1)
    batch_size = req_pool_indices.shape[0]
    for name, tensor in per_request.items():
        checks.check_shape(name, tensor, (batch_size,))
        checks.check_dtype(name, tensor, checks.INDEX_DTYPES)
    tensors = {'q': q, 'k': k, 'v': v, 'k_cache': k_cache, 'v_cache': v_cache}
    tensors.update(req_to_token=req_to_token, **per_request)
    if image_spans is not None:
        checks.check_shape('image_spans', image_spans, (batch_size, 2))
        checks.check_dtype('image_spans', image_spans, checks.INDEX_DTYPES)
        checks.check_contiguous({'image_spans': image_spans})
        tensors['image_spans'] = image_spans
    checks.check_same_device(tensors)


def _check_extend_values(
    *,
    num_tokens: int,
    k_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    image_spans: torch.Tensor | None,
) -> None:
    max_context_len = req_to_token.shape[1]
    checks.check_index_range('extend_lens', extend_lens, 0, num_tokens + 1)
    checks.check_index_range('prefix_lens', prefix_lens, 0, max_context_len + 1)
    checks.check_slot_table_reads(
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        num_tokens=prefix_lens,
        num_slots=k_cache.shape[0],
    )
    expected_starts = torch.cumsum(extend_lens, 0) - extend_lens
    if not torch.equal(extend_start_loc.long(), expected_starts.long()):
        raise ValueError(
            f'extend_start_loc {extend_start_loc.tolist()} is not the exclusive cumsum of '
            f'extend_lens {extend_lens.tolist()}'
        )
    total = int(extend_lens.sum())
    if total != num_tokens:
        raise ValueError(f'extend_lens sum to {total} but q holds {num_tokens} tokens')
    if image_spans is not None:
        bad = image_spans[:, 0] > image_spans[:, 1]
        if bool(bad.any()):
            req = int(bad.nonzero()[0, 0])
            raise ValueError(
                f'request {req}: image span {image_spans[req].tolist()} has start > end'
            )


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


def extend_attention_ref(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    sm_scale: float,
    image_spans: torch.Tensor | None = None,
    check_values: bool = True,
) -> torch.Tensor:
    """Float32 torch reference for paged extend attention.

    Args:
        q: [T, Hq, D] queries of the step's new tokens, all requests back to back.
        k: [T, Hkv, D] keys of the same tokens.
        v: [T, Hkv, Dv] values of the same tokens.
        k_cache: [num_slots, Hkv, D] key cache of one layer (holds each prefix).
        v_cache: [num_slots, Hkv, Dv] value cache of the same layer.
        req_to_token: [num_req_slots, max_context_len] int32 slot table.
        req_pool_indices: [B] int64 row of each request in ``req_to_token``.
        prefix_lens: [B] int64 cached positions before each request's new tokens.
        extend_lens: [B] int64 new tokens of each request (they sum to T).
        extend_start_loc: [B] int64 first row of each request in q/k/v (exclusive cumsum).
        sm_scale: softmax scale, usually ``head_dim ** -0.5``.
        image_spans: optional [B, 2] int64 absolute ``[start, end)`` of each request's
            bidirectional image span (``start == end`` for none).

    Returns:
        [T, Hq, Dv] attention output in ``q.dtype`` (computed in float32).

    Raises:
        ValueError, TypeError: for shapes, dtypes, devices or lengths that do not match.
        IndexError: for a slot, row or length out of range (checked, with the lengths and
            offsets, unless ``check_values`` is False because the caller checked them).
    """
    _check_extend_inputs(
        q=q,
        k=k,
        v=v,
        k_cache=k_cache,
        v_cache=v_cache,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        extend_start_loc=extend_start_loc,
        image_spans=image_spans,
    )
    if check_values:
        _check_extend_values(
            num_tokens=q.shape[0],
            k_cache=k_cache,
            req_to_token=req_to_token,
            req_pool_indices=req_pool_indices,
            prefix_lens=prefix_lens,
            extend_lens=extend_lens,
            extend_start_loc=extend_start_loc,
            image_spans=image_spans,
        )
    runs = extend_runs(
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        extend_start_loc=extend_start_loc,
        image_spans=image_spans,
    )
    return extend_attention_over_runs(
        q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, runs=runs, sm_scale=sm_scale
    )


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
    """The arithmetic of :func:`extend_attention_ref` on runs it already worked out (no
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


def extend_attention(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_extend_len: int,
    out: torch.Tensor,
    sm_scale: float,
    image_spans: torch.Tensor | None = None,
    debug: bool | None = None,
) -> None:
    """Triton launcher for paged extend attention; writes ``out`` in place.

    Args:
        q, k, v, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens,
            extend_start_loc, sm_scale, image_spans: as in :func:`extend_attention_ref`.
        max_extend_len: an upper bound on ``extend_lens`` (sizes the launch grid).
        out: [T, Hq, Dv] output in ``q.dtype``, last dimension unit-stride.
        debug: check slots, rows, lengths, offsets and spans (a host sync); None reads the
            ``VLA_SCHED_KERNEL_DEBUG`` environment variable at call time.
    """
    _check_extend_inputs(
        q=q,
        k=k,
        v=v,
        k_cache=k_cache,
        v_cache=v_cache,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        extend_start_loc=extend_start_loc,
        image_spans=image_spans,
    )
    num_tokens, num_q_heads, _ = q.shape
    checks.check_shape('out', out, (num_tokens, num_q_heads, v_cache.shape[2]))
    checks.check_same_dtype({'q': q, 'out': out})
    checks.check_same_device({'q': q, 'out': out})
    checks.check_last_dim_unit_stride({'out': out})
    if max_extend_len < 0:
        raise ValueError(f'max_extend_len must be >= 0, got {max_extend_len}')
    if checks.debug_enabled(debug):
        _check_extend_values(
            num_tokens=num_tokens,
            k_cache=k_cache,
            req_to_token=req_to_token,
            req_pool_indices=req_pool_indices,
            prefix_lens=prefix_lens,
            extend_lens=extend_lens,
            extend_start_loc=extend_start_loc,
            image_spans=image_spans,
        )
        checks.check_index_range('extend_lens', extend_lens, 0, max_extend_len + 1)
    if num_tokens == 0 or max_extend_len == 0:
        return
    from vla_sched.kernels._extend_attention_jit import launch_extend_attention

    launch_extend_attention(
        q=q,
        k=k,
        v=v,
        k_cache=k_cache,
        v_cache=v_cache,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        extend_start_loc=extend_start_loc,
        max_extend_len=int(max_extend_len),
        out=out,
        sm_scale=float(sm_scale),
        image_spans=image_spans,
    )


def run_extend_attention(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    sm_scale: float,
    image_spans: torch.Tensor | None = None,
    max_extend_len: int | None = None,
    backend: str = 'auto',
    check_values: bool = True,
) -> torch.Tensor:
    """Dispatcher: Triton on CUDA, the torch reference elsewhere, unless ``backend`` says.

    Args:
        q, k, v, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens,
            extend_start_loc, sm_scale, image_spans: as in :func:`extend_attention_ref`.
        max_extend_len: bound on ``extend_lens`` for the Triton grid; None computes it
            (a host sync).
        backend: 'auto', 'triton' (on CPU this needs ``TRITON_INTERPRET=1`` set before the
            first launch) or 'torch'.
        check_values: the reference's index checks (the Triton path checks them only when
            ``VLA_SCHED_KERNEL_DEBUG`` is set).

    Returns:
        [T, Hq, Dv] attention output in ``q.dtype``.
    """
    common = dict(
        q=q,
        k=k,
        v=v,
        k_cache=k_cache,
        v_cache=v_cache,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
        extend_start_loc=extend_start_loc,
        sm_scale=sm_scale,
        image_spans=image_spans,
    )
    if checks.resolve_backend(backend, q.device) == 'torch':
        return extend_attention_ref(**common, check_values=check_values)
    if max_extend_len is None:
        max_extend_len = int(extend_lens.max()) if extend_lens.numel() else 0
    out = q.new_empty((q.shape[0], q.shape[1], v_cache.shape[2]))
    extend_attention(**common, max_extend_len=max_extend_len, out=out)
    return out
