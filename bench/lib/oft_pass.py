"""Timing OpenVLA-OFT passes: N robots' steps in one ``ParallelActionRunner`` call.

``oft_batch`` builds the prefill-only batch the scheduler would give the runner for N robots
with the same instruction: each robot's whole sequence on its own row of a slot table, every
camera image at its span with a content hash of its own (``first_hash`` onward), so the
runner's feature cache never spares the towers. ``runner_beside`` makes a runner that shares
the weights and the KV caches of another (the engine core's), so the model is loaded once:
eager, or on the padded path (captured as CUDA graphs on a GPU, as the engine serves it).
``time_oft_pass`` times whole calls on it (both cameras through the towers, the decoder and
the head over every pass of the batch, the chunk on the host) and counts what its paths ran;
``oft_relative_error`` compares two such runners' outputs on the same batch.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from vla_sched.core.forward_batch import ForwardBatch, ForwardMode, ImageInput, SamplingParams
from vla_sched.model.families.openvla_oft.graphs import NUM_OFT_PADDING_SLOTS
from vla_sched.model.families.openvla_oft.passes import OFTPassSizes
from vla_sched.model.families.openvla_oft.prompt import OFTPrompt
from vla_sched.model.families.openvla_oft.runner import ParallelActionRunner
from vla_sched.model.runner.padding_stats import PaddingStats

# A prefill-only request samples nothing; its sampling range is never read.
_NO_SAMPLING = SamplingParams(allowed_token_start=0, allowed_token_end=1)


def oft_batch(
    prompt: OFTPrompt, frames: list[tuple[np.ndarray, ...]], *, first_hash: int
) -> ForwardBatch:
    """The pass of ``len(frames)`` robots' steps on ``prompt``, robot ``i`` on row ``i`` of
    a ``[N, seq_len]`` slot table (``slot_table``) with ``frames[i]`` as its cameras'
    images, hashed ``first_hash``, ``first_hash + 1``, ... in robot then camera order."""
    layout = prompt.layout
    num_robots = len(frames)
    seq_len = len(prompt.token_ids)
    images = []
    for robot, cameras in enumerate(frames):
        base = first_hash + robot * len(cameras)
        images.append(
            tuple(
                ImageInput(base + c, layout.image_offset(c), layout.num_image_tokens, pixels)
                for c, pixels in enumerate(cameras)
            )
        )
    lens = torch.full((num_robots,), seq_len, dtype=torch.int64)
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        rids=tuple(f'robot_{i}' for i in range(num_robots)),
        req_pool_indices=torch.arange(num_robots, dtype=torch.int64),
        prefix_lens=torch.zeros_like(lens),
        extend_lens=lens,
        seq_lens=lens,
        input_ids=torch.tensor(prompt.token_ids * num_robots, dtype=torch.int64),
        out_cache_loc=slot_table(num_robots, seq_len).flatten().to(torch.int64),
        sample=(True,) * num_robots,
        sampling=(_NO_SAMPLING,) * num_robots,
        images=tuple(images),
        prefill_only=True,
    )


def slot_table(num_robots: int, seq_len: int) -> torch.Tensor:
    """``int32 [num_robots, seq_len]``: robot ``i``'s positions on slots ``i * seq_len ...``."""
    return torch.arange(num_robots * seq_len, dtype=torch.int32).view(num_robots, seq_len)


def runner_beside(
    runner: ParallelActionRunner, *, num_robots: int, seq_len: int, cuda_graphs: bool = False,
    pass_sizes: OFTPassSizes | None = None,
) -> ParallelActionRunner:  # fmt: skip
    """A runner on ``runner``'s model and KV caches for passes of up to ``num_robots`` robots
    of ``seq_len`` positions (its slot table: ``slot_table``): eager, or on the padded path
    at ``pass_sizes`` (captured with ``cuda_graphs``, on a CUDA device only). Each padded
    runner captures its own graphs and their pool: build one for the largest robot count and
    run the smaller counts on it.

    Raises:
        ValueError: when the shared caches cannot hold the robots' sequences (and, on the
            padded path, the padding tokens' reserved slots past them).
    """
    table = slot_table(num_robots, seq_len)
    padded = cuda_graphs or pass_sizes is not None
    num_slots = table.numel() + (NUM_OFT_PADDING_SLOTS if padded else 0)
    available = runner.kv_caches[0][0].shape[0]
    if num_slots > available:
        raise ValueError(
            f'{num_robots} robots of {seq_len} positions need {num_slots} KV slots'
            f'{" with the padding slots" if padded else ""}, the caches hold {available}'
        )
    return ParallelActionRunner(
        runner.model, req_to_token=table, num_kv_slots=table.numel(), backend=runner.backend,
        kv_caches=runner.kv_caches, feature_cache_size=1, cuda_graphs=cuda_graphs,
        pass_sizes=pass_sizes,
    )  # fmt: skip


