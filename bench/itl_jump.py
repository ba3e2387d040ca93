"""Does a new image's prefill make a running robot's inter-token latency jump?

The real engine core (``ScheduledCore``: scheduler, paged KV, the checkpoint's model runner;
the tiny random checkpoint on the CPU by default) serves N robots (``bench/lib/fleets.py``:
a camera every ``--period`` seconds, phases spread over the period, at most one step in
flight, the newest image waiting). Every launched batch is recorded with its start and end
(a runner wrapper given to the core); every output token of every finished step with the
time the scheduler processed it. Each gap between two tokens of a step is classified by
whether a prefill (extend) pass ran inside it (``bench/lib/itl.py``, as the simulator does).
The scheduler variants (given to the core as its ``scheduler_config``):

- ``sglang``: prefill first (delayer off), no chunking, no decode interval;
- ``delayer``: the prefill delayer on with its near-done trigger (``--near-done`` tokens);
- ``chunked``: chunked prefill of ``--chunk`` tokens;
- ``delayer+chunked``: both;
- ``engine default``: what the engine ships (delayer on with only its KV-headroom trigger,
  chunk 256, one decode-only pass after each prefill the running steps sat out, mixed
  passes and decode bursts on the CPU);
- ``unmixed``: the engine default without mixed passes.

``--hold-decodes`` holds each decode pass, while a robot is idle, until that robot's next
image is due, so its step is queued while the running step still decodes: every run then
has prefills inside running steps' gaps, however fast the machine (the worst case for the
jump, and what the tests use).

    python -m bench.itl_jump                    # 8 robots at 5 Hz, 6 variants x 10 s
    python -m bench.itl_jump --robots 4 --duration 5 --variants sglang delayer
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.lib.fleets import Fleet, FleetTiming, FrameSource, robot_index, step_request
from bench.lib.itl import ItlSummary, itl_gaps
from bench.lib.stats import percentile
from bench.lib.tables import markdown_table
from bench.scheduler_cost import release_device_memory
from vla_sched.core.forward_batch import ForwardBatch, ForwardMode
from vla_sched.core.scheduling.request import FinishKind, Req
from vla_sched.core.scheduling.scheduler_config import PrefillDelayerConfig, SchedulerConfig
from vla_sched.engine.assembly import assemble_core
from vla_sched.engine.config import EngineConfig
from vla_sched.engine.scheduled_core import ScheduledCore
from vla_sched.testing.sim_runner import StepRecord

VARIANTS = ('sglang', 'delayer', 'chunked', 'delayer+chunked', 'engine default', 'unmixed')


@dataclass(frozen=True, slots=True)
class Variant:
    """Scheduler settings under test; ``None`` keeps the engine's own setting."""

    name: str
    delayer: PrefillDelayerConfig | None = None
    chunked_prefill_size: int | None = None
    prefill_decode_interval: int | None = None

    def apply(self, config: SchedulerConfig) -> SchedulerConfig:
        if self.name == 'engine default':
            return config
        if self.name == 'unmixed':
            return dataclasses.replace(config, enable_mixed_chunk=False)
        return dataclasses.replace(
            config,
            prefill_delayer=self.delayer or PrefillDelayerConfig(enabled=False),
            chunked_prefill_size=self.chunked_prefill_size,
            prefill_decode_interval=self.prefill_decode_interval or 0,
        )


def make_variants(names: list[str], *, chunk: int, near_done: int) -> list[Variant]:
    delayer = PrefillDelayerConfig(enabled=True, near_done_decode_tokens=near_done)
    table = {
        'sglang': Variant('sglang'),
        'delayer': Variant('delayer', delayer=delayer),
        'chunked': Variant('chunked', chunked_prefill_size=chunk),
        'delayer+chunked': Variant('delayer+chunked', delayer=delayer, chunked_prefill_size=chunk),
        'engine default': Variant('engine default'),
        'unmixed': Variant('unmixed'),
    }
    return [table[name] for name in names]


