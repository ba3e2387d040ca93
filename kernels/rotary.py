"""Rotary position embedding of queries and keys together, in place.

Layout: ``qk [T, H, D]``, the query heads then the key heads of T tokens (for example the
first ``Hq + Hkv`` heads of a merged QKV projection's output, viewed ``[T, Hq + 2 * Hkv,
D]``), any token and head strides with unit stride in ``D``; ``cos [T, D]`` and
``signed_sin [T, D]`` are the tokens' tables in the same dtype (float16, bfloat16 or
float32), ``signed_sin`` being ``sin`` with its first half negated. Each head becomes
``x * cos + swap_halves(x) * signed_sin`` (transformers' ``rotate_half`` pairing), each
product and the sum rounded to the activation dtype as three torch ops round them.

Three entry points share one contract:
- ``rotary_embedding``: the 'triton' backend's launcher (a program per token and block of
  heads).
- ``rotary_embedding_torch``: the 'torch' backend.
- ``run_rotary_embedding``: picks one ('auto': 'triton' on CUDA, 'torch' elsewhere).
"""

from __future__ import annotations

import torch

from vla_sched.kernels import _validate as checks


def _check_rotary_inputs(*, qk: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
    checks.check_rank('qk', qk, 3)
    checks.check_dtype('qk', qk, checks.FLOAT_DTYPES)
    num_tokens, _, head_dim = qk.shape
    if head_dim % 2:
        raise ValueError(f'qk must have an even head dimension, got {tuple(qk.shape)}')
    checks.check_shape('cos', cos, (num_tokens, head_dim))
    checks.check_shape('signed_sin', signed_sin, (num_tokens, head_dim))
    tensors = {'qk': qk, 'cos': cos, 'signed_sin': signed_sin}
    checks.check_same_dtype(tensors)
    checks.check_same_device(tensors)
    checks.check_last_dim_unit_stride(tensors)


def rotate(qk: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
    """The arithmetic of :func:`rotary_embedding_torch` without its checks.

    Swapping the halves of ``x`` (a roll by half) against a ``sin`` whose first half is
    negated gives ``rotate_half(x) * sin``'s products bit for bit, in fewer operations.
    """
    swapped = qk.roll(qk.shape[-1] // 2, dims=-1)
    if qk.requires_grad:  # under autograd (a guided flow pass): the same sums, then a copy
        qk.copy_(qk * cos[:, None, :] + swapped * signed_sin[:, None, :])
        return
    torch.add(qk * cos[:, None, :], swapped * signed_sin[:, None, :], out=qk)


def rotary_embedding_torch(
    *, qk: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor
) -> None:
    """The 'torch' backend: rotates every head of ``qk`` by its token's tables, in place.

    Args:
        qk: [T, H, D] query and key heads; written in place.
        cos: [T, D] cosines of the tokens' positions, in the dtype of ``qk``.
        signed_sin: [T, D] sines of the same positions, first half negated.

    Raises:
        ValueError, TypeError: for shapes, dtypes, devices or strides that do not match.
    """
    _check_rotary_inputs(qk=qk, cos=cos, signed_sin=signed_sin)
    rotate(qk, cos, signed_sin)


def rotary_embedding(*, qk: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
    """Triton launcher with the contract of :func:`rotary_embedding_torch`."""
    _check_rotary_inputs(qk=qk, cos=cos, signed_sin=signed_sin)
    if qk.numel() == 0:
        return
    from vla_sched.kernels._rotary_jit import launch_rotary_embedding

    launch_rotary_embedding(qk=qk, cos=cos, signed_sin=signed_sin)


def run_rotary_embedding(
    *, qk: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, backend: str = 'auto'
) -> None:
    """Dispatcher: the 'triton' backend on CUDA, 'torch' elsewhere, unless ``backend`` says.

    Args:
        qk, cos, signed_sin: as in :func:`rotary_embedding_torch`.
        backend: 'auto', 'triton' (on CPU this needs ``TRITON_INTERPRET=1`` set before the
            first launch) or 'torch'.
    """
    if checks.resolve_backend(backend, qk.device) == 'triton':
        rotary_embedding(qk=qk, cos=cos, signed_sin=signed_sin)
    else:
        rotary_embedding_torch(qk=qk, cos=cos, signed_sin=signed_sin)
