"""One control step of an OpenVLA-7B-shaped VLA: our paged runner against transformers.

The model is the ``openvla-7b`` preset (Llama-2-7B decoder, SigLIP-so400m tower at 224 px,
256 image tokens) with random bf16 weights, built once by transformers on the GPU and shared,
tensor for tensor, with our runner. A control step is one observation's prefill (BOS, 256
image tokens and a short instruction: 280 tokens) and 7 action tokens (the prefill samples
the first, 6 decode steps the rest). It is timed for 1 robot and for 16 robots at once:

- our runner, eager, and with decode steps replayed from CUDA graphs;
- transformers ``generate`` on the same inputs (greedy, KV cache, SDPA): its prefill is
  ``generate(max_new_tokens=1)``, its decode step the extra time per token up to 7;
- the memory floor of a decode step: the decoder's weight bytes (all but the embedding
  table, which is only gathered) over the measured device-to-device copy bandwidth.

Times are host wall clock from launch until the tokens are on the host (what a robot
waits for), medians over the repetitions. Greedy tokens of both engines are compared.

Usage, from the repository root::

    python bench/gpu_model.py                 # the GPU run (about 3-5 minutes)
    python bench/gpu_model.py --out m.md      # also write the Markdown table to m.md
    python bench/gpu_model.py --dry-run       # the tiny preset on the CPU: checks the script
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from bench.bench_model_cpu import step_batch
from vla_sched.engine.forward_batch import ForwardMode, ImageInput, SamplingParams

WARMUP_SEED = 10_000


@dataclass(frozen=True, slots=True)
class Plan:
    preset: str
    device: torch.device
    dtype: torch.dtype
    batch_sizes: tuple[int, ...]
    num_text_tokens: int
    num_action_tokens: int
    reps: int
    cuda_graphs: bool


def make_plan(dry_run: bool) -> Plan:
    if dry_run:
        return Plan('tiny', torch.device('cpu'), torch.float32, (1, 2), 8, 7, 2, False)
    if not torch.cuda.is_available():
        raise SystemExit('no CUDA device: run with --dry-run on a CPU')
    return Plan('openvla-7b', torch.device('cuda'), torch.bfloat16, (1, 16), 23, 7, 10, True)


def build_models(plan: Plan):
    """transformers' LLaVA with random weights, and our model sharing its tensors."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    from vla_sched.model.presets import openvla_7b_config, preset_spec, tiny_llava_config
    from vla_sched.model.vla_model import assemble_model

    config = openvla_7b_config() if plan.preset == 'openvla-7b' else tiny_llava_config()
    fields = {k: v for k, v in config.items() if k not in ('architectures', 'model_type')}
    torch.manual_seed(0)
    with torch.device(plan.device):
        hf = LlavaForConditionalGeneration._from_config(LlavaConfig(**fields), dtype=plan.dtype)
    hf.eval()
    spec = preset_spec(plan.preset)
    state = hf.state_dict()
    ours = assemble_model(
        spec,
        list(state),
        shape_of=lambda name: tuple(state[name].shape),
        read=state.__getitem__,
        device=plan.device,
        dtype=plan.dtype,
    )
    shared = ours.decoder.layers[0].mlp.up_proj.weight.data_ptr()
    assert shared == state['model.language_model.layers.0.mlp.up_proj.weight'].data_ptr()
    return hf, ours


def prompt_ids(spec, num_text_tokens: int, seed: int) -> list[int]:
    """OpenVLA's layout: BOS, the image placeholders, then the instruction's tokens."""
    rng = np.random.default_rng(seed)
    text = rng.integers(100, spec.action_tokens.token_start, num_text_tokens).tolist()
    return [1, *[spec.image_token_id] * spec.num_image_tokens, *text]


def frames(spec, count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    size = spec.preprocessing.image_size
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(count)]


