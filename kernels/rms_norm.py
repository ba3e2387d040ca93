"""RMSNorm of a decoder's hidden states, alone or with the residual add before it.

Layout: ``x [T, hidden]`` (any row stride, unit stride in ``hidden``), ``weight [hidden]``,
all in one dtype (float16, bfloat16 or float32). The arithmetic is transformers' Llama
``RMSNorm``: the sum of squares and its reciprocal root in float32, ``x * rstd`` rounded to
the input dtype, then scaled by ``weight`` in the input dtype. With a residual, the sum
``x + residual`` is rounded to the input dtype first (as a separate torch add would) and
both the normalized rows and that sum come back, so a decoder passes its residual stream
from layer to layer as vLLM's Llama does.

Three entry points per operation share one contract:
- ``rms_norm`` / ``fused_add_rms_norm``: the 'triton' backend's launchers (one program per
  row).
- ``rms_norm_torch`` / ``fused_add_rms_norm_torch``: the 'torch' backend.
- ``run_rms_norm`` / ``run_fused_add_rms_norm``: pick one ('auto': 'triton' on CUDA,
  'torch' elsewhere).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from vla_sched.kernels import _validate as checks


def _check_norm_inputs(
    *, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> None:
    checks.check_rank('x', x, 2)
    checks.check_dtype('x', x, checks.FLOAT_DTYPES)
    checks.check_shape('weight', weight, (x.shape[1],))
    tensors = {'x': x, 'weight': weight}
    if residual is not None:
        checks.check_shape('residual', residual, tuple(x.shape))
        tensors['residual'] = residual
    checks.check_same_dtype(tensors)
    checks.check_same_device(tensors)
    checks.check_last_dim_unit_stride(tensors)
    if not eps >= 0.0:
        raise ValueError(f'eps must be >= 0, got {eps}')


def normalize(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The arithmetic of :func:`rms_norm_torch` without its checks."""
    if x.dtype == torch.float32:  # no casts to do: the fused op, same arithmetic
        return F.rms_norm(x, weight.shape, weight, eps)
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rms_norm_torch(*, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The 'torch' backend: ``weight * (x * rsqrt(mean(x²) + eps))``, float32 inside.

    Args:
        x: [T, hidden] rows to normalize.
        weight: [hidden] scale, in the dtype of ``x``.
        eps: added to the mean square.

    Returns:
        [T, hidden] normalized rows in the dtype of ``x``.

    Raises:
        ValueError, TypeError: for shapes, dtypes, devices or strides that do not match.
    """
    _check_norm_inputs(x=x, weight=weight, eps=eps)
    return normalize(x, weight, eps)


def fused_add_rms_norm_torch(
    *, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The 'torch' backend: ``new_residual = x + residual``, then its RMSNorm.

    Args:
        x: [T, hidden] a layer's output.
        residual: [T, hidden] the residual stream it adds to; not written.
        weight, eps: as in :func:`rms_norm_torch`.

    Returns:
        ``(normed, new_residual)``, both [T, hidden] in the dtype of ``x``.
    """
    _check_norm_inputs(x=x, weight=weight, eps=eps, residual=residual)
    new_residual = x + residual
    return normalize(new_residual, weight, eps), new_residual


def rms_norm(*, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Triton launcher with the contract of :func:`rms_norm_torch`."""
    _check_norm_inputs(x=x, weight=weight, eps=eps)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.shape[0]:
        from vla_sched.kernels._rms_norm_jit import launch_rms_norm

        launch_rms_norm(x=x, residual=None, weight=weight, eps=eps, out=out, residual_out=None)
    return out


def fused_add_rms_norm(
    *, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton launcher with the contract of :func:`fused_add_rms_norm_torch`: one pass reads
    ``x`` and ``residual`` and writes both outputs."""
    _check_norm_inputs(x=x, weight=weight, eps=eps, residual=residual)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.shape[0]:
        from vla_sched.kernels._rms_norm_jit import launch_rms_norm

        launch_rms_norm(
            x=x, residual=residual, weight=weight, eps=eps, out=out, residual_out=residual_out
        )
    return out, residual_out


def run_rms_norm(
    *, x: torch.Tensor, weight: torch.Tensor, eps: float, backend: str = 'auto'
) -> torch.Tensor:
    """Dispatcher: the 'triton' backend on CUDA, 'torch' elsewhere, unless ``backend`` says.

    Args:
        x, weight, eps: as in :func:`rms_norm_torch`.
        backend: 'auto', 'triton' (on CPU this needs ``TRITON_INTERPRET=1`` set before the
            first launch) or 'torch'.
    """
    if checks.resolve_backend(backend, x.device) == 'triton':
        return rms_norm(x=x, weight=weight, eps=eps)
    return rms_norm_torch(x=x, weight=weight, eps=eps)


def run_fused_add_rms_norm(
    *,
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    backend: str = 'auto',
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatcher of :func:`fused_add_rms_norm` and its twin, as :func:`run_rms_norm`."""
    if checks.resolve_backend(backend, x.device) == 'triton':
        return fused_add_rms_norm(x=x, residual=residual, weight=weight, eps=eps)
    return fused_add_rms_norm_torch(x=x, residual=residual, weight=weight, eps=eps)
