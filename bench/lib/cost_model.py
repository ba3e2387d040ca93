"""The cost of serving OpenVLA on a device: model sizes, the floor of a step, the H200 cost
model in its calibrations, and the physical bounds of robots per control period.

- ``ModelShape``: what a cost needs of an OpenVLA checkpoint (parameters, tokens, KV), counted
  from its ``config.json`` alone (``openvla_shape``; ``openvla_7b_shape`` for the preset).
- ``step_floor``: the floor of one robot's step at measured rates: a decode step streams the
  decoder's weights (all but the gathered embedding table) at the copy bandwidth; a prefill
  does its FLOPs (the decoder over the prompt, both towers and the projector over the
  patches) at the matmul rate, or streams its weights, whichever is longer; a step is a
  prefill plus a decode step per further action token. ``batch_floor``: the same for N
  robots in one batch, each decode step also reading every robot's KV.
- ``H200Measurements``: what the prepared GPU run (``python -m bench.gpu_check``) measured on
  an NVIDIA H200, runs A and B (their results JSON are in the git history). From them a
  ``HardwareCostModel`` (``vla_sched/testing/sim_runner.py``) in three calibrations:
  ``hardware bound`` (run A's rates at full use, no per-pass overhead: the floor's
  assumptions), ``as measured`` (fitted to our runner's prefill and decode times for 1 and 16
  robots in run A: a fixed cost per pass plus the prefill FLOPs at a fitted share of the
  matmul rate, and for decode the weights at the copy rate plus each request's KV at a
  fitted share of it) and ``as measured, prefill graphs`` (the same fit to run B).
- ``physical_bounds``: per cost model, the robot counts at which the device saturates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from vla_sched.testing.sim_runner import HardwareCostModel

NS_PER_S = 1_000_000_000
OPENVLA_TEXT_TOKENS = 23  # OpenVLA's prompt around a short instruction, after the image
OPENVLA_ACTION_TOKENS = 7  # one per action dimension: x, y, z, roll, pitch, yaw, gripper


class DeviceRates(Protocol):
    """A device's measured rates: device-to-device copy (reads + writes) and matmul."""

    @property
    def copy_gb_per_s(self) -> float: ...

    @property
    def matmul_tflops(self) -> float: ...


@dataclass(frozen=True, slots=True)
class H200Measurements:
    """Measured on an NVIDIA H200 (torch 2.11, CUDA 13.0) by the prepared GPU run:
    openvla-7b with random bf16 weights; (robots, ms) pairs. Prefill includes both vision
    towers and the projector (280 tokens per robot); "runner" is our model runner with CUDA
    graphs (``run`` says which), "generate" transformers' ``generate``. The defaults are
    run A's."""

    run: str = 'run A (commit a2bb52f): decode as CUDA graphs'
    copy_gb_per_s: float = 4136.0  # device-to-device copy, reads + writes
    matmul_tflops: float = 717.0  # bf16
    runner_prefill_ms: tuple[tuple[int, float], ...] = ((1, 44.6), (16, 152.7))
    runner_decode_ms: tuple[tuple[int, float], ...] = ((1, 7.37), (16, 9.33))
    generate_prefill_ms: tuple[tuple[int, float], ...] = ((1, 47.8), (16, 162.7))
    generate_decode_ms: tuple[tuple[int, float], ...] = ((1, 23.7), (16, 22.6))
    generate_step_ms: float = 190.0  # one robot, prefill and every decode step
    floor_prefill_ms: float = 5.72  # weight bytes over the copy rate, FLOPs over matmul rate
    floor_decode_ms: float = 3.19
    floor_step_ms: float = 24.89


H200_RUN_A = H200Measurements()
H200_RUN_B = H200Measurements(
    run='run B (commit 320d611): prefill, vision towers and decode as CUDA graphs',
    copy_gb_per_s=4138.8,
    matmul_tflops=753.5,
    runner_prefill_ms=((1, 21.50), (16, 145.51)),
    runner_decode_ms=((1, 7.478), (16, 9.577)),
    generate_prefill_ms=((1, 70.36), (16, 170.33)),
    generate_decode_ms=((1, 34.32), (16, 32.85)),
    generate_step_ms=276.3,
    floor_prefill_ms=5.45,
    floor_decode_ms=3.19,
    floor_step_ms=24.60,
)
# name: (the run, fitted to the runner's times (else the rates at full use))
CALIBRATIONS: dict[str, tuple[H200Measurements, bool]] = {
    'hardware bound': (H200_RUN_A, False),
    'as measured': (H200_RUN_A, True),
    'as measured, prefill graphs': (H200_RUN_B, True),
}


