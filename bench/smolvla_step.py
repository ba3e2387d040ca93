"""One SmolVLA step at SmolVLM2-500M's sizes on this machine: one robot, and four robots
submitted together, served by the scheduled core (random weights; the actions mean nothing).

    python -m bench.smolvla_step                       # real sizes on the CPU, ~3 min
    python -m bench.smolvla_step --tiny --repeats 1    # the tiny folder: a dry run

The folder is written as ``lerobot/smolvla_base`` is (``num_vlm_layers`` 16, the expert 0.75
of the text width, chunks of 50 from 10 Euler steps, two cameras, a six-joint state) with
random bfloat16 matrices, beside a VLM folder holding SmolVLM2-500M-Video-Instruct's
``config.json`` sizes (text 960 wide, 32 layers of which the policy keeps 16, 15 heads of 64,
5 KV heads, vocabulary 49280; vision 768 wide, 12 layers, 512 pixels in patches of 16, pixel
shuffle 4: 64 tokens per image) and the tiny byte-level tokenizer (so the prompt is a few
tokens, as a short task is). The model runs in float32 (``--dtype``). Each timing is one
step from submission to its chunk: the prefix (the tower on both cameras, 16 text layers)
then 10 denoising passes; a warm-up step runs first.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from vla_sched.testing.smolvlm_files import TINY_SMOLVLM, TinySmolVLM

# SmolVLM2-500M-Video-Instruct's config.json sizes.
SMOLVLM2_500M = TinySmolVLM(
    text_hidden=960, text_layers=32, text_heads=15, text_kv_heads=5, text_head_dim=64,
    text_intermediate=2560, vocab_size=49280, vision_hidden=768, vision_layers=12,
    vision_heads=12, vision_intermediate=3072, patch_size=16, image_size=512, scale_factor=4,
)  # fmt: skip
REAL_NUM_VLM_LAYERS = 16
REAL_CHUNK = 50
REAL_STEPS = 10
INSTRUCTION = 'pick up the red block'


def write_folder(root: Path, *, tiny: bool) -> Path:
    from vla_sched.testing.smolvla_writer import write_smolvla_checkpoint

    if tiny:
        return write_smolvla_checkpoint(root / 'tiny-smolvla', seed=0)
    return write_smolvla_checkpoint(
        root / 'smolvla-real-size', seed=0, chunk_size=REAL_CHUNK, n_action_steps=REAL_CHUNK,
        num_steps=REAL_STEPS, num_vlm_layers=REAL_NUM_VLM_LAYERS, vlm_sizes=SMOLVLM2_500M,
        weights_dtype='bfloat16',
    )  # fmt: skip


def _request(robot: str, seq: int, size: int):
    from vla_sched.ipc.messages import StepRequest

    rng = np.random.default_rng([seq, zlib.crc32(robot.encode())])
    now = time.time_ns()
    return StepRequest(
        robot_id=robot, step_seq=seq, stamp_ns=now, deadline_ns=now + 3600 * 10**9,
        received_ns=now, images=tuple(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                                      for _ in range(2)),
        state=rng.standard_normal(6).astype(np.float32), instruction=INSTRUCTION,
        instruction_version=1,
    )  # fmt: skip


def timed_step(core, robots: list[str], seq: int, size: int) -> float:
    """Seconds from submitting one step of each robot together to the last chunk."""
    from vla_sched.ipc.messages import StepResult

    start = time.perf_counter()
    for robot in robots:
        failures = core.submit(_request(robot, seq, size), time.time_ns())
        if failures:
            raise RuntimeError(f'refused: {failures}')
    done: dict[str, object] = {}
    while core.has_work():
        done.update((m.robot_id, m) for m in core.step(time.time_ns()))
    elapsed = time.perf_counter() - start
    bad = [r for r in robots if not isinstance(done.get(r), StepResult)]
    if bad:
        raise RuntimeError(f'no chunk for {bad}: {done}')
    return elapsed


def machine_line() -> str:
    import os

    import torch

    load = ' / '.join(f'{x:.2f}' for x in os.getloadavg())
    cpu = platform.processor() or platform.machine()
    return (
        f'{cpu}, {os.cpu_count()} cores, torch {torch.__version__} '
        f'({torch.get_num_threads()} threads), load average {load}'
    )


def commit() -> str:
    try:
        out = subprocess.run(
            ['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True, check=True,
            cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return 'unknown'
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--tiny', action='store_true', help='the tiny folder (a dry run)')
    parser.add_argument('--repeats', type=int, default=2, help='timed steps per batch size')
    parser.add_argument('--batches', type=int, nargs='+', default=[1, 4])
    parser.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'))
    parser.add_argument('--json', default='', help='write the results here')
    args = parser.parse_args(argv)

    from vla_sched.engine.config import EngineConfig
    from vla_sched.engine.scheduled_core import ScheduledCore
    from vla_sched.testing.smolvla_writer import VLM_SUBFOLDER

    with tempfile.TemporaryDirectory(prefix='vla_smolvla_step_') as tmp:
        t0 = time.perf_counter()
        folder = write_folder(Path(tmp), tiny=args.tiny)
        written_s = time.perf_counter() - t0
        config = EngineConfig(
            model_path=str(folder), smolvla_vlm_path=str(folder / VLM_SUBFOLDER),
            kv_pool_tokens=4096, page_size=16, dtype=args.dtype,
        )  # fmt: skip
        t0 = time.perf_counter()
        core = ScheduledCore.from_config(config)
        loaded_s = time.perf_counter() - t0
        size = (TINY_SMOLVLM if args.tiny else SMOLVLM2_500M).image_size
        try:
            timed_step(core, ['warm'], 0, size)
            results = {}
            for batch in args.batches:
                robots = [f'robot_{i}' for i in range(batch)]
                times = [timed_step(core, robots, seq, size) for seq in range(1, args.repeats + 1)]
                results[batch] = times
                print(f'{batch} robot(s): ' + ', '.join(f'{t * 1e3:.0f} ms' for t in times))
        finally:
            core.close()
    record = {
        'machine': machine_line(),
        'commit': commit(),
        'tiny': args.tiny,
        'dtype': args.dtype,
        'written_s': written_s,
        'loaded_s': loaded_s,
        'steps_s': {str(b): t for b, t in results.items()},
        'median_ms': {str(b): 1e3 * statistics.median(t) for b, t in results.items()},
    }
    print(json.dumps(record, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
