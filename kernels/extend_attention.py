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
query head or whole GQA group, block of new tokens): stage 1 streams the prefix through the
slot table, stage 2 the new tokens with the mask, both in one online softmax. Tiles, warps,
pipeline depth and the heads per program follow ``attention_configs.extend_config``.

Entry points: ``extend_attention`` (the 'triton' backend's launcher),
``extend_attention_torch`` (the 'torch' backend, float32), ``run_extend_attention``
(dispatcher). The 'torch' backend is ``extend_runs`` (neighbouring requests of one shape
grouped, with their prefix slots and mask) then ``extend_attention_over_runs`` (the
arithmetic, one batched product per run), both in ``extend_runs``; a model works the runs
out once per step and runs the arithmetic per layer.
"""

from __future__ import annotations

import torch

from vla_sched.kernels import _validate as checks
from vla_sched.kernels.attention_configs import ExtendConfig, extend_config
from vla_sched.kernels.extend_runs import extend_attention_over_runs, extend_runs


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


def extend_attention_torch(
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
    """Paged extend attention on the 'torch' backend, in float32.

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
    config: ExtendConfig | None = None,
) -> None:
    """Triton launcher for paged extend attention; writes ``out`` in place.

    Args:
        q, k, v, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens,
            extend_start_loc, sm_scale, image_spans: as in :func:`extend_attention_torch`.
        max_extend_len: an upper bound on ``extend_lens`` (sizes the launch grid).
        out: [T, Hq, Dv] output in ``q.dtype``, last dimension unit-stride.
        debug: check slots, rows, lengths, offsets and spans (a host sync); None reads the
            ``VLA_SCHED_KERNEL_DEBUG`` environment variable at call time.
        config: tiles, warps, pipeline depth and heads per program; None takes
            :func:`~vla_sched.kernels.attention_configs.extend_config` for the shape.
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
        config=config
        or extend_config(
            head_dim=q.shape[2],
            group=num_q_heads // k_cache.shape[1],
            itemsize=q.element_size(),
            on_gpu=q.device.type == 'cuda',
        ),
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
    """Dispatcher: the 'triton' backend on CUDA, 'torch' elsewhere, unless ``backend`` says.

    Args:
        q, k, v, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens,
            extend_start_loc, sm_scale, image_spans: as in :func:`extend_attention_torch`.
        max_extend_len: bound on ``extend_lens`` for the Triton grid; None computes it
            (a host sync).
        backend: 'auto', 'triton' (on CPU this needs ``TRITON_INTERPRET=1`` set before the
            first launch) or 'torch'.
        check_values: the 'torch' backend's index checks (Triton checks them only when
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
        return extend_attention_torch(**common, check_values=check_values)
    if max_extend_len is None:
        max_extend_len = int(extend_lens.max()) if extend_lens.numel() else 0
    out = q.new_empty((q.shape[0], q.shape[1], v_cache.shape[2]))
    extend_attention(**common, max_extend_len=max_extend_len, out=out)
    return out