# --- the model's sizes ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the cost model needs of a checkpoint."""

    decoder_params: int  # the decoder's weights but the embedding table (LM head in)
    vision_params: int  # both towers (SigLIP's unused pooling head out) and the projector
    num_image_tokens: int
    num_text_tokens: int  # after the image
    num_action_tokens: int
    kv_bytes_per_token: int  # K and V of every layer
    bytes_per_param: int = 2  # bfloat16

    @property
    def prompt_len(self) -> int:
        return 1 + self.num_image_tokens + self.num_text_tokens  # BOS, image, text

    @property
    def decoder_flops_per_token(self) -> float:
        return 2.0 * self.decoder_params

    @property
    def vision_flops_per_image(self) -> float:
        return 2.0 * self.vision_params * self.num_image_tokens

    @property
    def prefill_flops(self) -> float:
        """One robot's prefill: the decoder over the prompt, the vision towers over its image."""
        return self.prompt_len * self.decoder_flops_per_token + self.vision_flops_per_image

    @property
    def step_flops(self) -> float:
        """One robot step: the prompt's prefill with the vision towers, then the decode of
        every action token but the first (the prefill samples it)."""
        return self.prefill_flops + (self.num_action_tokens - 1) * self.decoder_flops_per_token


def openvla_shape(config: dict[str, Any], *, bytes_per_param: int = 2) -> ModelShape:
    """The sizes of the OpenVLA checkpoint whose ``config.json`` is ``config``."""
    from vla_sched.model.config.openvla import openvla_architecture
    from vla_sched.model.loading.weights import decoder_shapes
    from vla_sched.testing.openvla_writer import openvla_tensor_shapes

    _, decoder, vision = openvla_architecture(config)
    decoder_params = sum(
        math.prod(s) for k, s in decoder_shapes(decoder).items() if 'embed_tokens' not in k
    )
    vision_params = sum(
        math.prod(s)
        for k, s in openvla_tensor_shapes(config).items()
        if k.startswith(('vision_backbone.', 'projector.')) and '.attn_pool.' not in k
    )
    kv_elements_per_token = 2 * decoder.num_layers * decoder.num_kv_heads * decoder.head_dim
    return ModelShape(
        decoder_params=decoder_params,
        vision_params=vision_params,
        num_image_tokens=vision.num_image_tokens,
        num_text_tokens=OPENVLA_TEXT_TOKENS,
        num_action_tokens=OPENVLA_ACTION_TOKENS,
        kv_bytes_per_token=kv_elements_per_token * bytes_per_param,
        bytes_per_param=bytes_per_param,
    )


def openvla_7b_shape() -> ModelShape:
    """openvla-7b's sizes in bfloat16, from its config alone (``presets.openvla_config``)."""
    from vla_sched.model.config.presets import openvla_config

    return openvla_shape(openvla_config('fused', tiny=False))


def checkpoint_shape(folder: str | Path, *, bytes_per_param: int) -> ModelShape:
    """The sizes of the OpenVLA checkpoint in ``folder``, from its ``config.json``."""
    from vla_sched.model.config.checkpoint_spec import CONFIG_FILE, read_json

    return openvla_shape(read_json(Path(folder) / CONFIG_FILE), bytes_per_param=bytes_per_param)


# --- the floor ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Floor:
    """Measured device rates and the floor of one robot's control step (milliseconds)."""

    copy_gb_per_s: float
    matmul_tflops: float
    decoder_weight_gb: float
    prefill_tflop: float
    prefill_ms: float
    decode_ms: float
    step_ms: float


def step_floor(shape: ModelShape, rates: DeviceRates) -> Floor:
    """The floor of one robot's step of ``shape`` at ``rates`` (see the module doc)."""
    copy_bps = rates.copy_gb_per_s * 1e9
    decoder_bytes = shape.decoder_params * shape.bytes_per_param
    weight_s = (shape.decoder_params + shape.vision_params) * shape.bytes_per_param / copy_bps
    prefill_s = max(shape.prefill_flops / (rates.matmul_tflops * 1e12), weight_s)
    decode_s = decoder_bytes / copy_bps
    return Floor(
        copy_gb_per_s=rates.copy_gb_per_s,
        matmul_tflops=rates.matmul_tflops,
        decoder_weight_gb=decoder_bytes / 1e9,
        prefill_tflop=shape.prefill_flops / 1e12,
        prefill_ms=prefill_s * 1e3,
        decode_ms=decode_s * 1e3,
        step_ms=(prefill_s + (shape.num_action_tokens - 1) * decode_s) * 1e3,
    )


