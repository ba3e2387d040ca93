"""Which device and dtype an engine core runs its model on."""

from __future__ import annotations

import torch

from vla_sched.engine.config import EngineConfig


def pick_device_and_dtype(config: EngineConfig) -> tuple[torch.device, torch.dtype]:
    """'auto' means CUDA in bfloat16 when available, else the CPU in float32.

    On the CPU this also sets torch's thread count (process-wide) to ``cpu_threads``.
    """
    if config.device == 'auto':
        device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    else:
        device = torch.device(config.device)
    if device.type == 'cpu':
        torch.set_num_threads(config.cpu_threads)
    if config.dtype == 'auto':
        return device, torch.bfloat16 if device.type == 'cuda' else torch.float32
    return device, getattr(torch, config.dtype)