class LaunchRecorder:
    """A runner that records each launched batch as a ``StepRecord`` in ``steps``: it ends
    when ``launch`` returns on the CPU (which computes there), else when its tokens are
    first waited for. With ``hold``, a decode pass first waits until ``hold()`` (an instant
    on the wall clock, or None: no wait)."""

    def __init__(self, inner, *, on_cpu: bool, hold: Callable[[], int | None] | None) -> None:
        self.inner, self.on_cpu, self.hold = inner, on_cpu, hold
        self.steps: list[StepRecord] = []

    def launch(self, batch: ForwardBatch):
        if self.hold is not None and batch.forward_mode is ForwardMode.DECODE:
            due = self.hold()
            if due is not None:
                time.sleep(max(0, due - time.time_ns()) / 1e9)
        start = time.time_ns()
        handle = self.inner.launch(batch)
        if self.on_cpu:
            self._record(batch, start)
            return handle
        return _EndStamp(handle, lambda: self._record(batch, start))

    def _record(self, batch: ForwardBatch, start_ns: int) -> None:
        self.steps.append(
            StepRecord(
                batch.forward_mode, batch.batch_size, batch.num_tokens, start_ns, time.time_ns()
            )
        )


class _EndStamp:
    """A result handle that calls ``on_end`` once, when its tokens first arrive."""

    def __init__(self, handle, on_end) -> None:
        self.handle, self.on_end = handle, on_end

    def result(self):
        output = self.handle.result()
        if self.on_end is not None:
            self.on_end()
            self.on_end = None
        return output


class JumpRun:
    """The core under one variant, its launch recorder, and the fleet it is driving."""

    def __init__(self, config: EngineConfig, variant: Variant, *, hold_decodes: bool) -> None:
        self.fleet: Fleet | None = None
        self.recorder: LaunchRecorder | None = None
        device_type = 'cuda' if config.device == 'cuda' else 'cpu'

        def wrap(runner):
            hold = self._next_idle_image if hold_decodes else None
            self.recorder = LaunchRecorder(runner, on_cpu=device_type == 'cpu', hold=hold)
            return self.recorder

        parts = assemble_core(config)
        self.core = ScheduledCore(
            dataclasses.replace(
                parts,
                scheduler_config=variant.apply(parts.scheduler_config),
                runner=wrap(parts.runner),
            )
        )

    def _next_idle_image(self) -> int | None:
        return self.fleet.next_idle_image_ns() if self.fleet is not None else None

    def drive(self, num_robots: int, period_s: float, duration_s: float) -> tuple[list[Req], int]:
        """A fleet of ``num_robots`` for ``duration_s``; the requests that finished and the
        number of steps sent."""
        timing = FleetTiming(
            period_s=period_s, budget_s=60.0, warmup_s=0.0, duration_s=duration_s,
            phases='spread',
        )  # fmt: skip
        fleet = self.fleet = Fleet(num_robots, timing, start_ns=time.time_ns())
        frames = FrameSource(width=64, height=64)
        core, done = self.core, []

        def send(step) -> None:
            if step is None:
                return
            now = time.time_ns()
            request = step_request(
                step.robot, step.seq, stamp_ns=step.stamp_ns, deadline_ns=step.deadline_ns,
                received_ns=now, frame=frames.frame(step.seq * 31 + step.robot),
                num_state=core.info.num_state,
            )  # fmt: skip
            if core.submit(request, now):
                raise RuntimeError(f'robot_{step.robot} step {step.seq} was refused')

        while not fleet.done():
            for step in fleet.images_until(time.time_ns()):
                send(step)
            if core.has_work():
                for req in core.scheduler.run_once():
                    delivered = req.finished_reason.kind is FinishKind.LENGTH
                    if delivered:
                        done.append(req)
                    send(
                        fleet.ended(robot_index(req.robot_id), time.time_ns(), delivered=delivered)
                    )
            else:
                due = fleet.next_image_ns()
                time.sleep(max(0, due - time.time_ns()) / 1e9 if due is not None else 0.0)
        self.fleet = None
        return done, fleet.num_sent


@dataclass
class JumpResult:
    """One variant's inter-token and step latencies (milliseconds)."""

    variant: str
    num_steps_done: int
    num_steps_sent: int
    itl_clean_p50: float
    itl_clean_p99: float
    itl_prefill_p50: float
    itl_prefill_p99: float
    itl_max: float
    prefill_gap_share: float
    step_p50: float
    step_p99: float
    num_delayed_prefills: int
    num_prefill_batches: int


