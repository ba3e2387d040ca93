"""Paged decode attention: one new query token per request over that request's KV slots.

Layout, per decoder layer: ``k_cache [num_slots, num_kv_heads, head_dim]`` and
``v_cache [num_slots, num_kv_heads, v_head_dim]`` (contiguous). Request ``i`` reads its
slots through the engine's slot table: ``req_to_token[req_pool_indices[i], 0:seq_lens[i]]``.
Its query (position ``seq_len - 1``, whose own K/V is already stored) attends to all of
them. GQA: query head ``h`` uses KV head ``h // (num_q_heads // num_kv_heads)``.

The Triton path is split-K flash decoding in two stages (after SGLang's
``decode_attention.py``, itself after lightllm): stage 1 runs one program per (request,
KV head, block of its GQA group's query heads, KV split), streams the split's K/V through
an online softmax and writes the normalized partial output and its natural-log
log-sum-exp; stage 2 merges the splits of each (request, query head). Tiles, warps and
pipeline depth follow ``attention_configs.decode_config``. The scratch buffers and the
per-request split counts come from the caller, so a launch can be captured in a CUDA graph.
Dtypes: fp16/bf16 on a GPU, fp32 anywhere (exact fp32 dots).

Entry points: ``decode_attention`` (the 'triton' backend's launcher),
``decode_attention_torch`` (the 'torch' backend, float32), ``run_decode_attention``
(dispatcher that also allocates the Triton scratch), ``choose_num_kv_splits`` (the split
heuristic the dispatcher uses). The 'torch' backend is ``decode_reads`` (the slots each
request reads) then ``decode_attention_over_reads`` (the arithmetic), both in
``decode_reads``; a model works the reads out once per step and runs the arithmetic per
layer.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from vla_sched.kernels import _validate as checks
from vla_sched.kernels.attention_configs import (
    MIN_TOKENS_PER_SPLIT,
    DecodeConfig,
    decode_config,
)
from vla_sched.kernels.decode_reads import decode_attention_over_reads, decode_reads
from vla_sched.kernels.residency import (
    DeviceLimits,
    KernelBuild,
    device_limits,
    resident_programs,
)


def _check_decode_inputs(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    checks.check_kv_cache(k_cache, v_cache)
    checks.check_rank('q', q, 3)
    batch_size, num_q_heads, head_dim = q.shape
    if head_dim != k_cache.shape[2]:
        raise ValueError(f'q head_dim {head_dim} != k_cache head_dim {k_cache.shape[2]}')
    checks.check_gqa_heads(num_q_heads, k_cache.shape[1])
    checks.check_same_dtype({'k_cache': k_cache, 'q': q})
    checks.check_last_dim_unit_stride({'q': q})
    checks.check_rank('req_to_token', req_to_token, 2)
    checks.check_dtype('req_to_token', req_to_token, checks.INDEX_DTYPES)
    checks.check_contiguous({'req_to_token': req_to_token})
    for name, tensor in (('req_pool_indices', req_pool_indices), ('seq_lens', seq_lens)):
        checks.check_shape(name, tensor, (batch_size,))
        checks.check_dtype(name, tensor, checks.INDEX_DTYPES)
    checks.check_same_device(
        {
            'q': q,
            'k_cache': k_cache,
            'v_cache': v_cache,
            'req_to_token': req_to_token,
            'req_pool_indices': req_pool_indices,
            'seq_lens': seq_lens,
        }
    )


def _check_decode_values(
    *,
    k_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    checks.check_index_range('seq_lens', seq_lens, 1, req_to_token.shape[1] + 1)
    checks.check_slot_table_reads(
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        num_tokens=seq_lens,
        num_slots=k_cache.shape[0],
    )


def decode_attention_torch(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    check_values: bool = True,
) -> torch.Tensor:
    """Paged decode attention on the 'torch' backend, in float32.

    Args:
        q: [B, Hq, D] query of each request's newest token.
        k_cache: [num_slots, Hkv, D] key cache of one layer.
        v_cache: [num_slots, Hkv, Dv] value cache of the same layer.
        req_to_token: [num_req_slots, max_context_len] int32 slot table.
        req_pool_indices: [B] int64 row of each request in ``req_to_token``.
        seq_lens: [B] int64 number of positions each request attends to (>= 1).
        sm_scale: softmax scale, usually ``head_dim ** -0.5``.

    Returns:
        [B, Hq, Dv] attention output in ``q.dtype`` (computed in float32).

    Raises:
        ValueError, TypeError: for shapes, dtypes or devices that do not match.
        IndexError: for a slot, row or length out of range (checked unless
            ``check_values`` is False because the caller checked them).
    """
    _check_decode_inputs(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
    )
    if q.shape[0] == 0:
        return q.new_empty((0, q.shape[1], v_cache.shape[2]))
    if check_values:
        _check_decode_values(
            k_cache=k_cache,
            req_to_token=req_to_token,
            req_pool_indices=req_pool_indices,
            seq_lens=seq_lens,
        )
    reads = decode_reads(
        req_to_token=req_to_token, req_pool_indices=req_pool_indices, seq_lens=seq_lens
    )
    return decode_attention_over_reads(
        q=q, k_cache=k_cache, v_cache=v_cache, reads=reads, sm_scale=sm_scale
    )


def _check_decode_outputs(
    *,
    q: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    attn_logits: torch.Tensor,
    attn_lse: torch.Tensor,
    num_kv_splits: torch.Tensor,
) -> None:
    batch_size, num_q_heads, _ = q.shape
    v_head_dim = v_cache.shape[2]
    checks.check_shape('out', out, (batch_size, num_q_heads, v_head_dim))
    checks.check_same_dtype({'q': q, 'out': out})
    checks.check_last_dim_unit_stride({'out': out})
    checks.check_rank('attn_logits', attn_logits, 4)
    max_kv_splits = attn_logits.shape[2]
    if max_kv_splits < 1:
        raise ValueError('attn_logits must have at least one KV split (dimension 2)')
    checks.check_shape(
        'attn_logits', attn_logits, (batch_size, num_q_heads, max_kv_splits, v_head_dim)
    )
    checks.check_shape('attn_lse', attn_lse, (batch_size, num_q_heads, max_kv_splits))
    checks.check_shape('num_kv_splits', num_kv_splits, (batch_size,))
    checks.check_dtype('attn_logits', attn_logits, (torch.float32,))
    checks.check_dtype('attn_lse', attn_lse, (torch.float32,))
    checks.check_dtype('num_kv_splits', num_kv_splits, (torch.int32,))
    checks.check_contiguous({'attn_logits': attn_logits, 'attn_lse': attn_lse})
    checks.check_same_device(
        {
            'q': q,
            'out': out,
            'attn_logits': attn_logits,
            'attn_lse': attn_lse,
            'num_kv_splits': num_kv_splits,
        }
    )


def decode_attention(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    attn_logits: torch.Tensor,
    attn_lse: torch.Tensor,
    num_kv_splits: torch.Tensor,
    sm_scale: float,
    debug: bool | None = None,
    config: DecodeConfig | None = None,
) -> None:
    """Triton launcher for split-K paged decode attention; writes ``out`` in place.

    Args:
        q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, sm_scale: as in
            :func:`decode_attention_torch`.
        out: [B, Hq, Dv] output in ``q.dtype``, last dimension unit-stride.
        attn_logits: [B, Hq, max_kv_splits, Dv] float32 scratch for partial outputs.
        attn_lse: [B, Hq, max_kv_splits] float32 scratch for their log-sum-exps.
        num_kv_splits: [B] int32 splits per request, 1..max_kv_splits (values outside are
            clamped in the kernel and rejected in debug mode).
        debug: check slot, row, length and split values (a host sync); None reads the
            ``VLA_SCHED_KERNEL_DEBUG`` environment variable at call time.
        config: stage 1's tiles, warps and pipeline depth; None takes
            :func:`~vla_sched.kernels.attention_configs.decode_config` for the shape.
    """
    _check_decode_inputs(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
    )
    _check_decode_outputs(
        q=q,
        v_cache=v_cache,
        out=out,
        attn_logits=attn_logits,
        attn_lse=attn_lse,
        num_kv_splits=num_kv_splits,
    )
    if checks.debug_enabled(debug):
        _check_decode_values(
            k_cache=k_cache,
            req_to_token=req_to_token,
            req_pool_indices=req_pool_indices,
            seq_lens=seq_lens,
        )
        checks.check_index_range('num_kv_splits', num_kv_splits, 1, attn_logits.shape[2] + 1)
    if q.shape[0] == 0:
        return
    from vla_sched.kernels._decode_attention_jit import launch_decode_attention

    launch_decode_attention(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        out=out,
        attn_logits=attn_logits,
        attn_lse=attn_lse,
        num_kv_splits=num_kv_splits,
        sm_scale=float(sm_scale),
        config=config or _default_config(q, k_cache),
    )


def _default_config(q: torch.Tensor, k_cache: torch.Tensor) -> DecodeConfig:
    return decode_config(
        head_dim=q.shape[2],
        group=q.shape[1] // k_cache.shape[1],
        itemsize=q.element_size(),
        on_gpu=q.device.type == 'cuda',
    )


def choose_num_kv_splits(
    *,
    seq_lens: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    max_kv_splits: int,
    num_sms: int,
    head_dim: int = 128,
    itemsize: int = 2,
    config: DecodeConfig | None = None,
    dtype: torch.dtype | None = None,
    v_head_dim: int | None = None,
) -> torch.Tensor:
    """Picks each request's KV split count without leaving the device.

    Each request gets the count, from 1 to ``max_kv_splits`` and at most one split per
    ``MIN_TOKENS_PER_SPLIT`` tokens, that minimizes the tiles the busiest program slot
    streams: the stage-1 programs of all requests at that count fill ``ceil(programs /
    (num_sms * programs_per_sm))`` waves, and in each wave a program streams its split's
    tiles after ``num_stages - 1`` tiles of pipeline start-up. Fewer splits win ties (less
    scratch to write and merge). On CUDA ``programs_per_sm`` is what the compiled stage-1
    kernel fits on that device (:func:`device_decode_config`); the config's own number is
    the fallback off CUDA.

    Args:
        seq_lens: [B] tokens each request attends to.
        num_q_heads: query heads.
        num_kv_heads: KV heads.
        max_kv_splits: upper bound (the scratch buffers' split dimension).
        num_sms: streaming multiprocessors of the device (1 on a CPU).
        head_dim, itemsize: the query's head dim and element size, which pick the launch
            config when ``config`` is None (on the device of ``seq_lens``).
        config: the stage-1 launch the splits are for.
        dtype: the query's dtype (None: bfloat16 for ``itemsize`` 2, float32 for 4), and
        v_head_dim: the value head dim (None: ``head_dim``), the build compiled on CUDA.

    Returns:
        [B] int32 split counts in ``1..max_kv_splits``.
    """
    group = checks.check_gqa_heads(num_q_heads, num_kv_heads)
    if max_kv_splits < 1:
        raise ValueError(f'max_kv_splits must be >= 1, got {max_kv_splits}')
    device = seq_lens.device
    if config is None:
        on_gpu = device.type == 'cuda'
        config = decode_config(head_dim=head_dim, group=group, itemsize=itemsize, on_gpu=on_gpu)
    if device.type == 'cuda':
        config = device_decode_config(
            config,
            dtype=dtype or (torch.float32 if itemsize == 4 else torch.bfloat16),
            num_q_heads=num_q_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            v_head_dim=v_head_dim or head_dim,
            max_kv_splits=max_kv_splits,
            device=device,
        )
    head_programs = num_kv_heads * -(-group // config.block_h)
    programs_per_split = max(seq_lens.shape[0] * head_programs, 1)
    num_slots = max(num_sms, 1) * config.programs_per_sm
    splits = torch.arange(1, max_kv_splits + 1, device=device)
    # Device arithmetic only (no host tensors): the model captures this in its decode graphs.
    waves = torch.div(
        splits * programs_per_split + num_slots - 1, num_slots, rounding_mode='floor'
    )
    lens = seq_lens.to(torch.int64)[:, None]
    align = config.split_align
    split_lens = torch.div(torch.div(lens + splits - 1, splits, rounding_mode='floor') + align - 1,
                           align, rounding_mode='floor').clamp(min=1) * align  # fmt: skip
    tiles = torch.div(split_lens + config.block_n - 1, config.block_n, rounding_mode='floor')
    cost = waves * (tiles + (config.num_stages - 1))
    by_length = torch.div(
        lens + MIN_TOKENS_PER_SPLIT - 1, MIN_TOKENS_PER_SPLIT, rounding_mode='floor'
    )
    cost = torch.where(splits <= by_length.clamp(min=1), cost, torch.iinfo(torch.int64).max)
    return (torch.argmin(cost, dim=1) + 1).to(torch.int32)


_DEVICE_CONFIGS: dict[tuple, DecodeConfig] = {}


def device_decode_config(
    config: DecodeConfig,
    *,
    dtype: torch.dtype,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    v_head_dim: int,
    max_kv_splits: int,
    device: torch.device,
) -> DecodeConfig:
    """``config`` with ``programs_per_sm`` set to the stage-1 programs one SM of CUDA
    device ``device`` holds with the compiled kernel of this variant (its registers, shared
    memory and warps against the device's limits, ``residency``); compiled once per variant
    and device, then cached. Off CUDA ``config`` as it is (its number is the fallback)."""
    device = torch.device(device)
    if device.type != 'cuda':
        return config
    if device.index is None:
        device = torch.device('cuda', torch.cuda.current_device())
    shape = (dtype, num_q_heads, num_kv_heads, head_dim, v_head_dim, max_kv_splits)
    key = (device.index, shape, config)
    resolved = _DEVICE_CONFIGS.get(key)
    if resolved is None:
        try:
            with torch.cuda.device(device):
                build = decode_build(config, shape=shape)
        except Exception as error:  # a build that cannot be read must not stop decoding
            warnings.warn(
                f'decode residency: no build of {config} for {shape} on {device} ({error!r}); '
                f'planning with the fallback of {config.programs_per_sm} programs per SM',
                RuntimeWarning,
                stacklevel=2,
            )
            resolved = config
        else:
            resolved = config_for_build(config, build, device_limits(device))
        _DEVICE_CONFIGS[key] = resolved
    return resolved


def config_for_build(config: DecodeConfig, build: KernelBuild, limits: DeviceLimits):
    """``config`` planning with the programs one SM of ``limits`` holds with ``build``, its
    compiled stage 1: what the split rule counts on a device (and the sm_90 build check
    counts without one)."""
    return dataclasses.replace(config, programs_per_sm=resident_programs(build, limits))


def decode_build(config: DecodeConfig, *, shape: tuple) -> KernelBuild:
    """The stage-1 build of ``config`` for ``shape`` (dtype, query heads, KV heads, head
    dim, value head dim, max splits) on the current CUDA device."""
    from vla_sched.kernels._decode_attention_jit import stage1_build

    dtype, num_q_heads, num_kv_heads, head_dim, v_head_dim, max_kv_splits = shape
    return stage1_build(
        dtype=dtype,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        max_kv_splits=max_kv_splits,
        config=config,
    )


def device_num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (1 off CUDA), the ``num_sms`` of
    :func:`choose_num_kv_splits`."""
    if device.type == 'cuda':
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


def run_decode_attention(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    backend: str = 'auto',
    max_kv_splits: int = 8,
    check_values: bool = True,
) -> torch.Tensor:
    """Dispatcher: the 'triton' backend on CUDA, 'torch' elsewhere, unless ``backend`` says.

    On the Triton path it allocates the output and scratch buffers and picks the split
    counts with :func:`choose_num_kv_splits`. Callers that capture CUDA graphs call
    :func:`decode_attention` with their own persistent buffers instead.

    Args:
        q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, sm_scale: as in
            :func:`decode_attention_torch`.
        backend: 'auto', 'triton' (on CPU this needs ``TRITON_INTERPRET=1`` set before the
            first launch) or 'torch'.
        max_kv_splits: upper bound on KV splits per request.
        check_values: the 'torch' backend's index checks (Triton checks them only when
            ``VLA_SCHED_KERNEL_DEBUG`` is set).

    Returns:
        [B, Hq, Dv] attention output in ``q.dtype``.
    """
    common = dict(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        sm_scale=sm_scale,
    )
    if checks.resolve_backend(backend, q.device) == 'torch':
        return decode_attention_torch(**common, check_values=check_values)
    batch_size, num_q_heads, _ = q.shape
    v_head_dim = v_cache.shape[2]
    out = q.new_empty((batch_size, num_q_heads, v_head_dim))
    attn_logits = q.new_empty(
        (batch_size, num_q_heads, max_kv_splits, v_head_dim), dtype=torch.float32
    )
    attn_lse = q.new_empty((batch_size, num_q_heads, max_kv_splits), dtype=torch.float32)
    num_kv_splits = choose_num_kv_splits(
        seq_lens=seq_lens,
        num_q_heads=num_q_heads,
        num_kv_heads=k_cache.shape[1],
        max_kv_splits=max_kv_splits,
        num_sms=device_num_sms(q.device),
        head_dim=q.shape[2],
        config=_default_config(q, k_cache),
        dtype=q.dtype,
        v_head_dim=v_head_dim,
    )
    decode_attention(
        **common, out=out, attn_logits=attn_logits, attn_lse=attn_lse, num_kv_splits=num_kv_splits
    )
    return out
