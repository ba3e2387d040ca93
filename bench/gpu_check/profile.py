"""Part ``profile``: where one step's time goes, kernel by kernel, for the steps the
targets are set on: a decode step of 1 and 16 requests (replayed from its CUDA graph) and
a prefill of 1 and 16 robots with vision (1 and 2 of the tiny model in the dry run).

Our runner with every CUDA graph (``bench.runner_vs_generate``'s "graphs" runner, the
same model, prompts and ``ForwardBatch`` steps as the ``model`` part) runs one control step
per robot count to warm up (compile, capture), then ``NUM_PROFILED`` prefills (each with
fresh images, so the vision towers run) and as many decode steps after the last (one each
in the dry run),
each kind under torch.profiler. The table per step (``bench.lib.profile_table``): on a GPU
every CUDA kernel, memcpy and memset with its calls, total and mean device time and share of
the step's device time, whole names, longest first; on the CPU (the dry run) every
operator's self time. Beside it: the step's wall time under the profiler, the share of it
the device was busy, and the host's kernel and graph launches per step (a captured step is
one graph launch). Each step's table is saved as it is made (``PartContext.save_partial``).
"""

from __future__ import annotations

import time
from typing import Any

from bench.gpu_check.parts import PartContext
from bench.lib.tables import markdown_table

NUM_PROFILED = 3  # runs of each step under the profiler (the table is per step); 1 dry
NUM_ROWS_SHOWN = 15  # kernels per step in report.md (results.json holds every one)


class ControlSteps:
    """One control step at a time for ``num_robots`` robots on ``runner``, robot r in slot
    table row r: a prefill of OpenVLA's prompt with a fresh image each, then decode steps."""

    def __init__(self, runner, num_robots: int) -> None:
        self.runner = runner
        self.num_robots = num_robots
        self.prompts: list[list[int]] = []
        self.tokens: list[int] = []
        self.num_prefills = 0

    def prefill(self, seed: int | None = None) -> None:
        """A prefill of every robot; images and prompt drawn from ``seed`` (default: one
        for this robot count and call, so no image is in the runner's feature cache)."""
        from bench.runner_vs_generate import frames, prompt_ids, step_batch
        from vla_sched.core.forward_batch import ForwardMode, ImageInput

        seed = 1000 * self.num_robots + self.num_prefills if seed is None else seed
        self.num_prefills += 1
        spec = self.runner.model.spec
        n = self.num_robots
        self.prompts = [prompt_ids(spec, seed) for _ in range(n)]
        images = tuple(
            (ImageInput(seed * 1000 + r, 1, spec.num_image_tokens, frame),)
            for r, frame in enumerate(frames(spec, n, seed))
        )  # a new content hash per robot and seed: no image comes from the feature cache
        batch = step_batch(
            mode=ForwardMode.EXTEND, prompts=self.prompts, prefix_lens=[0] * n,
            req_to_token=self.runner.req_to_token, images=images, sampling=self._sampling(),
        )  # fmt: skip
        self.tokens = list(self.runner.launch(batch).result().next_token_ids)

    def decode(self) -> None:
        from bench.runner_vs_generate import step_batch
        from vla_sched.core.forward_batch import ForwardMode

        n = self.num_robots
        lens = [len(p) for p in self.prompts]
        self.prompts = [[*p, t] for p, t in zip(self.prompts, self.tokens, strict=True)]
        batch = step_batch(
            mode=ForwardMode.DECODE, prompts=self.prompts, prefix_lens=lens,
            req_to_token=self.runner.req_to_token, images=((),) * n, sampling=self._sampling(),
        )  # fmt: skip
        self.tokens = list(self.runner.launch(batch).result().next_token_ids)

    def _sampling(self):
        from vla_sched.core.forward_batch import SamplingParams

        return SamplingParams(0, self.runner.model.spec.decoder.vocab_size)  # greedy


