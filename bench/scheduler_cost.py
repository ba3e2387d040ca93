"""Scheduler CPU cost per step, without the model and as a share of a real step.

B requests (robot steps of the checkpoint's real prompt: session prefix, image span, suffix;
each its own robot and frame) are admitted and decode together; then ``--steps`` decode
iterations of ``Scheduler.run_once`` are timed with ``time.perf_counter_ns``:

- ``null`` runner: returns the tokens at once and costs nothing, so an iteration's time is
  the scheduler's own host work (batch selection, KV slot allocation, the ``ForwardBatch``,
  result processing, finishing). It is split into ``get_next_batch_to_run`` and result
  processing; the rest is the loop itself (batch snapshot, bookkeeping).
- ``model`` runner: the checkpoint's ``ModelRunner`` (tiny random checkpoint on the CPU by
  default). Time inside ``launch`` and ``result()`` is the model's (on the CPU ``launch``
  computes; on a GPU it only enqueues and ``result()`` waits); the share of the step
  outside it is the scheduler's.

Both with the overlap loop on and off. The overlap loop hides host work only where
``launch`` returns before the device is done, that is on a GPU: on the CPU both loops
do the same work in the same order, so their shares match.

    python -m bench.scheduler_cost                       # B = 1 .. 256, null and model
    python -m bench.scheduler_cost --batch-sizes 1 64 --steps 20 --runners null
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.lib.fleets import INSTRUCTION, FrameSource, step_request
from bench.lib.tables import markdown_table
from vla_sched.core.forward_batch import (
    ForwardBatch,
    ForwardMode,
    ForwardOutput,
)
from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.memory.pages import round_up_to_page
from vla_sched.core.scheduling.scheduler import Scheduler
from vla_sched.core.scheduling.scheduler_config import SchedulerConfig
from vla_sched.engine.config import EngineConfig
from vla_sched.model.families.openvla.family import num_state_values
from vla_sched.model.families.openvla.steps import StepTranslator
from vla_sched.model.families.protocol import TranslatedStep

RUNNERS = ('null', 'model')
PAGE_SIZE = 16


class _Ready:
    def __init__(self, output: ForwardOutput) -> None:
        self._output = output

    def result(self) -> ForwardOutput:
        return self._output


class NullRunner:
    """A runner with no model: every sampled row gets the first allowed token at once."""

    def launch(self, batch: ForwardBatch) -> _Ready:
        tokens = tuple(
            p.allowed_token_start if s else -1
            for p, s in zip(batch.sampling, batch.sample, strict=True)
        )
        return _Ready(ForwardOutput(tokens))


class StopWatch:
    """Accumulates the time spent inside wrapped calls (nanoseconds)."""

    def __init__(self) -> None:
        self.ns = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args, **kwargs):
            start = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns += time.perf_counter_ns() - start

        return timed


class TimedRunner:
    """A runner whose ``launch`` and ``result()`` time is added to ``watch``."""

    def __init__(self, inner, watch: StopWatch) -> None:
        self.inner, self.watch = inner, watch

    def launch(self, batch: ForwardBatch):
        handle = self.watch.wrap(self.inner.launch)(batch)
        return _TimedHandle(handle, self.watch)


class _TimedHandle:
    def __init__(self, inner, watch: StopWatch) -> None:
        self.inner, self.watch = inner, watch

    def result(self) -> ForwardOutput:
        return self.watch.wrap(self.inner.result)()


def robot_steps(
    translator: StepTranslator, num_robots: int, *, max_new_tokens: int
) -> list[TranslatedStep]:
    """Step 1 of robots ``0..num_robots-1`` as the engine builds it (the checkpoint's
    prompt, each robot its own session and a fresh frame), decoding ``max_new_tokens``
    instead of H x D so the batch keeps decoding while it is timed."""
    spec = translator.spec
    size = spec.preprocessing.image_size
    frames = FrameSource(width=size, height=size)
    far = time.monotonic_ns() + 3600 * 10**9  # nothing expires while measured
    steps = []
    for robot in range(num_robots):
        request = step_request(
            robot, 1, stamp_ns=0, deadline_ns=far, received_ns=0, frame=frames.frame(robot),
            num_state=num_state_values(spec),
        )  # fmt: skip
        step = translator.translate(request)
        step.req.max_new_tokens = max_new_tokens
        steps.append(step)
    return steps


@dataclass
class CostPoint:
    """Per decode step at one batch size, one runner, one loop (microseconds; medians)."""

    runner: str
    overlap: bool
    batch_size: int
    step_us: float
    next_batch_us: float
    process_us: float
    model_us: float
    admit_ms: float  # host time from queued to all B decoding, model time excluded

    @property
    def sched_us(self) -> float:
        return self.step_us - self.model_us

    @property
    def sched_share(self) -> float:
        return self.sched_us / self.step_us if self.step_us > 0 else 0.0


def build_scheduler(
    batch_size: int,
    max_new_tokens: int,
    prompt_len: int,
    *,
    overlap: bool,
    runner_factory: Callable[[KVMemory], Any],
) -> Scheduler:
    context = prompt_len + max_new_tokens + PAGE_SIZE
    context = round_up_to_page(context, PAGE_SIZE)
    memory = KVMemory(
        KVMemoryConfig(
            num_pages=batch_size * context // PAGE_SIZE + 16,
            page_size=PAGE_SIZE,
            # One spare row: a chunked request resumed in a pass holds its row already, but
            # the prefill pass counts it against the free rows, which can strand the last
            # request in the queue until another one finishes.
            num_req_slots=batch_size + 1,
            max_context_len=context,
            session_idle_timeout_s=0.0,
        )
    )
    config = SchedulerConfig(
        max_running_requests=batch_size,
        chunked_prefill_size=4096,
        max_prefill_tokens=1 << 16,
        enable_overlap=overlap,
    )
    return Scheduler(config, memory, runner_factory(memory), clock=time.monotonic_ns)


def measure(
    runner: str,
    batch_size: int,
    translator: StepTranslator,
    *,
    overlap: bool,
    num_steps: int,
    runner_factory: Callable[[KVMemory], Any],
) -> CostPoint:
    """Admit ``batch_size`` requests, then time ``num_steps`` decode iterations."""
    max_new_tokens = num_steps + 64
    steps = robot_steps(translator, batch_size, max_new_tokens=max_new_tokens)
    model = StopWatch()
    sched = build_scheduler(
        batch_size,
        max_new_tokens,
        len(steps[0].req.origin_input_ids),
        overlap=overlap,
        runner_factory=lambda memory: TimedRunner(runner_factory(memory), model),
    )
    next_batch, process = StopWatch(), StopWatch()
    sched.get_next_batch_to_run = next_batch.wrap(sched.get_next_batch_to_run)
    sched.loop.results.process = process.wrap(sched.loop.results.process)
    start = time.perf_counter_ns()
    for i, step in enumerate(steps):
        sched.open_or_update_session(
            step.req.robot_id, step.session_prefix, instruction_version=step.instruction_version
        )
        if sched.add_request(step.req) is not None:
            raise RuntimeError(f'request {i} of {batch_size} was refused')
    while not _all_decoding(sched, batch_size):
        sched.run_once()
        if time.perf_counter_ns() - start > 600e9:
            raise RuntimeError(f'{batch_size} requests did not reach decode')
    admit_ns = time.perf_counter_ns() - start - model.ns
    samples = []
    for _ in range(num_steps):
        before = (model.ns, next_batch.ns, process.ns)
        t0 = time.perf_counter_ns()
        sched.run_once()
        wall = time.perf_counter_ns() - t0
        samples.append(
            (
                wall,
                *(
                    now - b
                    for now, b in zip((model.ns, next_batch.ns, process.ns), before, strict=True)
                ),
            )
        )
        if sched.last_batch is None or len(sched.last_batch.reqs) != batch_size:
            raise RuntimeError(f'batch of {batch_size} stopped decoding while measured')

    def med(k: int) -> float:
        return statistics.median(s[k] for s in samples) / 1e3

    return CostPoint(runner, overlap, batch_size, med(0), med(2), med(3), med(1), admit_ns / 1e6)


def _all_decoding(sched: Scheduler, batch_size: int) -> bool:
    last = sched.last_batch
    return (
        last is not None
        and last.forward_batch is not None
        and last.forward_batch.forward_mode is ForwardMode.DECODE
        and len(last.reqs) == batch_size
    )


def model_runner_factory(folder: Path, device: str, dtype: torch.dtype):
    """Loads the checkpoint once; each scheduler gets a runner on its own slot table."""
    from vla_sched.model.loading.checkpoint import load_checkpoint
    from vla_sched.model.runner.model_runner import ModelRunner, RunnerConfig

    model = load_checkpoint(folder, device=torch.device(device), dtype=dtype)
    graphs = torch.device(device).type == 'cuda'

    def factory(memory: KVMemory) -> ModelRunner:
        # The decode batch is the memory's request rows less the spare one: capture only it.
        batch_size = memory.req_to_token_pool.num_req_slots - 1
        return ModelRunner(
            model,
            req_to_token=memory.req_to_token_pool.req_to_token,
            num_kv_slots=(memory.allocator.num_pages + 1) * memory.page_size,
            config=RunnerConfig(cuda_graphs=graphs, decode_batch_sizes=(batch_size,)),
        )

    return factory


def release_device_memory() -> None:
    """Free the last scheduler's KV and graphs before the next one (a 7B KV pool is GBs)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run(args: argparse.Namespace) -> list[CostPoint]:
    from vla_sched.engine.checkpoints import open_served, resolve_checkpoint

    folder, _ = resolve_checkpoint(args.model_path)
    translator = open_served(folder, EngineConfig(model_path=args.model_path)).translator
    layout = translator.prompts.build(INSTRUCTION)
    factories: dict[str, Callable[[KVMemory], Any]] = {'null': lambda memory: NullRunner()}
    if 'model' in args.runners:
        dtype = torch.bfloat16 if args.device == 'cuda' else torch.float32
        factories['model'] = model_runner_factory(folder, args.device, dtype)
    print(
        f'scheduler cost: {folder.name}, prompt {len(layout.token_ids)} tokens '
        f'({layout.num_image_tokens} image), {args.steps} decode steps per point, device '
        f'{args.device}, torch threads {torch.get_num_threads()}',
        flush=True,
    )
    points = []
    for runner in args.runners:
        for overlap in (False, True):
            for b in args.batch_sizes:
                point = measure(
                    runner,
                    b,
                    translator,
                    overlap=overlap,
                    num_steps=args.steps,
                    runner_factory=factories[runner],
                )
                print(format_point(point), flush=True)
                points.append(point)
                release_device_memory()
    return points


