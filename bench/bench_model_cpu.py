"""Per-step latency of the paged model runner against transformers ``generate`` on the CPU.

Uses the tiny random VLA checkpoint (built offline into a temporary folder). For batch 1 and
8 it times one control step: the prefill of B prompts with an image each, then the action
tokens decoded one step at a time (B requests per step). transformers runs the same inputs
through ``LlavaForConditionalGeneration.generate`` (greedy, KV cache); a logits processor
stamps each step, so its prefill is the time to the first logits and a decode step the time
between consecutive logits (our side: from launch until the tokens are on the host).
Minimum, median and 90th percentile over the repetitions are printed (on a shared machine
the minimum is the least disturbed); nothing is asserted.

Usage, from the repository root::

    python bench/bench_model_cpu.py [--reps 20] [--horizon 1] [--threads 2]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from vla_sched.core.forward_batch import (
    ForwardBatch,
    ForwardMode,
    ImageInput,
    SamplingParams,
)


def contiguous_slots(batch_size: int, max_context_len: int) -> torch.Tensor:
    """Slot table giving request row r the slots r*max_context_len + position."""
    rows = torch.arange(batch_size, dtype=torch.int32)[:, None] * max_context_len
    return rows + torch.arange(max_context_len, dtype=torch.int32)[None, :]


def step_batch(
    *,
    mode: ForwardMode,
    prompts: list[list[int]],
    prefix_lens: list[int],
    req_to_token: torch.Tensor,
    images: tuple[tuple[ImageInput, ...], ...],
    sampling: SamplingParams,
) -> ForwardBatch:
    """A batch extending every prompt r from prefix_lens[r] to its end."""
    n = len(prompts)
    prefix = torch.tensor(prefix_lens, dtype=torch.int64)
    seq = torch.tensor([len(p) for p in prompts], dtype=torch.int64)
    ids = [t for p, s in zip(prompts, prefix_lens, strict=True) for t in p[s:]]
    loc = torch.cat([req_to_token[r, prefix_lens[r] : len(p)] for r, p in enumerate(prompts)])
    return ForwardBatch(
        forward_mode=mode,
        rids=tuple(f'robot{r}' for r in range(n)),
        req_pool_indices=torch.arange(n, dtype=torch.int64),
        prefix_lens=prefix,
        extend_lens=seq - prefix,
        seq_lens=seq,
        input_ids=torch.tensor(ids, dtype=torch.int64),
        out_cache_loc=loc.to(torch.int64),
        sample=(True,) * n,
        sampling=(sampling,) * n,
        images=images,
    )


def time_runner(model, builder, batch_size: int, reps: int) -> tuple[list[float], list[float]]:
    """Prefill times and decode-step times (ms) of our runner."""
    from vla_sched.model.runner.model_runner import ModelRunner

    layout = builder.build('put the carrot in the pot')
    rng = np.random.default_rng(0)
    max_context_len = len(layout.token_ids) + builder.num_action_tokens + 8
    req_to_token = contiguous_slots(batch_size, max_context_len)
    runner = ModelRunner(
        model, req_to_token=req_to_token, num_kv_slots=batch_size * max_context_len
    )
    sampling = SamplingParams(*builder.action_token_range)
    prefill_ms, decode_ms = [], []
    for rep in range(reps + 1):
        images = tuple(
            (
                ImageInput(
                    rep * 100 + r,  # fresh frames every step: the tower runs each time
                    layout.image_offset,
                    layout.num_image_tokens,
                    rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
                ),
            )
            for r in range(batch_size)
        )
        prompts = [list(layout.token_ids) for _ in range(batch_size)]
        batch = step_batch(
            mode=ForwardMode.EXTEND, prompts=prompts, prefix_lens=[0] * batch_size,
            req_to_token=req_to_token, images=images, sampling=sampling,
        )  # fmt: skip
        started = time.perf_counter()
        tokens = runner.launch(batch).result().next_token_ids
        prefill = (time.perf_counter() - started) * 1e3
        steps = []
        for _ in range(builder.num_action_tokens - 1):
            lens = [len(p) for p in prompts]
            prompts = [[*p, t] for p, t in zip(prompts, tokens, strict=True)]
            batch = step_batch(
                mode=ForwardMode.DECODE, prompts=prompts, prefix_lens=lens,
                req_to_token=req_to_token, images=((),) * batch_size, sampling=sampling,
            )  # fmt: skip
            started = time.perf_counter()
            tokens = runner.launch(batch).result().next_token_ids
            steps.append((time.perf_counter() - started) * 1e3)
        if rep:  # the first repetition warms up
            prefill_ms.append(prefill)
            decode_ms.extend(steps)
    return prefill_ms, decode_ms


class _StepStamps:
    """A logits processor that records when each generation step's logits are ready."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.stamps.append(time.perf_counter())
        return scores


