"""The floor of an OpenVLA-OFT pass: one step of N robots, each a whole sequence in one pass.

An OFT step is one prefill-only pass (``ParallelActionRunner``): every camera image through
both towers and the projector, the decoder once over the whole sequence (images, proprio
token, prompt, action slots, stop token), the L1 head over the chunk's rows and the proprio
projector over the state; no logits, no decode. Its floor at measured rates is whichever is
longer of

- its FLOPs at the matmul rate: ``2 x decoder params`` per position of every robot's
  sequence, ``2 x vision params`` per patch of every image, ``2 x head params`` per chunk
  step and ``2 x projector params`` per state (attention's own FLOPs left out, as
  ``bench.lib.cost_model`` leaves them out: about 2% at openvla-7b's 600-token sequence);
- the weights it reads over the copy bandwidth: the decoder but its embedding table (rows
  are gathered) and its LM head (not run), the towers and projector, the head, the proprio
  projector.

``robots_at_period`` is the FLOP ceiling: the robots whose passes fill a control period at
the matmul rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lib.cost_model import DeviceRates, openvla_shape
from vla_sched.model.families.openvla_oft.checkpoint import OFTSettings


@dataclass(frozen=True, slots=True)
class OFTShape:
    """What the floor of an OFT pass needs of a checkpoint and its settings (per robot)."""

    decoder_params: int  # read by the pass: no embedding table, no LM head
    vision_params: int  # both towers and the projector
    head_params: int  # the L1 action head
    proprio_params: int  # the proprio projector (0 without proprio)
    num_images: int  # cameras per step
    num_image_tokens: int  # patches of one image
    seq_len: int  # positions of one robot's sequence
    chunk_len: int  # the head's rows per robot
    bytes_per_param: int = 2  # bfloat16

    def __post_init__(self) -> None:
        for name in ('decoder_params', 'vision_params', 'head_params', 'num_images'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
        for name in ('num_image_tokens', 'seq_len', 'chunk_len', 'bytes_per_param'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
        if self.proprio_params < 0:
            raise ValueError(f'proprio_params must be >= 0, got {self.proprio_params}')

    @property
    def decoder_flops(self) -> float:
        return 2.0 * self.decoder_params * self.seq_len

    @property
    def vision_flops(self) -> float:
        """Every camera's image through the towers and the projector."""
        return self.num_images * 2.0 * self.vision_params * self.num_image_tokens

    @property
    def head_flops(self) -> float:
        """The head over the chunk's rows, the projector over the state."""
        return 2.0 * self.head_params * self.chunk_len + 2.0 * self.proprio_params

    @property
    def pass_flops(self) -> float:
        """One robot's share of a pass."""
        return self.decoder_flops + self.vision_flops + self.head_flops

    @property
    def weight_bytes(self) -> float:
        params = self.decoder_params + self.vision_params + self.head_params
        return float((params + self.proprio_params) * self.bytes_per_param)


def oft_shape(
    config: dict[str, Any], settings: OFTSettings, *, seq_len: int, bytes_per_param: int = 2
) -> OFTShape:
    """The shape of an OFT checkpoint on the OpenVLA ``config.json`` ``config``, served with
    ``settings``, whose step sequences are ``seq_len`` positions long."""
    from vla_sched.model.config.openvla import openvla_architecture
    from vla_sched.model.families.openvla_oft.weights import (
        action_head_shapes,
        proprio_projector_shapes,
    )
    from vla_sched.model.loading.weights import LM_HEAD, decoder_shapes

    base = openvla_shape(config, bytes_per_param=bytes_per_param)
    _, decoder, _ = openvla_architecture(config)
    decoder_params = sum(
        math.prod(s)
        for k, s in decoder_shapes(decoder).items()
        if 'embed_tokens' not in k and k != LM_HEAD
    )
    hidden = decoder.hidden_size
    head = action_head_shapes(hidden, settings.action_dim).values()
    proprio = proprio_projector_shapes(hidden, settings.proprio_dim).values()
    return OFTShape(
        decoder_params=decoder_params,
        vision_params=base.vision_params,
        head_params=sum(math.prod(s) for s in head),
        proprio_params=sum(math.prod(s) for s in proprio) if settings.use_proprio else 0,
        num_images=settings.num_images,
        num_image_tokens=base.num_image_tokens,
        seq_len=seq_len,
        chunk_len=settings.chunk_len,
        bytes_per_param=bytes_per_param,
    )


def oft_checkpoint_shape(
    folder: str | Path, settings: OFTSettings, *, seq_len: int, bytes_per_param: int
) -> OFTShape:
    """``oft_shape`` of the OFT folder ``folder``, from its ``config.json``."""
    from vla_sched.model.config.checkpoint_spec import CONFIG_FILE, read_json

    config = read_json(Path(folder) / CONFIG_FILE)
    return oft_shape(config, settings, seq_len=seq_len, bytes_per_param=bytes_per_param)


@dataclass(frozen=True, slots=True)
class OFTPassFloor:
    """The floor of one pass of ``num_robots`` robots' OFT steps (milliseconds)."""

    num_robots: int
    copy_gb_per_s: float
    matmul_tflops: float
    tflop: float  # the pass's FLOPs
    weight_gb: float  # the weights it reads
    compute_ms: float  # its FLOPs at the matmul rate
    weights_ms: float  # its weights over the copy bandwidth
    pass_ms: float  # the longer of the two


def oft_pass_floor(shape: OFTShape, rates: DeviceRates, num_robots: int) -> OFTPassFloor:
    """The floor of ``num_robots`` robots' steps of ``shape`` in one pass at ``rates``."""
    if num_robots < 1:
        raise ValueError(f'num_robots must be >= 1, got {num_robots}')
    flops = num_robots * shape.pass_flops
    compute_s = flops / (rates.matmul_tflops * 1e12)
    weights_s = shape.weight_bytes / (rates.copy_gb_per_s * 1e9)
    return OFTPassFloor(
        num_robots=num_robots,
        copy_gb_per_s=rates.copy_gb_per_s,
        matmul_tflops=rates.matmul_tflops,
        tflop=flops / 1e12,
        weight_gb=shape.weight_bytes / 1e9,
        compute_ms=compute_s * 1e3,
        weights_ms=weights_s * 1e3,
        pass_ms=max(compute_s, weights_s) * 1e3,
    )


def robots_at_period(shape: OFTShape, rates: DeviceRates, period_s: float) -> float:
    """The FLOP ceiling: robots whose steps' FLOPs fill ``period_s`` at the matmul rate."""
    if not period_s > 0:
        raise ValueError(f'period_s must be > 0, got {period_s}')
    return period_s * rates.matmul_tflops * 1e12 / shape.pass_flops
