"""Real-time chunking's guidance of a flow-matching chunk (arXiv 2506.07339, ΠGDM), in the
pi0 family's time direction.

The paper's time tau runs from 0 (noise) to 1 (data) with ``A_tau = tau A + (1 - tau) noise``
and a velocity towards the data; LeRobot's pi0, pi0.5 and SmolVLA run ``t = 1 - tau`` from 1
to 0 with a velocity ``v`` towards the noise and the Euler step ``x <- x + dt v``, ``dt < 0``.
In that direction, for each denoising pass:

- the clean estimate is ``A_hat = x - t v(x, t)``;
- the correction is ``g = J^T (W * (Y - A_hat))`` with ``J = dA_hat / dx`` (one
  vector-Jacobian product through the model);
- the weight is ``w = min(beta, (tau^2 + (1 - tau)^2) / (tau (1 - tau)))``, ``tau = 1 - t``
  (infinite at tau = 0, so beta there);
- the guided velocity is ``v - w g`` (the paper's ``v + w g`` with the velocity's sign
  turned), which moves ``A_hat`` towards ``Y`` where ``W`` is large.

``soft_mask`` gives ``W`` over a chunk: 1 on the ``delay`` actions that run before the new
chunk arrives, then decaying to 0 by the execution horizon, by one of LeRobot's schedules.
With ``W`` all zero (or no target) the guided velocity is the plain one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vla_sched.core.forward_batch import FlowGuidance

MASK_SCHEDULES = ('zeros', 'ones', 'linear', 'exp')


@dataclass(frozen=True, slots=True)
class RtcSettings:
    """How a flow family guides a robot's chunk towards its previous one.

    Attributes:
        execution_horizon: the actions the mask reaches 0 by (capped at the chunk).
        max_guidance: the guidance weight's cap (beta).
        schedule: the mask's decay (``MASK_SCHEDULES``).
    """

    execution_horizon: int = 10
    max_guidance: float = 10.0
    schedule: str = 'linear'

    def __post_init__(self) -> None:
        if self.execution_horizon < 1 or not self.max_guidance >= 0.0:
            raise ValueError(f'RTC settings out of range: {self}')
        if self.schedule not in MASK_SCHEDULES:
            raise ValueError(
                f'unknown mask schedule {self.schedule!r}; use one of {MASK_SCHEDULES}'
            )

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> RtcSettings:
        """The engine's ``rtc_*`` settings (their defaults where absent)."""
        return cls(
            execution_horizon=int(settings.get('rtc_execution_horizon', 10)),
            max_guidance=float(settings.get('rtc_max_guidance', 10.0)),
            schedule=str(settings.get('rtc_mask_schedule', 'linear')),
        )

    def guidance(self, target: np.ndarray, *, num_rows: int, delay: int) -> FlowGuidance:
        """The guidance of a chunk towards ``target`` (normalized ``[chunk, width]`` whose
        first ``num_rows`` rows are the previous chunk's remaining actions, the rest zero),
        ``delay`` actions frozen. The mask ends by the previous chunk's end: its zero rows
        are no target (the paper's mask ends at H - s, LeRobot caps its horizon at the
        leftover's length), and neither the frozen part nor the ramp reaches them."""
        chunk = target.shape[0]
        horizon = min(self.execution_horizon, chunk, num_rows)
        weights = soft_mask(
            chunk, delay=min(delay, horizon), horizon=horizon, schedule=self.schedule
        )
        return FlowGuidance(target=target, weights=weights, max_weight=self.max_guidance)


def guidance_towards(
    previous: np.ndarray,
    *,
    normalize: Callable[[np.ndarray], np.ndarray],
    action_dim: int,
    shape: tuple[int, int],
    delay: int,
    settings: RtcSettings,
) -> FlowGuidance | None:
    """A step's guidance towards its robot's previous chunk: ``previous`` (robot units,
    ``[n, action_dim]``, row 0 at the step's first action) normalized as the model made it
    (``normalize``: ``[n, action_dim]`` -> ``[n, width]``), up to the chunk, in a zero target
    of ``shape`` (``[chunk, width]``), ``delay`` actions frozen, the mask ending with the
    previous rows; None without previous actions or with another action size."""
    previous = np.asarray(previous)
    if previous.ndim != 2 or previous.shape[0] == 0 or previous.shape[1] != action_dim:
        return None
    target = np.zeros(shape, np.float32)
    rows = normalize(previous[: shape[0]])
    target[: rows.shape[0]] = rows
    return settings.guidance(target, num_rows=rows.shape[0], delay=int(delay))