def run_variant(variant: Variant, args: argparse.Namespace) -> JumpResult:
    config = EngineConfig(model_path=args.model_path, device=args.device, cpu_threads=args.threads)
    run = JumpRun(config, variant, hold_decodes=args.hold_decodes)
    run.drive(args.robots, args.period, min(2.0, args.duration))
    run.recorder.steps.clear()  # warm-up (first images, the shared prefix) is not measured
    done, num_sent = run.drive(args.robots, args.period, args.duration)
    steps = run.recorder.steps
    itl = ItlSummary.of(*itl_gaps(done, steps))
    latency = [(r.times.finished_ns - r.times.arrival_ns) / 1e6 for r in done]
    metrics = run.core.scheduler.metrics
    result = JumpResult(
        variant=variant.name,
        num_steps_done=len(done),
        num_steps_sent=num_sent,
        itl_clean_p50=itl.clean_p50,
        itl_clean_p99=itl.clean_p99,
        itl_prefill_p50=itl.prefill_p50,
        itl_prefill_p99=itl.prefill_p99,
        itl_max=itl.max,
        prefill_gap_share=itl.prefill_gap_share,
        step_p50=percentile(latency, 50),
        step_p99=percentile(latency, 99),
        num_delayed_prefills=metrics.num_delayed_prefills,
        num_prefill_batches=sum(1 for s in steps if s.forward_mode is ForwardMode.EXTEND),
    )
    run.core.close()
    release_device_memory()
    return result


HEADERS = (
    'variant', 'steps done/sent', 'ITL p50 ms', 'ITL p99 ms', 'ITL with prefill p50 ms',
    'ITL with prefill p99 ms', 'ITL max ms', 'gaps with prefill', 'step p50 ms', 'step p99 ms',
    'delayed passes',
)  # fmt: skip


def table_row(r: JumpResult) -> list[object]:
    return [
        r.variant,
        f'{r.num_steps_done}/{r.num_steps_sent}',
        r.itl_clean_p50, r.itl_clean_p99, r.itl_prefill_p50, r.itl_prefill_p99, r.itl_max,
        f'{100 * r.prefill_gap_share:.0f}%',
        r.step_p50, r.step_p99, r.num_delayed_prefills,
    ]  # fmt: skip


def summarize_repeats(results: list[JumpResult]) -> JumpResult:
    """Field by field median of repeated runs of one variant."""
    fields = dataclasses.fields(JumpResult)
    values = {}
    for f in fields:
        column = [getattr(r, f.name) for r in results]
        values[f.name] = column[0] if f.name == 'variant' else statistics.median(column)
        if f.type == 'int' and f.name != 'variant':
            values[f.name] = round(values[f.name])
    return JumpResult(**values)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--robots', type=int, default=8)
    parser.add_argument('--period', type=float, default=0.2, help='control period (s)')
    parser.add_argument('--duration', type=float, default=10.0, help='measured seconds')
    parser.add_argument('--repeats', type=int, default=1, help='runs per variant (median)')
    parser.add_argument('--variants', nargs='+', choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument('--chunk', type=int, default=16, help='chunked prefill size (tokens)')
    parser.add_argument('--near-done', type=int, default=4, help="delayer's near-done tokens")
    parser.add_argument('--model-path', default='', help='checkpoint (default: the tiny one)')
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu')
    parser.add_argument('--threads', type=int, default=1, help='torch threads on the CPU')
    parser.add_argument(
        '--hold-decodes',
        action='store_true',
        help="hold a decode pass until an idle robot's next image is due",
    )
    parser.add_argument('--json', default='', help='write the results here')
    args = parser.parse_args(argv)
    if min(args.robots, args.repeats, args.chunk, args.threads) < 1 or args.near_done < 0:
        parser.error('--robots, --repeats, --chunk, --threads must be >= 1, --near-done >= 0')
    if args.period <= 0 or args.duration <= 0:
        parser.error('--period and --duration must be > 0')
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    variants = make_variants(args.variants, chunk=args.chunk, near_done=args.near_done)
    print(
        f'ITL jump: {args.robots} robots every {args.period} s, {args.duration} s measured '
        f'x {args.repeats}, chunk {args.chunk} tokens, near-done {args.near_done} tokens, '
        f'device {args.device}',
        flush=True,
    )
    results = []
    for variant in variants:
        runs = [run_variant(variant, args) for _ in range(args.repeats)]
        results.append(summarize_repeats(runs))
        print(markdown_table(HEADERS, [table_row(results[-1])], digits=1).splitlines()[-1])
    print()
    print(markdown_table(HEADERS, [table_row(r) for r in results], digits=1))
    if args.json:
        rows = [dataclasses.asdict(r) for r in results]
        Path(args.json).write_text(json.dumps({'results': rows}, indent=1) + '\n')
    return 0 if all(r.num_steps_done > 0 for r in results) else 1


if __name__ == '__main__':
    sys.exit(main())
