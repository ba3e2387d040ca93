"""Writes one step's new K and V into their KV-cache slots.

Layout, per decoder layer: ``k_cache [num_slots, num_kv_heads, head_dim]`` and
``v_cache [num_slots, num_kv_heads, v_head_dim]``, contiguous. Token ``t`` of the step goes to
slot ``out_cache_loc[t]``. The inputs ``k``/``v`` may be strided views (for example slices
of a fused QKV projection) as long as their last dimension has stride 1.

Three entry points share one contract:
- ``store_kv``: the 'triton' backend's launcher (one program per token, all heads at once).
- ``store_kv_torch``: the 'torch' backend (an indexed copy, ``write_kv``, after its checks).
- ``run_store_kv``: picks one of the two ('auto': 'triton' on CUDA, 'torch' elsewhere).
"""

from __future__ import annotations

import torch

from vla_sched.kernels import _validate as checks


def _check_store_inputs(
    *,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    checks.check_kv_cache(k_cache, v_cache)
    checks.check_rank('k', k, 3)
    checks.check_rank('v', v, 3)
    checks.check_rank('out_cache_loc', out_cache_loc, 1)
    num_tokens = out_cache_loc.shape[0]
    _, num_kv_heads, head_dim = k_cache.shape
    checks.check_shape('k', k, (num_tokens, num_kv_heads, head_dim))
    checks.check_shape('v', v, (num_tokens, num_kv_heads, v_cache.shape[2]))
    checks.check_dtype('out_cache_loc', out_cache_loc, checks.INDEX_DTYPES)
    checks.check_same_dtype({'k_cache': k_cache, 'k': k, 'v': v})
    checks.check_same_device(
        {'k_cache': k_cache, 'v_cache': v_cache, 'k': k, 'v': v, 'out_cache_loc': out_cache_loc}
    )
    checks.check_last_dim_unit_stride({'k': k, 'v': v})


def _check_store_locations(out_cache_loc: torch.Tensor, num_slots: int) -> None:
    checks.check_index_range('out_cache_loc', out_cache_loc, 0, num_slots)
    if torch.unique(out_cache_loc).numel() != out_cache_loc.numel():
        values, counts = torch.unique(out_cache_loc, return_counts=True)
        duplicate = int(values[counts > 1][0])
        raise ValueError(f'out_cache_loc writes slot {duplicate} more than once')


def store_kv_torch(
    *,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_cache_loc: torch.Tensor,
    check_values: bool = True,
) -> None:
    """The 'torch' backend: ``k_cache[out_cache_loc[t]] = k[t]`` and the same for V.

    Args:
        k: [T, Hkv, D] keys of the step's new tokens, in the cache dtype.
        v: [T, Hkv, Dv] values of the same tokens.
        k_cache: [num_slots, Hkv, D] key cache of one layer; written in place.
        v_cache: [num_slots, Hkv, Dv] value cache of the same layer; written in place.
        out_cache_loc: [T] int64 (or int32) slot of each new token; distinct and in range.

    Raises:
        ValueError, TypeError: for shapes, dtypes or devices that do not match.
        IndexError: for a slot outside the cache (checked, with the slots' uniqueness,
            unless ``check_values`` is False because the caller checked them).
    """
    _check_store_inputs(k=k, v=v, k_cache=k_cache, v_cache=v_cache, out_cache_loc=out_cache_loc)
    if check_values:
        _check_store_locations(out_cache_loc, k_cache.shape[0])
    write_kv(k=k, v=v, k_cache=k_cache, v_cache=v_cache, locations=out_cache_loc.long())


def write_kv(
    *,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    locations: torch.Tensor,
) -> None:
    """The write of :func:`store_kv_torch` without its checks: ``locations`` int64, distinct
    and in range, checked by the caller once for every layer."""
    k_cache.index_copy_(0, locations, k)
    v_cache.index_copy_(0, locations, v)


def store_kv(
    *,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_cache_loc: torch.Tensor,
    debug: bool | None = None,
) -> None:
    """Triton launcher with the contract of :func:`store_kv_torch`.

    Args:
        k, v, k_cache, v_cache, out_cache_loc: as in :func:`store_kv_torch`.
        debug: run the slot range and uniqueness checks (a host sync); None reads the
            ``VLA_SCHED_KERNEL_DEBUG`` environment variable at call time.
    """
    _check_store_inputs(k=k, v=v, k_cache=k_cache, v_cache=v_cache, out_cache_loc=out_cache_loc)
    if checks.debug_enabled(debug):
        _check_store_locations(out_cache_loc, k_cache.shape[0])
    num_tokens = out_cache_loc.shape[0]
    if num_tokens == 0:
        return
    from vla_sched.kernels._store_kv_jit import launch_store_kv

    launch_store_kv(k=k, v=v, k_cache=k_cache, v_cache=v_cache, out_cache_loc=out_cache_loc)


def run_store_kv(
    *,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_cache_loc: torch.Tensor,
    backend: str = 'auto',
    check_values: bool = True,
) -> None:
    """Dispatcher: the 'triton' backend on CUDA, 'torch' elsewhere, unless ``backend`` says.

    Args:
        k, v, k_cache, v_cache, out_cache_loc: as in :func:`store_kv_torch`.
        backend: 'auto', 'triton' (on CPU this needs ``TRITON_INTERPRET=1`` set before the
            first launch) or 'torch'.
        check_values: the 'torch' backend's slot checks (Triton checks them only when
            ``VLA_SCHED_KERNEL_DEBUG`` is set).
    """
    if checks.resolve_backend(backend, k_cache.device) == 'triton':
        store_kv(k=k, v=v, k_cache=k_cache, v_cache=v_cache, out_cache_loc=out_cache_loc)
    else:
        store_kv_torch(
            k=k, v=v, k_cache=k_cache, v_cache=v_cache, out_cache_loc=out_cache_loc,
            check_values=check_values,
        )  # fmt: skip