@dataclass(frozen=True, slots=True)
class BatchFloor:
    """The floor of N robots' control steps run as one batch (milliseconds)."""

    num_robots: int
    prefill_ms: float  # every robot's prefill in one pass
    decode_ms: float  # the first decode step of every robot
    step_ms: float


def batch_floor(shape: ModelShape, rates: DeviceRates, num_robots: int) -> BatchFloor:
    """The floor of ``num_robots`` robots' steps as one batch: one prefill pass of all their
    FLOPs at the matmul rate (or its weights at the copy bandwidth, whichever is longer),
    then each further action token's decode step streaming the decoder's weights and every
    robot's KV so far (``step_floor`` leaves one robot's KV out: under 5% of its decode
    step at openvla-7b's 280-token prompt)."""
    if num_robots < 1:
        raise ValueError(f'num_robots must be >= 1, got {num_robots}')
    copy_bps = rates.copy_gb_per_s * 1e9
    weight_s = (shape.decoder_params + shape.vision_params) * shape.bytes_per_param / copy_bps
    prefill_flops = num_robots * shape.prefill_flops
    prefill_s = max(prefill_flops / (rates.matmul_tflops * 1e12), weight_s)
    decoder_s = shape.decoder_params * shape.bytes_per_param / copy_bps
    kv_s = num_robots * shape.kv_bytes_per_token / copy_bps
    # Decode step k attends over the prompt and k action tokens (as ``physical_bounds``).
    decode_s = [
        decoder_s + (shape.prompt_len + k) * kv_s for k in range(1, shape.num_action_tokens)
    ]
    return BatchFloor(
        num_robots=num_robots,
        prefill_ms=prefill_s * 1e3,
        decode_ms=decode_s[0] * 1e3,
        step_ms=(prefill_s + sum(decode_s)) * 1e3,
    )


# --- the two calibrations -------------------------------------------------------------------


def _cost(shape: ModelShape, hw: DeviceRates, **fitted: float) -> HardwareCostModel:
    return HardwareCostModel(
        decoder_flops_per_token=shape.decoder_flops_per_token,
        vision_flops_per_image=shape.vision_flops_per_image,
        decoder_weight_bytes=float(shape.decoder_params * shape.bytes_per_param),
        vision_weight_bytes=float(shape.vision_params * shape.bytes_per_param),
        kv_bytes_per_token=float(shape.kv_bytes_per_token),
        matmul_flops_per_s=hw.matmul_tflops * 1e12,
        memory_bytes_per_s=hw.copy_gb_per_s * 1e9,
        **fitted,
    )


def hardware_bound_cost(shape: ModelShape, hw: DeviceRates) -> HardwareCostModel:
    """The measured rates at full use and no per-pass overhead (the floor's assumptions)."""
    return _cost(shape, hw)


