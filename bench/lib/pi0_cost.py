"""The floor of a pi0 / pi0.5 step: a prefix pass, then ``num_steps`` denoising passes, each
pass waiting for the one before.

A pass costs at least the longer of its FLOPs at the matmul rate and the weights it reads
over the copy bandwidth (attention's own FLOPs left out, as ``bench.lib.cost_model`` leaves
them out). A step of ``N`` robots batched is one prefix pass and ``num_steps`` denoising
passes of ``N`` rows, so its floor is

    max(N * prefix FLOPs / rate, prefix weights / bandwidth)
      + num_steps * max(N * suffix FLOPs / rate, expert weights / bandwidth)

with, per robot, prefix FLOPs ``2 x PaliGemma's decoder params`` per prefix position (every
camera's patches and the prompt) plus ``2 x the tower's and projector's params`` per patch of
every camera, and suffix FLOPs ``2 x the expert's params`` per suffix token (the chunk, and
pi0's state token). The prefix pass reads PaliGemma's decoder (not its embedding table: rows
are gathered), the tower and the projector; a denoising pass reads the expert and the
action/state/time projections, each at its stored width (the tower, the projector and the
projections stay float32, as LeRobot keeps them). pi0.5 at real sizes with two cameras and a
prompt of 143 tokens (655 prefix positions): 3.0 TFLOP of prefix and 0.04 TFLOP per
denoising pass; 5.7 GB of prefix weights and 0.86 GB per denoising pass. At run B's rates
(754 TFLOP/s, 4139 GB/s) the prefix pass is FLOP-bound (4.0 ms) and a denoising pass of
up to 3 robots bound by its weights (0.21 ms; 4 robots and more by their FLOPs): about
6.1 ms for one robot's step.

``robots_at_period`` is the FLOP ceiling: the robots whose steps' FLOPs fill a control period
at the matmul rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.lib.cost_model import DeviceRates


@dataclass(frozen=True, slots=True)
class Pi0Shape:
    """What the floor of a pi0 step needs of a model and its steps (per robot)."""

    language_params: int  # PaliGemma's decoder, no embedding table
    vision_params: int  # the tower and the projector
    expert_params: int  # the expert and the action / state / time projections
    language_bytes: int
    vision_bytes: int
    expert_bytes: int
    num_images: int  # cameras per step
    num_image_tokens: int  # patches of one image
    prefix_len: int  # positions of one robot's prefix (patches and prompt)
    suffix_len: int  # tokens of one robot's denoising pass
    num_steps: int  # denoising passes per step

    def __post_init__(self) -> None:
        for name in self.__slots__:
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')

    @property
    def prefix_flops(self) -> float:
        language = 2.0 * self.language_params * self.prefix_len
        return language + self.num_images * 2.0 * self.vision_params * self.num_image_tokens

    @property
    def suffix_flops(self) -> float:
        """One denoising pass of one robot."""
        return 2.0 * self.expert_params * self.suffix_len

    @property
    def step_flops(self) -> float:
        return self.prefix_flops + self.num_steps * self.suffix_flops


@dataclass(frozen=True, slots=True)
class Pi0StepFloor:
    """The floor of ``num_robots`` robots' steps batched (milliseconds)."""

    num_robots: int
    copy_gb_per_s: float
    matmul_tflops: float
    tflop: float  # the step's FLOPs
    prefix_ms: float  # the prefix pass's floor
    denoise_ms: float  # one denoising pass's floor
    compute_ms: float  # the step's FLOPs at the matmul rate
    weights_ms: float  # the weights its passes read over the copy bandwidth
    step_ms: float  # prefix_ms + num_steps * denoise_ms


def pi0_step_floor(shape: Pi0Shape, rates: DeviceRates, num_robots: int) -> Pi0StepFloor:
    """The floor of ``num_robots`` robots' steps of ``shape`` batched, at ``rates``."""
    if num_robots < 1:
        raise ValueError(f'num_robots must be >= 1, got {num_robots}')
    flop_s = rates.matmul_tflops * 1e12
    byte_s = rates.copy_gb_per_s * 1e9
    prefix_compute = num_robots * shape.prefix_flops / flop_s
    prefix_weights = (shape.language_bytes + shape.vision_bytes) / byte_s
    denoise_compute = num_robots * shape.suffix_flops / flop_s
    denoise_weights = shape.expert_bytes / byte_s
    prefix = max(prefix_compute, prefix_weights)
    denoise = max(denoise_compute, denoise_weights)
    return Pi0StepFloor(
        num_robots=num_robots,
        copy_gb_per_s=rates.copy_gb_per_s,
        matmul_tflops=rates.matmul_tflops,
        tflop=num_robots * shape.step_flops / 1e12,
        prefix_ms=prefix * 1e3,
        denoise_ms=denoise * 1e3,
        compute_ms=(prefix_compute + shape.num_steps * denoise_compute) * 1e3,
        weights_ms=(prefix_weights + shape.num_steps * denoise_weights) * 1e3,
        step_ms=(prefix + shape.num_steps * denoise) * 1e3,
    )


def robots_at_period(shape: Pi0Shape, rates: DeviceRates, period_s: float) -> float:
    """The FLOP ceiling: robots whose steps' FLOPs fill ``period_s`` at the matmul rate."""
    if not period_s > 0:
        raise ValueError(f'period_s must be > 0, got {period_s}')
    return period_s * rates.matmul_tflops * 1e12 / shape.step_flops


def _count(params) -> tuple[int, int]:
    params = list(params)
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)


def pi0_shape(model, *, num_images: int, prefix_len: int, chunk_size: int, num_steps: int):
    """The ``Pi0Shape`` of a loaded ``Pi0Model`` whose steps have ``num_images`` cameras and
    prefixes of ``prefix_len`` positions."""
    language = _count(p for name, p in model.language.named_parameters() if 'embed' not in name)
    vision = _count([*model.vision_tower.parameters(), *model.projector.parameters()])
    heads = ('state_proj', 'action_in_proj', 'action_out_proj', 'time_mlp_in', 'time_mlp_out',
             'action_time_mlp_in', 'action_time_mlp_out')  # fmt: skip
    expert_params = [*model.expert.parameters()]
    for name in heads:
        module = getattr(model, name, None)
        if module is not None:
            expert_params += list(module.parameters())
    expert = _count(expert_params)
    vision_size = model.sizes.vision
    return Pi0Shape(
        language_params=language[0],
        vision_params=vision[0],
        expert_params=expert[0],
        language_bytes=language[1],
        vision_bytes=vision[1],
        expert_bytes=expert[1],
        num_images=num_images,
        num_image_tokens=(vision_size.image_size // vision_size.patch_size) ** 2,
        prefix_len=prefix_len,
        suffix_len=model.suffix_len + chunk_size,
        num_steps=num_steps,
    )
