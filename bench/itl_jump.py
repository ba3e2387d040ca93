"""Does a new image's prefill make a running robot's inter-token latency jump?

The real engine core (``ScheduledCore``: scheduler, paged KV, the checkpoint's model runner;
the tiny random checkpoint on the CPU by default) serves N robots that each send a control
step (a fresh frame) every ``--period`` seconds, at most one in flight. Every launched batch
is recorded with its start and end; every output token of every finished step with the time
the scheduler processed it. Each gap between two tokens of a step is classified by whether a
prefill (extend) batch ran inside it, as ``bench/sim_scheduler.py`` does on its simulated
GPU. The scheduler variants:

- ``sglang``: prefill first (delayer off), no chunking, no decode interval;
- ``delayer``: the prefill delayer on with its near-done trigger (``--near-done`` tokens);
- ``chunked``: chunked prefill of ``--chunk`` tokens;
- ``delayer+chunked``: both;
- ``engine default``: what the engine ships (delayer on with only its KV-headroom trigger,
  chunk 256, one decode-only pass after each prefill the running steps sat out, mixed
  passes and decode bursts on the CPU);
- ``unmixed``: the engine default without mixed passes.

    python bench/itl_jump.py                    # 8 robots at 5 Hz, 6 variants x 10 s
    python bench/itl_jump.py --robots 4 --duration 5 --variants sglang delayer
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from bench.scheduler_cost import release_device_memory
from bench.sim_scheduler import itl_samples
from vla_sched.core.forward_batch import ForwardBatch, ForwardMode
from vla_sched.core.scheduling.request import FinishKind, Req
from vla_sched.core.scheduling.scheduler_config import PrefillDelayerConfig, SchedulerConfig
from vla_sched.engine.config import EngineConfig
from vla_sched.engine.scheduled_core import ScheduledCore
from vla_sched.ipc.messages import StepRequest
from vla_sched.synthetic_frames import synthetic_frame
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


class VariantCore(ScheduledCore):
    """The engine core with a scheduler variant and a record of every launched batch."""

    def __init__(self, config: EngineConfig, variant: Variant) -> None:
        from vla_sched.engine.checkpoints import resolve_checkpoint

        self.variant = variant
        self.steps: list[StepRecord] = []
        folder, random_weights = resolve_checkpoint(config.model_path)
        super().__init__(config, folder=folder, random_weights=random_weights)
        runner = self.scheduler.runner
        runner.launch = self._recorded(runner.launch, on_cpu=runner.device.type == 'cpu')

    def _recorded(self, launch, *, on_cpu: bool):
        """``launch`` that records each step; it ends when ``launch`` returns on the CPU
        (which computes there), else when its tokens are first waited for."""

        def recorded(batch: ForwardBatch):
            start = time.time_ns()
            handle = launch(batch)
            if on_cpu:
                self._record(batch, start)
                return handle
            return _EndStamp(handle, lambda: self._record(batch, start))

        return recorded

    def _record(self, batch: ForwardBatch, start_ns: int) -> None:
        self.steps.append(
            StepRecord(
                batch.forward_mode, batch.batch_size, batch.num_tokens, start_ns, time.time_ns()
            )
        )

    def _scheduler_config(self, device_type: str) -> SchedulerConfig:
        return self.variant.apply(super()._scheduler_config(device_type))


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


def drive(core: VariantCore, *, num_robots: int, period_s: float, duration_s: float) -> tuple:
    """Robots send a step per period (none while one is in flight); returns finished reqs."""
    period_ns = round(period_s * 1e9)
    start = time.time_ns()
    next_due = [start + i * period_ns // num_robots for i in range(num_robots)]
    in_flight = [False] * num_robots
    seqs = [0] * num_robots
    done: list[Req] = []
    end = start + round(duration_s * 1e9)
    while True:
        now = time.time_ns()
        for i in range(num_robots):
            if now < end and not in_flight[i] and now >= next_due[i]:
                seqs[i] += 1
                frame = synthetic_frame(seqs[i] * 31 + i, width=64, height=64)
                request = StepRequest(
                    robot_id=f'robot_{i}',
                    step_seq=seqs[i],
                    stamp_ns=now,
                    deadline_ns=now + 60 * 10**9,  # latency is measured, nothing dropped
                    received_ns=now,
                    image=frame,
                    state=np.zeros(0, np.float32),
                    instruction='pick up the red block',
                    instruction_version=1,
                )
                if core.submit(request, now):
                    raise RuntimeError(f'robot_{i} step {seqs[i]} was refused')
                in_flight[i] = True
                next_due[i] = max(next_due[i] + period_ns, now)
        if core.has_work():
            for req in core.scheduler.run_once():
                in_flight[int(req.robot_id.split('_')[1])] = False
                if req.finished_reason.kind is FinishKind.LENGTH:
                    done.append(req)
        elif now >= end:
            break
        else:
            time.sleep(max(0.0, min(min(next_due) - now, end - now)) / 1e9)
    return done, sum(seqs)


def run_variant(variant: Variant, args: argparse.Namespace) -> JumpResult:
    config = EngineConfig(model_path=args.model_path, device=args.device, cpu_threads=args.threads)
    core = VariantCore(config, variant)
    drive(core, num_robots=args.robots, period_s=args.period, duration_s=min(2.0, args.duration))
    core.steps.clear()  # warm-up (first images, the shared prefix) is not measured
    done, sent = drive(
        core, num_robots=args.robots, period_s=args.period, duration_s=args.duration
    )
    clean, hit = itl_samples(done, core.steps)
    latency = [(r.times.finished_ns - r.times.arrival_ns) / 1e6 for r in done]
    num_delayed = core.scheduler.metrics.num_delayed_prefills
    num_prefills = sum(1 for s in core.steps if s.forward_mode is ForwardMode.EXTEND)
    core.close()
    del core, done  # the core and its launch hook form a cycle: free it (and its KV) now
    release_device_memory()
    return JumpResult(
        variant=variant.name,
        num_steps_done=len(latency),
        num_steps_sent=sent,
        itl_clean_p50=_pct(clean, 50),
        itl_clean_p99=_pct(clean, 99),
        itl_prefill_p50=_pct(hit, 50),
        itl_prefill_p99=_pct(hit, 99),
        itl_max=max(clean + hit, default=float('nan')),
        prefill_gap_share=len(hit) / max(1, len(clean) + len(hit)),
        step_p50=_pct(latency, 50),
        step_p99=_pct(latency, 99),
        num_delayed_prefills=num_delayed,
        num_prefill_batches=num_prefills,
    )


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float('nan')


HEADER = (
    '| variant | steps done/sent | ITL p50 ms | ITL p99 ms | ITL with prefill p50 ms '
    '| ITL with prefill p99 ms | ITL max ms | gaps with prefill | step p50 ms | step p99 ms '
    '| delayed passes |'
)


def format_row(r: JumpResult) -> str:
    cells = [
        r.variant,
        f'{r.num_steps_done}/{r.num_steps_sent}',
        *(
            f'{v:.1f}'
            for v in (
                r.itl_clean_p50,
                r.itl_clean_p99,
                r.itl_prefill_p50,
                r.itl_prefill_p99,
                r.itl_max,
            )
        ),
        f'{100 * r.prefill_gap_share:.0f}%',
        f'{r.step_p50:.1f}',
        f'{r.step_p99:.1f}',
        str(r.num_delayed_prefills),
    ]
    return '| ' + ' | '.join(cells) + ' |'


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
        print(format_row(results[-1]), flush=True)
    print()
    print(HEADER)
    print('|' + '---|' * (HEADER.count('|') - 1))
    for r in results:
        print(format_row(r))
    if args.json:
        rows = [dataclasses.asdict(r) for r in results]
        Path(args.json).write_text(json.dumps({'results': rows}, indent=1) + '\n')
    return 0 if all(r.num_steps_done > 0 for r in results) else 1


if __name__ == '__main__':
    sys.exit(main())