def measured_cost(shape: ModelShape, hw: H200Measurements) -> HardwareCostModel:
    """Fitted to our runner's times for two robot counts (``H200Measurements``).

    Prefill: a fixed cost per pass plus every robot's FLOPs at a fitted share of the matmul
    rate. Decode: a fixed cost per pass plus the weights at the copy rate plus each request's
    KV (the prompt and half the action tokens) at a fitted share of the copy rate.

    Raises:
        ValueError: the fit gives a negative fixed cost or a share above 1.
    """
    flops_per_s = hw.matmul_tflops * 1e12
    memory_bps = hw.copy_gb_per_s * 1e9
    (n1, p1), (n2, p2) = hw.runner_prefill_ms
    per_robot = shape.prompt_len * shape.decoder_flops_per_token + shape.vision_flops_per_image
    compute_utilization = (n2 - n1) * per_robot / (flops_per_s * (p2 - p1) / 1e3)
    prefill_fixed_ms = p1 - n1 * per_robot / (flops_per_s * compute_utilization) * 1e3
    (m1, d1), (m2, d2) = hw.runner_decode_ms
    kv_bytes = (shape.prompt_len + shape.num_action_tokens // 2) * shape.kv_bytes_per_token
    kv_utilization = (m2 - m1) * kv_bytes / (memory_bps * (d2 - d1) / 1e3)
    weights_ms = shape.decoder_params * shape.bytes_per_param / memory_bps * 1e3
    decode_fixed_ms = d1 - weights_ms - m1 * kv_bytes / (memory_bps * kv_utilization) * 1e3
    fitted = {
        'compute_utilization': compute_utilization,
        'kv_bandwidth_utilization': kv_utilization,
        'prefill_fixed_ns': prefill_fixed_ms * 1e6,
        'decode_fixed_ns': decode_fixed_ms * 1e6,
    }
    for name, value in fitted.items():
        if value < 0 or (name.endswith('utilization') and value > 1):
            raise ValueError(f'the fit gives {name} = {value:.4g}')
    return _cost(shape, hw, **fitted)


def calibrated_cost(
    name: str, shape: ModelShape, hw: H200Measurements | None = None
) -> HardwareCostModel:
    """The cost model of calibration ``name``, on ``hw`` instead of its own run if given."""
    if name not in CALIBRATIONS:
        raise ValueError(f'calibration must be one of {list(CALIBRATIONS)}, got {name!r}')
    run, fitted = CALIBRATIONS[name]
    hw = hw or run
    return measured_cost(shape, hw) if fitted else hardware_bound_cost(shape, hw)


def one_at_a_time_step_ns(cost: HardwareCostModel, shape: ModelShape) -> float:
    """One robot's step served alone: its prefill, then a decode pass per further token."""
    decode = sum(
        cost.decode_ns(1, shape.prompt_len + k) for k in range(1, shape.num_action_tokens)
    )
    return cost.prefill_ns(shape.prompt_len, 1) + decode


# --- the physical bounds --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bounds:
    """Robots at one control period that saturate the device under one cost model.

    ``flop_ceiling``: every robot step's FLOPs fill the period at the calibration's compute
    rate (decode free). ``bandwidth_ceiling``: the robots' KV traffic fills what the weight
    reads of one prefill pass and the decode passes leave of the period.
    ``pass_bound``: all robots prefilled in one pass, then their other action tokens decoded
    in shared passes, fill the period (per-pass costs included): the most a scheduler that
    runs prefill and decode as separate passes can serve. ``one_at_a_time_bound``: the
    period over one step served alone.
    """

    flop_ceiling: float
    bandwidth_ceiling: float
    pass_bound: float
    one_at_a_time_bound: float


def period_pass_ns(cost: HardwareCostModel, shape: ModelShape, num_robots: float) -> float:
    """Device time of one period in which ``num_robots`` robots are prefilled in one pass and
    decode their other action tokens in shared passes."""
    n = num_robots
    decode = sum(
        cost.decode_ns(n, n * (shape.prompt_len + k)) for k in range(1, shape.num_action_tokens)
    )
    return cost.prefill_ns(n * shape.prompt_len, n) + decode


def physical_bounds(cost: HardwareCostModel, shape: ModelShape, period_s: float) -> Bounds:
    period_ns = period_s * NS_PER_S
    flop_ceiling = period_ns / cost.compute_ns(shape.step_flops)
    weights_ns = shape.num_action_tokens * cost.weight_read_ns(cost.decoder_weight_bytes)
    weights_ns += cost.weight_read_ns(cost.vision_weight_bytes)
    kv_tokens = shape.prompt_len + sum(
        shape.prompt_len + k for k in range(1, shape.num_action_tokens)
    )  # written by the prefill, read by each decode pass
    bandwidth_ceiling = max(0.0, period_ns - weights_ns) / cost.kv_ns(kv_tokens)
    lo, hi = 0.0, 2 * max(flop_ceiling, 1.0)  # the pass bound is below the FLOP ceiling
    for _ in range(60):  # bisection: device time grows with the robot count
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if period_pass_ns(cost, shape, mid) <= period_ns else (lo, mid)
    return Bounds(
        flop_ceiling=flop_ceiling,
        bandwidth_ceiling=bandwidth_ceiling,
        pass_bound=lo,
        one_at_a_time_bound=period_ns / one_at_a_time_step_ns(cost, shape),
    )
