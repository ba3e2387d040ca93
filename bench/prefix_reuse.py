"""What the radix cache and sessions share for each prompt layout: hit rate and KV per robot.

OpenVLA puts a frame's image right after BOS, so two steps share only BOS; our
instruction-first layout puts the instruction before the image, so a robot's steps (and
robots with the same instruction) share the whole instruction prefix. Both tiny
checkpoints are served by the scheduled engine core in this process, no ROS: ``--robots``
robots, pairs of which share an instruction, each sending ``--steps`` steps with a new frame
every step. Counts, not times, so the numbers are the same on any machine.

    python -m bench.prefix_reuse --robots 4 --steps 5 --json results.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench.lib.fleets import FrameSource, step_request
from vla_sched.engine.config import EngineConfig
from vla_sched.engine.scheduled_core import ScheduledCore
from vla_sched.ipc.messages import StepResult
from vla_sched.testing.openvla_writer import write_openvla_checkpoint

INSTRUCTIONS = ('pick up the red block', 'open the top drawer')


@dataclass(frozen=True, slots=True)
class LayoutReuse:
    """One layout's sharing, over every step after each robot's first."""

    layout: str
    prompt_len: int  # tokens of one step's prompt
    session_prefix_len: int  # tokens a robot's steps can share (its session prefix)
    cached_tokens_per_step: float  # mean prompt tokens served from the cache
    prefilled_tokens_per_step: float  # mean prompt tokens computed
    cache_hit_rate: float  # the engine's own figure, over all steps
    session_kv_tokens_per_robot: float  # KV tokens kept per robot between its steps


def measure(layout: str, config: EngineConfig, *, num_robots: int, num_steps: int) -> LayoutReuse:
    """Serve ``num_steps`` rounds of one step per robot; every round runs to completion."""
    core = ScheduledCore.from_config(config)
    frames = FrameSource(width=64, height=64)
    try:
        later: list[StepResult] = []
        for seq in range(num_steps):
            for robot in range(num_robots):
                now = time.time_ns()
                request = step_request(
                    robot, seq, stamp_ns=now, deadline_ns=now + 600 * 10**9, received_ns=now,
                    frame=frames.frame(seq * 31 + robot), num_state=core.info.num_state,
                    instruction=INSTRUCTIONS[robot % len(INSTRUCTIONS)],
                )  # fmt: skip
                failures = core.submit(request, time.time_ns())
                if failures:
                    raise RuntimeError(f'{layout}: step refused: {failures[0].detail}')
            while core.has_work():
                for out in core.step(time.time_ns()):
                    if not isinstance(out, StepResult):
                        raise RuntimeError(f'{layout}: step failed: {out.detail}')
                    if seq > 0:
                        later.append(out)
                core.check_integrity()
        layout_of = core.served.translator.prompts.build(INSTRUCTIONS[0])
        stats = core.stats(time.time_ns())
        cached = float(np.mean([r.num_cached_prefix_tokens for r in later]))
        sessions = [s.num_cached_session_prefix_tokens for s in stats.robots.values()]
        return LayoutReuse(
            layout=layout,
            prompt_len=len(layout_of.token_ids),
            session_prefix_len=layout_of.session_prefix_len,
            cached_tokens_per_step=cached,
            prefilled_tokens_per_step=len(layout_of.token_ids) - cached,
            cache_hit_rate=stats.cache_hit_rate,
            session_kv_tokens_per_robot=float(np.mean(sessions)),
        )
    finally:
        core.close()


def table(rows: list[LayoutReuse]) -> str:
    lines = [
        '| layout | prompt tokens | session prefix | cached per step | prefilled per step '
        '| cache hit rate | session KV per robot |',
        '|---|---|---|---|---|---|---|',
    ]
    for r in rows:
        lines.append(
            f'| {r.layout} | {r.prompt_len} | {r.session_prefix_len} '
            f'| {r.cached_tokens_per_step:.1f} | {r.prefilled_tokens_per_step:.1f} '
            f'| {r.cache_hit_rate:.3f} | {r.session_kv_tokens_per_robot:.1f} |'
        )
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--robots', type=int, default=4)
    parser.add_argument('--steps', type=int, default=5, help='steps per robot')
    parser.add_argument('--json', default='', help='write the results here')
    args = parser.parse_args(argv)
    if args.robots < 1 or args.steps < 2:
        parser.error('need at least one robot and two steps per robot')
    settings = dict(kv_pool_tokens=16384, page_size=16, chunked_prefill_size=512)
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_openvla_checkpoint(Path(tmp) / 'openvla-tiny')
        rows = [
            measure('instruction first (built-in tiny)', EngineConfig(**settings),
                    num_robots=args.robots, num_steps=args.steps),
            measure('image first (OpenVLA, tiny)',
                    EngineConfig(model_path=str(folder), **settings),
                    num_robots=args.robots, num_steps=args.steps),
        ]  # fmt: skip
    print(f'{args.robots} robots ({len(INSTRUCTIONS)} instructions), {args.steps} steps each')
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=2) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