def format_point(p: CostPoint) -> str:
    return (
        f'{p.runner:>5} overlap={"on " if p.overlap else "off"} B={p.batch_size:<4} step '
        f'{p.step_us:9.0f} us, scheduler {p.sched_us:8.0f} us ({100 * p.sched_share:4.1f}%), '
        f'next batch {p.next_batch_us:7.0f} us, results {p.process_us:7.0f} us, '
        f'admit {p.admit_ms:7.1f} ms'
    )


def cost_table(points: list[CostPoint]) -> str:
    headers = ['runner', 'overlap', 'batch', 'step us', 'scheduler us', 'per request us']
    headers += ['scheduler share', 'next batch us', 'results us', 'admit B ms']
    rows = [
        [
            p.runner,
            'on' if p.overlap else 'off',
            p.batch_size,
            f'{p.step_us:.0f}',
            f'{p.sched_us:.0f}',
            f'{p.sched_us / p.batch_size:.1f}',
            f'{100 * p.sched_share:.1f}%',
            f'{p.next_batch_us:.0f}',
            f'{p.process_us:.0f}',
            f'{p.admit_ms:.1f}',
        ]
        for p in points
    ]
    return markdown_table(headers, rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument(
        '--batch-sizes', type=int, nargs='+', default=[1, 2, 4, 8, 16, 32, 64, 128, 256]
    )
    parser.add_argument('--steps', type=int, default=30, help='timed decode steps per point')
    parser.add_argument('--runners', nargs='+', choices=RUNNERS, default=list(RUNNERS))
    parser.add_argument('--model-path', default='', help='checkpoint (default: the tiny one)')
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu')
    parser.add_argument('--threads', type=int, default=1, help='torch threads on the CPU')
    parser.add_argument('--json', default='', help='write the results here')
    args = parser.parse_args(argv)
    if min(args.batch_sizes) < 1 or args.steps < 1 or args.threads < 1:
        parser.error('--batch-sizes, --steps and --threads must be >= 1')
    return args


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    points = run(args)
    print()
    print(cost_table(points))
    if args.json:
        rows = [{**dataclasses.asdict(p), 'sched_us': p.sched_us} for p in points]
        Path(args.json).write_text(json.dumps({'points': rows}, indent=1) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
