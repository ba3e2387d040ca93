"""One control step of openvla-7b: our paged runner against transformers.

The model is the ``openvla-7b`` preset, OpenVLA's real architecture (fused DINOv2 + SigLIP
towers at 224 px, 3-layer projector, Llama-2-7B decoder, 256 image tokens after BOS), with
random bf16 weights drawn once on the GPU under OpenVLA's tensor names; our model and
transformers' ``LlamaForCausalLM`` share the decoder tensors. A control step is one
observation's prefill (BOS, 256 image tokens and a short instruction: 280 tokens) and 7
action tokens, greedy over the whole vocabulary as OpenVLA's ``predict_action`` (the prefill
samples the first, 6 decode steps the rest). It is timed for 1 robot and for 16 robots at once:

- our runner, eager, and with decode steps replayed from CUDA graphs;
- transformers ``generate`` on the same inputs (greedy, KV cache, SDPA) as OpenVLA's
  ``predict_action`` calls it: ``inputs_embeds`` with the image embeddings after BOS. The
  image embeddings come from our vision encoder (OpenVLA's towers are timm models and
  transformers has no OpenVLA class), inside the timed region. Its prefill is
  ``generate(max_new_tokens=1)``, its decode step the extra time per token up to 7;
- the memory floor of a decode step: the decoder's weight bytes (all but the embedding
  table, which is only gathered) over the measured device-to-device copy bandwidth.

Times are host wall clock from launch until the tokens are on the host (what a robot
waits for), medians over the repetitions. Greedy tokens of both engines are compared.

Usage, from the repository root::

    python bench/gpu_model.py                 # the GPU run (about 3-5 minutes)
    python bench/gpu_model.py --out m.md      # also write the Markdown table to m.md
    python bench/gpu_model.py --dry-run       # a tiny OpenVLA on the CPU: checks the script
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
from vla_sched.core.forward_batch import ForwardMode, ImageInput, SamplingParams

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
        return Plan('openvla-tiny', torch.device('cpu'), torch.float32, (1, 2), 8, 7, 2, False)
    if not torch.cuda.is_available():
        raise SystemExit('no CUDA device: run with --dry-run on a CPU')
    return Plan('openvla-7b', torch.device('cuda'), torch.bfloat16, (1, 16), 23, 7, 10, True)


def build_models(plan: Plan):
    """Our model with random weights under OpenVLA's names, and transformers'
    ``LlamaForCausalLM`` sharing its decoder tensors."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from vla_sched.model.config.formats import spec_from_dicts
    from vla_sched.model.config.presets import openvla_config, openvla_norm_stats
    from vla_sched.model.loading.vla_model import assemble_model
    from vla_sched.model.loading.weights import canonical_name
    from vla_sched.testing.openvla_writer import openvla_state_dict

    config = openvla_config(
        'fused', tiny=plan.preset != 'openvla-7b', norm_stats=openvla_norm_stats()
    )
    spec = spec_from_dicts(config, {}, config['norm_stats'])
    stored = openvla_state_dict(config, device=plan.device, dtype=plan.dtype)
    state = {canonical_name(name): tensor for name, tensor in stored.items()}
    ours = assemble_model(
        spec,
        list(state),
        shape_of=lambda name: tuple(state[name].shape),
        read=state.__getitem__,
        device=plan.device,
        dtype=plan.dtype,
    )
    with torch.device(plan.device):
        text = LlamaConfig(**config['text_config'])
        hf = LlamaForCausalLM._from_config(text, dtype=plan.dtype)
    prefix = 'language_model.'
    llm = {k.removeprefix(prefix): v for k, v in stored.items() if k.startswith(prefix)}
    hf.load_state_dict(llm, strict=True, assign=True)  # share our tensors
    hf.eval()
    shared = ours.decoder.layers[0].mlp.up_proj.weight.data_ptr()
    assert shared == hf.model.layers[0].mlp.up_proj.weight.data_ptr()
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
    sampling = SamplingParams(0, spec.decoder.vocab_size)  # greedy over the whole vocabulary
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


def run_hf(hf, ours, plan: Plan, batch_size: int, seed: int, new_tokens: int):
    """transformers generate as OpenVLA calls it: (seconds, generated token lists)."""
    from vla_sched.model.layers.vision import preprocess_image

    spec = ours.spec
    ids = torch.tensor([prompt_ids(spec, plan.num_text_tokens, seed)] * batch_size)
    image = slice(1, 1 + spec.num_image_tokens)  # right after BOS
    _sync(plan)
    started = time.perf_counter()
    ids = ids.to(plan.device)
    pixels = torch.stack(
        [preprocess_image(f, spec.preprocessing, device=plan.device)
         for f in frames(spec, batch_size, seed)]
    ).to(plan.dtype)  # fmt: skip
    embeds = hf.get_input_embeddings()(ids)
    embeds[:, image] = ours.encode_images(pixels)
    out = hf.generate(
        inputs_embeds=embeds, attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
        pad_token_id=spec.image_token_id,
    )  # fmt: skip
    tokens = out[:, -new_tokens:].tolist()  # with inputs_embeds only new tokens come back
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


def bench_batch(plan, ours, hf, runners, batch_size: int) -> tuple[list[str], float]:
    """Table rows for one batch size, and the greedy-token agreement with transformers."""
    spec = ours.spec
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
                hf_tokens[rep] = run_hf(hf, ours, plan, batch_size, rep, plan.num_action_tokens)[1]
            agreement.append(np.mean(np.array(result[2]) == np.array(hf_tokens[rep])))
    one = repeat(reps, lambda rep: run_hf(hf, ours, plan, batch_size, rep, 1))
    full = repeat(
        reps, lambda rep: run_hf(hf, ours, plan, batch_size, rep, plan.num_action_tokens)
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

    from vla_sched.model.runner.model_runner import ModelRunner, RunnerConfig

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
            rows, agreement = bench_batch(plan, ours, hf, runners, batch_size)
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
