"""SwiGLU's activation over a merged gate/up projection: ``silu(gate) * up``.

Layout: ``gate_up [T, 2 * inner]`` (any row stride, unit stride in the last dimension),
the gate in its first ``inner`` columns and the up projection in the rest, as one matmul
against ``gate_up_proj`` writes it; the result is ``[T, inner]`` in the same dtype
(float16, bfloat16 or float32). The arithmetic is two torch ops': ``silu`` in float32
rounded to the activation dtype, then the product rounded again.

Three entry points share one contract:
- ``silu_and_mul``: the 'triton' backend's launcher (a program per token and column block).
- ``silu_and_mul_torch``: the 'torch' backend.
- ``run_silu_and_mul``: picks one ('auto': 'triton' on CUDA, 'torch' elsewhere).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from vla_sched.kernels import _validate as checks


def _check_gate_up(gate_up: torch.Tensor) -> None:
    checks.check_rank('gate_up', gate_up, 2)
    checks.check_dtype('gate_up', gate_up, checks.FLOAT_DTYPES)
    checks.check_last_dim_unit_stride({'gate_up': gate_up})
    if gate_up.shape[1] % 2:
        raise ValueError(f'gate_up must have an even last dimension, got {tuple(gate_up.shape)}')


def silu_and_mul_torch(*, gate_up: torch.Tensor) -> torch.Tensor:
    """The 'torch' backend: ``silu(gate_up[:, :inner]) * gate_up[:, inner:]``.

    Args:
        gate_up: [T, 2 * inner] the merged gate and up projections of T tokens.

    Returns:
        [T, inner] in the dtype of ``gate_up``.

    Raises:
        ValueError, TypeError: for a shape, dtype or stride the kernel does not take.
    """
    _check_gate_up(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul_torch(*, gate_up: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(gate_up[:, :inner]) * gate_up[:, inner:]`` (Gemma's MLP), torch only: no
    profile has shown a fused kernel to pay for it yet.

    Args:
        gate_up: [T, 2 * inner] the merged gate and up projections of T tokens.

    Returns:
        [T, inner] in the dtype of ``gate_up``.
    """
    _check_gate_up(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate='tanh') * up


def silu_and_mul(*, gate_up: torch.Tensor) -> torch.Tensor:
    """Triton launcher with the contract of :func:`silu_and_mul_torch`."""
    _check_gate_up(gate_up)
    num_tokens, inner = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((num_tokens, inner), dtype=gate_up.dtype, device=gate_up.device)
    if num_tokens and inner:
        from vla_sched.kernels._activation_jit import launch_silu_and_mul

        launch_silu_and_mul(gate_up=gate_up, out=out)
    return out


def run_silu_and_mul(*, gate_up: torch.Tensor, backend: str = 'auto') -> torch.Tensor:
    """Dispatcher: the 'triton' backend on CUDA, 'torch' elsewhere, unless ``backend`` says.

    Args:
        gate_up: as in :func:`silu_and_mul_torch`.
        backend: 'auto', 'triton' (on CPU this needs ``TRITON_INTERPRET=1`` set before the
            first launch) or 'torch'.
    """
    if checks.resolve_backend(backend, gate_up.device) == 'triton':
        return silu_and_mul(gate_up=gate_up)
    return silu_and_mul_torch(gate_up=gate_up)