def profiled(run_once, *, on_gpu: bool, num_runs: int) -> dict[str, Any]:
    """``run_once`` ``num_runs`` times under torch.profiler: the per-step table and times."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench.lib.profile_table import launch_counts, profile_rows

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        for _ in range(num_runs):
            run_once()  # each ends with its tokens on the host
        wall_ms = (time.perf_counter() - started) * 1e3 / num_runs
    if on_gpu:
        torch.cuda.synchronize()
    events = prof.key_averages()
    device = 'cuda' if on_gpu else 'cpu'
    rows = profile_rows(events, device=device, num_steps=num_runs)
    busy_ms = sum(r.total_us for r in rows) / 1e3
    return {
        'wall_ms': wall_ms,
        'busy_ms': busy_ms,
        'busy_share': busy_ms / wall_ms,
        **launch_counts(events, num_steps=num_runs),
        'rows': [
            {'name': r.name, 'calls': r.calls, 'total_us': r.total_us, 'mean_us': r.mean_us,
             'share': r.share}
            for r in rows
        ],
    }  # fmt: skip


def run(ctx: PartContext) -> dict[str, Any]:
    import torch

    from bench.runner_vs_generate import (
        ComparePlan,
        build_ours,
        padded_runner_config,
        slot_table,
    )
    from vla_sched.model.runner.model_runner import ModelRunner

    ctx.require_cuda()
    robot_counts = (1, 2) if ctx.dry_run else (1, 16)
    plan = ComparePlan(device=ctx.device, tiny=ctx.dry_run, batch_sizes=robot_counts, reps=1)
    started = time.monotonic()
    _, ours, _ = build_ours(plan)
    table = slot_table(ours.spec, max(robot_counts))
    runner = ModelRunner(
        ours, req_to_token=table, num_kv_slots=table.numel(), config=padded_runner_config(plan)
    )
    print(f'model and runner built in {time.monotonic() - started:.1f} s', flush=True)
    on_gpu = not ctx.dry_run
    num_profiled = NUM_PROFILED if on_gpu else 1
    out: dict[str, Any] = {
        'preset': plan.preset,
        'dtype': str(plan.dtype).removeprefix('torch.'),
        'table': 'CUDA kernels (device time)' if on_gpu else 'CPU operators (self time)',
        'num_profiled': num_profiled,
        'steps': [],
    }

    def add_step(step: dict[str, Any]) -> None:
        out['steps'].append(step)
        print(_step_line(step), flush=True)
        ctx.save_partial(out)

    with torch.inference_mode():
        for n in robot_counts:
            control = ControlSteps(runner, n)
            control.prefill()  # compile kernels, capture graphs
            control.decode()
            prefill = profiled(control.prefill, on_gpu=on_gpu, num_runs=num_profiled)
            tokens = n * len(control.prompts[0])
            add_step({'step': 'prefill', 'robots': n, 'tokens': tokens, **prefill})
            decode = profiled(control.decode, on_gpu=on_gpu, num_runs=num_profiled)
            add_step({'step': 'decode', 'robots': n, 'tokens': n, **decode})
    return out


def _code(name: str) -> str:
    """A kernel name as Markdown code, whole: C++ templates' ``<...>`` would read as HTML."""
    return '`' + name.replace('`', "'").replace('|', '/') + '`'


def _robots(n: int) -> str:
    return f'{n} robot' if n == 1 else f'{n} robots'


def _step_line(s: dict[str, Any]) -> str:
    top = s['rows'][0]['name'] if s['rows'] else '-'
    return (
        f'{s["step"]} of {_robots(s["robots"])} ({s["tokens"]} tokens): {s["wall_ms"]:.2f} ms '
        f'wall, {s["busy_ms"]:.2f} ms busy ({100 * s["busy_share"]:.0f}%), '
        f'{len(s["rows"])} table rows, {s["kernel_launches"]:.0f} kernel and '
        f'{s["graph_launches"]:.0f} graph launches; longest: {top}'
    )


def section(d: dict[str, Any]) -> list[str]:
    lines = [
        f'## Profile ({d["preset"]}, {d["dtype"]}; {d["table"]}, per step, mean of '
        f'{d["num_profiled"]} profiled steps)',
        '',
        'Per step: wall time under the profiler, the time the device was busy and its share '
        'of the wall time (the rest is the host: launches, Python, copies it waits for), '
        'the host launches; then each kernel with its calls, total and mean time and share '
        f'of the busy time, longest first (the first {NUM_ROWS_SHOWN} here, every one in '
        'results.json).',
    ]
    what = 'kernel' if d['table'].startswith('CUDA') else 'operator'
    for s in d['steps']:
        rows = [
            [_code(r['name']), f'{r["calls"]:g}', f'{r["total_us"]:.1f}',
             f'{r["mean_us"]:.2f}', f'{100 * r["share"]:.1f}%']
            for r in s['rows'][:NUM_ROWS_SHOWN]
        ]  # fmt: skip
        rest = s['rows'][NUM_ROWS_SHOWN:]
        lines += [
            '',
            f'### {s["step"].capitalize()}, {_robots(s["robots"])} ({s["tokens"]} tokens)',
            '',
            f'Wall {s["wall_ms"]:.2f} ms, busy {s["busy_ms"]:.2f} ms '
            f'({100 * s["busy_share"]:.0f}%); {s["kernel_launches"]:g} kernel launches, '
            f'{s["graph_launches"]:g} graph launches per step.',
            '',
            markdown_table([what, 'calls', 'total us', 'mean us', 'share'], rows),
        ]
        if rest:
            share = sum(r['share'] for r in rest)
            lines.append(f'\n{len(rest)} more, {100 * share:.1f}% of the busy time together.')
    return lines