def random_frames(
    rng: np.random.Generator, *, num_robots: int, num_images: int, frame_size: int
) -> list[tuple[np.ndarray, ...]]:
    """Each robot's camera images, uint8 ``[frame_size, frame_size, 3]`` drawn from ``rng``."""
    return [
        tuple(rng.integers(0, 256, (frame_size, frame_size, 3), dtype=np.uint8)
              for _ in range(num_images))
        for _ in range(num_robots)
    ]  # fmt: skip


def _states(runner: ParallelActionRunner, state: np.ndarray, num_robots: int) -> list:
    uses_proprio = runner.model.spec.settings.use_proprio
    return [state if uses_proprio else None] * num_robots


def _check_capacity(runner: ParallelActionRunner, num_robots: int) -> None:
    num_rows = runner.req_to_token.shape[0]
    if num_robots > num_rows:
        raise ValueError(f'{num_robots} robots, the slot table of the runner has {num_rows} rows')


@dataclass(frozen=True, slots=True)
class PassTimes:
    """Host wall times of whole calls of ``num_robots`` robots (milliseconds), and what the
    runner's paths ran during the timed calls (``ParallelActionRunner.padding_stats``:
    ``'oft'`` in tokens, ``'vision'`` in images; the warm-up calls not counted)."""

    num_robots: int
    seq_len: int
    times_ms: tuple[float, ...]
    chunk_shape: tuple[int, ...]  # one robot's actions
    padding: dict[str, PaddingStats]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)


def time_oft_pass(
    runner: ParallelActionRunner, prompt: OFTPrompt, *, num_robots: int, state: np.ndarray,
    frame_size: int = 224, warmup: int = 2, reps: int = 5, seed: int = 0,
) -> PassTimes:  # fmt: skip
    """Median-ready times of ``reps`` calls of ``num_robots`` robots after ``warmup``, on
    ``runner`` (``runner_beside``: robot ``i`` on row ``i`` of its slot table); fresh
    content hashes per call, so every image goes through the towers. ``state`` is every
    robot's state.

    Raises:
        ValueError: for more robots than the runner's slot table has rows.
        AssertionError: for non-finite actions.
    """
    _check_capacity(runner, num_robots)
    seq_len = len(prompt.token_ids)
    num_images = runner.model.spec.settings.num_images
    rng = np.random.default_rng(seed)
    frames = random_frames(
        rng, num_robots=num_robots, num_images=num_images, frame_size=frame_size
    )
    states = _states(runner, state, num_robots)
    times, chunk_shape = [], ()
    before = runner.padding_stats()
    for i in range(warmup + reps):
        if i == warmup:
            before = runner.padding_stats()
        batch = oft_batch(prompt, frames, first_hash=(seed << 32) + i * num_robots * num_images)
        started = time.perf_counter()
        actions = runner.forward_actions(batch, states=states)  # on the host when it returns
        elapsed_ms = (time.perf_counter() - started) * 1e3
        if not np.isfinite(actions).all():
            raise AssertionError(f'{num_robots} robots: non-finite actions')
        chunk_shape = tuple(actions.shape[1:])
        if i >= warmup:
            times.append(elapsed_ms)
    after = runner.padding_stats()
    padding = {path: stats.since(before[path]) for path, stats in after.items()}
    return PassTimes(num_robots, seq_len, tuple(times), chunk_shape, padding)


def oft_relative_error(
    runner: ParallelActionRunner, reference: ParallelActionRunner, prompt: OFTPrompt, *,
    num_robots: int, state: np.ndarray, frame_size: int = 224, seed: int = 0,
) -> float:  # fmt: skip
    """``runner``'s head output against ``reference``'s on the same batch of ``num_robots``
    robots (the same images, hashes, states and slots; both runners from ``runner_beside``
    on the same model): ``max |ours - theirs| / max |theirs|`` in float32, over every action
    value of every robot, before un-normalization (which both share).

    Raises:
        ValueError: for more robots than either slot table has rows.
    """
    for r in (runner, reference):
        _check_capacity(r, num_robots)
    num_images = runner.model.spec.settings.num_images
    rng = np.random.default_rng(seed)
    frames = random_frames(
        rng, num_robots=num_robots, num_images=num_images, frame_size=frame_size
    )
    batch = oft_batch(prompt, frames, first_hash=(seed << 32) + (1 << 31))
    states = _states(runner, state, num_robots)
    ours = runner.forward_normalized(batch, states=states).float()
    theirs = reference.forward_normalized(batch, states=states).float()
    scale = theirs.abs().max().clamp_min(1e-30)
    return float((ours - theirs).abs().max() / scale)