def time_transformers(hf, model, builder, batch_size: int, reps: int):
    """Prefill and per-token decode times (ms) of transformers generate, from step stamps."""
    from vla_sched.model.layers.vision import preprocess_image

    layout = builder.build('put the carrot in the pot')
    rng = np.random.default_rng(0)
    ids = torch.tensor([list(layout.token_ids)] * batch_size)
    start, end = builder.action_token_range
    outside = [t for t in range(model.spec.decoder.vocab_size) if not start <= t < end]
    num_new = builder.num_action_tokens
    prefill_ms, decode_ms = [], []
    for rep in range(reps + 1):
        frames = [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in range(batch_size)]
        stamps = _StepStamps()
        started = time.perf_counter()
        pixels = torch.stack([preprocess_image(f, model.spec.preprocessing) for f in frames])
        hf.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels,
            max_new_tokens=num_new, min_new_tokens=num_new, do_sample=False,
            suppress_tokens=outside, pad_token_id=0, logits_processor=[stamps],
        )  # fmt: skip
        if rep:
            times = [started, *stamps.stamps]
            prefill_ms.append((times[1] - times[0]) * 1e3)
            decode_ms.extend((b - a) * 1e3 for a, b in itertools.pairwise(times[1:]))
    return prefill_ms, decode_ms


def summary(values: list[float]) -> str:
    if not values:
        return 'n/a'
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f'{ordered[0]:6.2f} / {statistics.median(values):6.2f} / {p90:6.2f}'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--reps', type=int, default=20)
    parser.add_argument('--horizon', type=int, default=1, help='action chunk length H')
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--batch-sizes', type=int, nargs='+', default=[1, 8])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import LlavaForConditionalGeneration

    from vla_sched.model.loading.checkpoint import load_checkpoint
    from vla_sched.model.loading.tiny_checkpoint import build_tiny_checkpoint
    from vla_sched.model.prompting.prompt import VLAPromptBuilder

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        folder = build_tiny_checkpoint(Path(tmp) / 'tiny', action_horizon=args.horizon)
        build_s = time.perf_counter() - started
        model = load_checkpoint(folder)
        builder = VLAPromptBuilder.from_checkpoint(folder, model.spec)
        hf = LlavaForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    layout = builder.build('put the carrot in the pot')
    print(f'tiny checkpoint built in {build_s * 1e3:.0f} ms; prompt {len(layout.token_ids)} '
          f'tokens ({layout.num_image_tokens} image), {builder.num_action_tokens} action tokens, '
          f'{args.reps} reps, {torch.get_num_threads()} threads')  # fmt: skip
    print()
    stats = '(min / median / p90)'
    print(f'| batch | engine | prefill ms {stats} | decode step ms {stats} |')
    print('|---|---|---|---|')
    with torch.inference_mode():
        for batch_size in args.batch_sizes:
            ours = time_runner(model, builder, batch_size, args.reps)
            theirs = time_transformers(hf, model, builder, batch_size, args.reps)
            for name, (prefill, decode) in (('vla_sched runner', ours), ('HF generate', theirs)):
                print(f'| {batch_size} | {name} | {summary(prefill)} | {summary(decode)} |')


if __name__ == '__main__':
    main()
