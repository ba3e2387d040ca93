"""Input checks shared by the Triton launchers, the 'torch' backend and the dispatchers.

Structural checks (shapes, dtypes, devices, strides) cost nothing on the device and always
run. Value checks (slot indices in range, lengths inside the slot table) read tensors back
to the host, so the Triton launchers run them only in debug mode; the 'torch' backend runs
them (unless its caller already did) because a negative index would silently wrap around in
torch indexing.
"""

from __future__ import annotations

import functools
import os

import torch

DEBUG_ENV_VAR = 'VLA_SCHED_KERNEL_DEBUG'
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
BACKENDS = ('auto', 'triton', 'torch')


def debug_enabled(debug: bool | None) -> bool:
    """Returns whether value checks run: the explicit flag, else the environment variable.

    Args:
        debug: True or False to decide explicitly; None to read ``VLA_SCHED_KERNEL_DEBUG``
            (any value other than '', '0', 'false' or 'no' turns the checks on).
    """
    if debug is not None:
        return debug
    value = os.environ.get(DEBUG_ENV_VAR, '').strip().lower()
    return value not in ('', '0', 'false', 'no')


def resolve_backend(backend: str, device: torch.device) -> str:
    """The backend that runs: 'auto' is 'triton' on CUDA and 'torch' elsewhere.

    Raises:
        ValueError: for a name other than 'auto', 'triton' or 'torch'.
    """
    if backend not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS}, got {backend!r}')
    if backend == 'auto':
        return 'triton' if device.type == 'cuda' else 'torch'
    return backend


def check_rank(name: str, tensor: torch.Tensor, rank: int) -> None:
    """Raises ValueError unless ``tensor`` has ``rank`` dimensions."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f'{name} must be a torch.Tensor, got {type(tensor).__name__}')
    if tensor.dim() != rank:
        raise ValueError(f'{name} must have {rank} dimensions, got shape {tuple(tensor.shape)}')


def check_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Raises ValueError unless ``tensor`` has exactly ``shape``."""
    check_rank(name, tensor, len(shape))
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f'{name} must have shape {tuple(shape)}, got {tuple(tensor.shape)}')