def run_ours(runner, spec, plan: Plan, batch_size: int, seed: int):
    """One control step for ``batch_size`` robots: (prefill s, decode step s list, tokens)."""
    prompts = [prompt_ids(spec, plan.num_text_tokens, seed) for _ in range(batch_size)]
    offset = 1
    images = tuple(
        (ImageInput(seed * 1000 + r, offset, spec.num_image_tokens, img),)
        for r, img in enumerate(frames(spec, batch_size, seed))
    )
    sampling = SamplingParams(*spec.action_token_range)
    table = runner.req_to_token
    batch = step_batch(
        mode=ForwardMode.EXTEND, prompts=prompts, prefix_lens=[0] * batch_size,
        req_to_token=table, images=images, sampling=sampling,
    )  # fmt: skip
    started = time.perf_counter()
    tokens = runner.launch(batch).result().next_token_ids
    prefill = time.perf_counter() - started
    generated, steps = [list(tokens)], []
    for _ in range(plan.num_action_tokens - 1):
        lens = [len(p) for p in prompts]
        prompts = [[*p, t] for p, t in zip(prompts, tokens, strict=True)]
        no_images = ((),) * batch_size
        batch = step_batch(
            mode=ForwardMode.DECODE, prompts=prompts, prefix_lens=lens,
            req_to_token=table, images=no_images, sampling=sampling,
        )  # fmt: skip
        started = time.perf_counter()
        tokens = runner.launch(batch).result().next_token_ids
        steps.append(time.perf_counter() - started)
        generated.append(list(tokens))
    return prefill, steps, [list(col) for col in zip(*generated, strict=True)]


def run_hf(hf, spec, plan: Plan, batch_size: int, seed: int, new_tokens: int):
    """transformers generate: (seconds, generated token lists)."""
    from vla_sched.model.vision import preprocess_image

    ids = torch.tensor([prompt_ids(spec, plan.num_text_tokens, seed)] * batch_size)
    start, end = spec.action_token_range
    outside = [t for t in range(spec.decoder.vocab_size) if not start <= t < end]
    _sync(plan)
    started = time.perf_counter()
    ids = ids.to(plan.device)
    pixels = torch.stack(
        [preprocess_image(f, spec.preprocessing, device=plan.device)
         for f in frames(spec, batch_size, seed)]
    ).to(plan.dtype)  # fmt: skip
    out = hf.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels,
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
        suppress_tokens=outside, pad_token_id=0,
    )  # fmt: skip
    tokens = out[:, ids.shape[1] :].tolist()
    return time.perf_counter() - started, tokens


def _sync(plan: Plan) -> None:
    if plan.device.type == 'cuda':
        torch.cuda.synchronize(plan.device)


