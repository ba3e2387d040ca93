"""Timing OpenVLA-OFT passes: N robots' steps in one ``ParallelActionRunner`` pass.

``oft_batch`` builds the prefill-only batch the scheduler would give the runner for N robots
with the same instruction: each robot's whole sequence on its own row of a slot table, every
camera image at its span with a content hash of its own (``first_hash`` onward), so the
runner's feature cache never spares the towers. ``time_oft_pass`` times whole passes (both
cameras through the towers, the one-pass decoder, the head, the chunk on the host) on a
runner that shares the weights and the KV caches of another (the engine core's), so the
model is loaded once.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from vla_sched.core.forward_batch import ForwardBatch, ForwardMode, ImageInput, SamplingParams
from vla_sched.model.prompting.oft_prompt import OFTPrompt
from vla_sched.model.runner.action_chunk_runner import ParallelActionRunner

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


@dataclass(frozen=True, slots=True)
class PassTimes:
    """Host wall times of whole passes of ``num_robots`` robots (milliseconds)."""

    num_robots: int
    seq_len: int
    times_ms: tuple[float, ...]
    chunk_shape: tuple[int, ...]  # one robot's actions

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)


def time_oft_pass(
    runner: ParallelActionRunner, prompt: OFTPrompt, *, num_robots: int, state: np.ndarray,
    frame_size: int = 224, warmup: int = 2, reps: int = 5, seed: int = 0,
) -> PassTimes:  # fmt: skip
    """Median-ready times of ``reps`` passes of ``num_robots`` robots after ``warmup``, on
    a runner sharing ``runner``'s model and KV caches; fresh content hashes per pass, so
    every image goes through the towers. ``state`` is every robot's state."""
    model = runner.model
    seq_len = len(prompt.token_ids)
    table = slot_table(num_robots, seq_len)
    if table.numel() > runner.num_kv_slots:
        raise ValueError(
            f'{num_robots} robots of {seq_len} positions need {table.numel()} KV slots, the '
            f'runner has {runner.num_kv_slots}'
        )
    timed = ParallelActionRunner(
        model, req_to_token=table, num_kv_slots=table.numel(), backend=runner.backend,
        kv_caches=runner.kv_caches, feature_cache_size=1,
    )  # fmt: skip
    rng = np.random.default_rng(seed)
    num_images = model.spec.settings.num_images
    frames = [
        tuple(rng.integers(0, 256, (frame_size, frame_size, 3), dtype=np.uint8)
              for _ in range(num_images))
        for _ in range(num_robots)
    ]  # fmt: skip
    states = [state] * num_robots if model.spec.settings.use_proprio else [None] * num_robots
    times, chunk_shape = [], ()
    for i in range(warmup + reps):
        batch = oft_batch(prompt, frames, first_hash=(seed << 32) + i * num_robots * num_images)
        started = time.perf_counter()
        actions = timed.forward_actions(batch, states=states)  # on the host when it returns
        elapsed_ms = (time.perf_counter() - started) * 1e3
        if not np.isfinite(actions).all():
            raise AssertionError(f'{num_robots} robots: non-finite actions')
        chunk_shape = tuple(actions.shape[1:])
        if i >= warmup:
            times.append(elapsed_ms)
    return PassTimes(num_robots, seq_len, tuple(times), chunk_shape)