def guided_rows(
    velocity_of: Callable[[torch.Tensor], torch.Tensor],
    *,
    x_t: torch.Tensor,
    t: torch.Tensor,
    guidance: Sequence[FlowGuidance | None],
) -> torch.Tensor:
    """``guided_velocity`` for a pass's rows, each with its guidance or None (a zero mask:
    its velocity is the plain one), the targets, masks and caps stacked on ``x_t``'s
    device."""
    device = x_t.device
    zeros = torch.zeros(x_t.shape[1:], dtype=torch.float32)
    target = torch.stack([zeros if g is None else torch.as_tensor(g.target) for g in guidance])
    weights = torch.stack(
        [zeros[:, 0] if g is None else torch.as_tensor(g.weights) for g in guidance]
    )
    max_weight = torch.tensor([0.0 if g is None else g.max_weight for g in guidance])
    return guided_velocity(
        velocity_of,
        x_t=x_t,
        t=t.to(device),
        target=target.to(device),
        weights=weights.to(device),
        max_weight=max_weight.to(device),
    )


def soft_mask(chunk: int, *, delay: int, horizon: int, schedule: str = 'linear') -> np.ndarray:
    """The guidance weights ``[chunk]`` (float32): ``zeros``: 1 on ``[0, delay)`` only;
    ``ones``: 1 on ``[0, horizon)``; ``linear``: 1 on ``[0, delay)``, then a linear ramp from
    1 to 0 over ``[delay, horizon)`` (both ends excluded), 0 from ``horizon``; ``exp``: the
    linear ramp ``r`` times ``expm1(r) / (e - 1)``.

    Raises:
        ValueError: for an unknown schedule or ``0 <= delay <= horizon <= chunk`` broken.
    """
    if schedule not in MASK_SCHEDULES:
        raise ValueError(f'unknown mask schedule {schedule!r}; use one of {MASK_SCHEDULES}')
    if not 0 <= delay <= horizon <= chunk:
        raise ValueError(f'need 0 <= delay {delay} <= horizon {horizon} <= chunk {chunk}')
    weights = np.zeros(chunk, dtype=np.float64)
    if schedule == 'ones':
        weights[:horizon] = 1.0
        return weights.astype(np.float32)
    weights[:delay] = 1.0
    if schedule == 'zeros':
        return weights.astype(np.float32)
    between = horizon - delay
    if between > 0:
        ramp = np.linspace(1.0, 0.0, between + 2)[1:-1]
        if schedule == 'exp':
            ramp = ramp * np.expm1(ramp) / (math.e - 1.0)
        weights[delay:horizon] = ramp
    return weights.astype(np.float32)


def guidance_weight(t: torch.Tensor, max_weight: torch.Tensor) -> torch.Tensor:
    """``min(beta, (tau^2 + (1 - tau)^2) / (tau (1 - tau)))`` per row, ``tau = 1 - t``."""
    tau = (1.0 - t).double()
    with torch.no_grad():
        raw = (tau**2 + (1.0 - tau) ** 2) / (tau * (1.0 - tau))
        raw = torch.where(tau * (1.0 - tau) > 0, raw, torch.full_like(raw, math.inf))
    return torch.minimum(raw, max_weight.double()).float()


def guided_velocity(
    velocity_of: Callable[[torch.Tensor], torch.Tensor],
    *,
    x_t: torch.Tensor,
    t: torch.Tensor,
    target: torch.Tensor,
    weights: torch.Tensor,
    max_weight: torch.Tensor,
) -> torch.Tensor:
    """The guided velocity of ``B`` rows (see the module docstring).

    Args:
        velocity_of: ``x_t [B, chunk, width] -> v [B, chunk, width]``, differentiable.
        x_t: the rows' noisy actions. t: ``[B]`` their times (1: noise).
        target: ``[B, chunk, width]`` the rows' targets ``Y``. weights: ``[B, chunk]`` ``W``.
        max_weight: ``[B]`` beta per row.

    Returns:
        ``[B, chunk, width]`` float32, detached.
    """
    with torch.enable_grad():
        x = x_t.detach().clone().requires_grad_(True)
        v = velocity_of(x)
        clean = x - t.view(-1, 1, 1) * v
        error = weights.unsqueeze(-1) * (target - clean)
        (correction,) = torch.autograd.grad(clean, x, grad_outputs=error.detach())
    w = guidance_weight(t, max_weight).view(-1, 1, 1)
    return (v.detach() - w * correction).float()