def check_dtype(name: str, tensor: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    """Raises TypeError unless ``tensor.dtype`` is one of ``allowed``."""
    if tensor.dtype not in allowed:
        names = ', '.join(str(dtype) for dtype in allowed)
        raise TypeError(f'{name} must have dtype in ({names}), got {tensor.dtype}')


def check_same_dtype(names_and_tensors: dict[str, torch.Tensor]) -> None:
    """Raises TypeError unless every tensor has the dtype of the first one."""
    items = list(names_and_tensors.items())
    first_name, first = items[0]
    for name, tensor in items[1:]:
        if tensor.dtype != first.dtype:
            raise TypeError(
                f'{name} has dtype {tensor.dtype} but {first_name} has {first.dtype}; '
                'they must match'
            )


def check_same_device(names_and_tensors: dict[str, torch.Tensor]) -> None:
    """Raises ValueError unless every tensor lives on the device of the first one."""
    items = list(names_and_tensors.items())
    first_name, first = items[0]
    for name, tensor in items[1:]:
        if tensor.device != first.device:
            raise ValueError(
                f'{name} is on {tensor.device} but {first_name} is on {first.device}; '
                'all inputs must share one device'
            )


def check_contiguous(names_and_tensors: dict[str, torch.Tensor]) -> None:
    """Raises ValueError unless every tensor is contiguous (the layout the kernels take)."""
    for name, tensor in names_and_tensors.items():
        if not tensor.is_contiguous():
            raise ValueError(
                f'{name} must be contiguous, got strides {tensor.stride()} for shape '
                f'{tuple(tensor.shape)}'
            )


def check_last_dim_unit_stride(names_and_tensors: dict[str, torch.Tensor]) -> None:
    """Raises ValueError unless every tensor's last dimension has stride 1."""
    for name, tensor in names_and_tensors.items():
        if tensor.stride(-1) != 1:
            raise ValueError(
                f'{name} must have stride 1 in its last dimension, got strides {tensor.stride()}'
            )


def check_gqa_heads(num_q_heads: int, num_kv_heads: int) -> int:
    """Returns the query heads per KV head; raises ValueError if they do not divide."""
    if num_kv_heads < 1 or num_q_heads % num_kv_heads != 0:
        raise ValueError(
            f'query heads ({num_q_heads}) must be a positive multiple of KV heads ({num_kv_heads})'
        )
    return num_q_heads // num_kv_heads


def check_kv_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Checks the per-layer cache pair: [num_slots, num_kv_heads, head_dim], contiguous."""
    check_rank('k_cache', k_cache, 3)
    check_rank('v_cache', v_cache, 3)
    check_dtype('k_cache', k_cache, FLOAT_DTYPES)
    check_same_dtype({'k_cache': k_cache, 'v_cache': v_cache})
    if k_cache.shape[:2] != v_cache.shape[:2]:
        raise ValueError(
            f'k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must agree on '
            '[num_slots, num_kv_heads]'
        )
    check_contiguous({'k_cache': k_cache, 'v_cache': v_cache})


def check_index_range(name: str, values: torch.Tensor, low: int, high: int) -> None:
    """Raises IndexError naming the first entry of ``values`` outside ``[low, high)``."""
    if values.numel() == 0:
        return
    bad = (values < low) | (values >= high)
    if bool(bad.any()):
        position = tuple(int(i) for i in bad.nonzero()[0])
        value = int(values[position])
        raise IndexError(f'{name}{list(position)} = {value} is outside [{low}, {high})')


def check_slot_table_reads(
    *,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    num_tokens: torch.Tensor,
    num_slots: int,
) -> None:
    """Checks every slot a kernel will read through the slot table.

    Request ``i`` reads ``req_to_token[req_pool_indices[i], 0:num_tokens[i]]``; each row index,
    each length and each slot id read must be in range.

    Raises:
        IndexError: naming the request and the offending row, length or slot.
    """
    num_rows, max_context_len = req_to_token.shape
    check_index_range('req_pool_indices', req_pool_indices, 0, num_rows)
    check_index_range('token counts', num_tokens, 0, max_context_len + 1)
    if num_tokens.numel() == 0:
        return
    max_len = int(num_tokens.max())
    slots = req_to_token[req_pool_indices.long(), :max_len]
    positions = torch.arange(max_len, device=slots.device)
    bad = (positions[None, :] < num_tokens[:, None]) & ((slots < 0) | (slots >= num_slots))
    if bool(bad.any()):
        req, position = (int(i) for i in bad.nonzero()[0])
        row = int(req_pool_indices[req])
        raise IndexError(
            f'request {req}: req_to_token[{row}, {position}] = {int(slots[req, position])} is '
            f'outside the KV cache [0, {num_slots})'
        )


@functools.cache
def check_interpreter_numpy() -> None:
    """Refuses Triton's CPU interpreter before 3.8 with numpy 2.4 or newer, with what to
    pin: that interpreter turns a loop bound read from memory (the ``range`` over a request's
    split or prefix in the attention kernels) into a Python int through ``int()`` of a
    one-element array, which numpy 2.4 refuses ('only 0-dimensional arrays can be converted
    to Python scalars'); Triton 3.8's interpreter squeezes it first. Compiled kernels on a
    GPU are not concerned."""
    import numpy
    import triton

    def major_minor(version: str) -> tuple[int, int]:
        major, minor = version.split('.')[:2]
        return int(major), int(''.join(c for c in minor if c.isdigit()) or 0)

    if major_minor(triton.__version__) < (3, 8) and major_minor(numpy.__version__) >= (2, 4):
        raise RuntimeError(
            f"Triton {triton.__version__}'s interpreter cannot run the attention kernels with "
            f'numpy {numpy.__version__}: install numpy<2.4 (or Triton >= 3.8) to run them on '
            'the CPU'
        )