def copy_bandwidth(plan: Plan) -> float:
    """Device-to-device copy bandwidth in bytes/s (reads + writes), median of 10."""
    num_bytes = (1 << 30) if plan.device.type == 'cuda' else (64 << 20)
    src = torch.empty(num_bytes, dtype=torch.uint8, device=plan.device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        _sync(plan)
        started = time.perf_counter()
        dst.copy_(src)
        _sync(plan)
        times.append(time.perf_counter() - started)
    return 2 * num_bytes / statistics.median(times[2:])


def decoder_weight_bytes(model) -> int:
    """Bytes a decode step must stream: every decoder weight but the gathered embedding."""
    total = sum(p.numel() * p.element_size() for p in model.decoder.parameters())
    embed = model.decoder.embed_tokens.weight
    if model.decoder.lm_head is None:  # tied: the table is read once as the LM head
        return total
    return total - embed.numel() * embed.element_size()


def repeat(count: int, fn: Callable[[int], tuple]) -> list[tuple]:
    fn(WARMUP_SEED)  # compile kernels, fill allocator pools
    return [fn(rep) for rep in range(count)]


def ms(seconds: float) -> str:
    return f'{seconds * 1e3:.2f}'


def bench_batch(plan, spec, hf, runners, batch_size: int) -> tuple[list[str], float]:
    """Table rows for one batch size, and the greedy-token agreement with transformers."""
    rows, agreement = [], []
    reps = plan.reps if batch_size == 1 else max(2, plan.reps // 2)
    hf_tokens = {}
    for name, runner in runners.items():
        results = repeat(reps, lambda rep, r=runner: run_ours(r, spec, plan, batch_size, rep))
        prefill = statistics.median(r[0] for r in results)
        step = statistics.median(s for r in results for s in r[1])
        total = statistics.median(r[0] + sum(r[1]) for r in results)
        rows.append(f'| {batch_size} | {name} | {ms(prefill)} | {ms(step)} | {ms(total)} |')
        for rep, result in enumerate(results):
            if rep not in hf_tokens:
                hf_tokens[rep] = run_hf(hf, spec, plan, batch_size, rep, plan.num_action_tokens)[1]
            agreement.append(np.mean(np.array(result[2]) == np.array(hf_tokens[rep])))
    one = repeat(reps, lambda rep: run_hf(hf, spec, plan, batch_size, rep, 1))
    full = repeat(
        reps, lambda rep: run_hf(hf, spec, plan, batch_size, rep, plan.num_action_tokens)
    )
    prefill = statistics.median(r[0] for r in one)
    total = statistics.median(r[0] for r in full)
    step = (total - prefill) / (plan.num_action_tokens - 1)
    rows.append(f'| {batch_size} | HF generate | {ms(prefill)} | {ms(step)} | {ms(total)} |')
    return rows, float(np.mean(agreement))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--dry-run', action='store_true', help='tiny preset on the CPU')
    parser.add_argument('--out', type=Path, help='also write the Markdown table here')
    args = parser.parse_args()
    plan = make_plan(args.dry_run)

    from vla_sched.model.runner import ModelRunner, RunnerConfig

    started = time.perf_counter()
    hf, ours = build_models(plan)
    spec = ours.spec
    built_s = time.perf_counter() - started
    max_batch = max(plan.batch_sizes)
    context = spec.num_image_tokens + plan.num_text_tokens + plan.num_action_tokens + 8
    table = torch.arange(max_batch * context, dtype=torch.int32).reshape(max_batch, context)
    configs = {'vla_sched eager': RunnerConfig(padded_decode=args.dry_run)}
    if plan.cuda_graphs:
        configs['vla_sched + CUDA graphs'] = RunnerConfig(
            cuda_graphs=True, decode_batch_sizes=plan.batch_sizes
        )
    runners = {
        name: ModelRunner(ours, req_to_token=table, num_kv_slots=table.numel(), config=config)
        for name, config in configs.items()
    }
    bandwidth = copy_bandwidth(plan)
    floor = decoder_weight_bytes(ours) / bandwidth
    lines = [
        f'{plan.preset}: {spec.decoder.num_params() / 1e6:.1f} M decoder params, '
        f'{plan.dtype}, {plan.device}; prompt {1 + spec.num_image_tokens + plan.num_text_tokens} '
        f'tokens, {plan.num_action_tokens} action tokens; models built in {built_s:.1f} s',
        f'copy bandwidth {bandwidth / 1e9:.0f} GB/s; decode memory floor '
        f'{decoder_weight_bytes(ours) / 1e9:.2f} GB / bandwidth = {floor * 1e3:.2f} ms per step',
        '',
        '| robots | engine | prefill ms | decode step ms | 7 action tokens ms |',
        '|---|---|---|---|---|',
    ]
    print('\n'.join(lines), flush=True)
    with torch.inference_mode():
        for batch_size in plan.batch_sizes:
            rows, agreement = bench_batch(plan, spec, hf, runners, batch_size)
            rows.append(f'| {batch_size} | memory floor | | {ms(floor)} | |')
            print('\n'.join(rows), flush=True)
            lines.extend(rows)
            lines.append(
                f'<!-- batch {batch_size}: greedy tokens equal to HF: {agreement:.0%} -->'
            )
            print(f'batch {batch_size}: greedy tokens equal to transformers in {agreement:.0%}')
    if args.out:
        args.out.write_text('\n'.join(lines) + '\n')


if __name__ == '__main__':
    main()
