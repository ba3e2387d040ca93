"""One control step of OpenVLA: our paged model runner against transformers ``generate``.

The model is OpenVLA's real architecture (fused DINOv2 + SigLIP towers at 224 px, 3-layer
projector, Llama-2 decoder, 256 image tokens after BOS): ``openvla-7b`` in bf16 on a GPU,
its tiny preset (same layout, tiny widths) in fp32 on the CPU, with seeded random weights
under OpenVLA's tensor names; our model and transformers' ``LlamaForCausalLM`` share the
decoder tensors. A control step is one observation's prefill (BOS, 256 image tokens and a
23-token instruction: 280 tokens) and 7 action tokens, greedy over the whole vocabulary as
OpenVLA's ``predict_action`` (the prefill samples the first, 6 decode steps the rest),
timed for each robot count as one batch:

- our runner eager, and through its padded persistent-buffer paths: replayed from CUDA
  graphs (decode, prefill, vision) on a GPU, run eagerly on the CPU ("graphs");
- transformers ``generate`` on the same inputs (greedy, KV cache, SDPA) as OpenVLA's
  ``predict_action`` calls it: ``inputs_embeds`` with the image embeddings after BOS. The
  image embeddings come from our vision encoder (OpenVLA's towers are timm models and
  transformers has no OpenVLA class), inside the timed region. Its prefill is
  ``generate(max_new_tokens=1)``, its decode step the extra time per token up to 7.

First our prefill's last-token logits are compared with transformers' on the same inputs;
greedy tokens of every engine are compared too. Times are host wall clock from launch until
the tokens are on the host (what a robot waits for), medians over the repetitions. With the
device's measured rates, one robot's step is set against the floor
(``bench.lib.cost_model.step_floor``). The prepared GPU run runs this as its ``model`` part.

    python -m bench.runner_vs_generate                      # tiny OpenVLA on the CPU
    python -m bench.runner_vs_generate --device cuda        # openvla-7b, a few minutes
    python -m bench.runner_vs_generate --json out.json --markdown out.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.lib.cost_model import (
    OPENVLA_ACTION_TOKENS,
    OPENVLA_TEXT_TOKENS,
    batch_floor,
    openvla_shape,
)
from bench.lib.cost_model import step_floor as floor_of
from bench.lib.device_timing import MeasuredRates, measure_rates
from bench.lib.tables import markdown_table
from vla_sched.core.forward_batch import ForwardBatch, ForwardMode, ImageInput, SamplingParams

WARMUP_SEED = 10_000
ENGINES = ('eager', 'graphs', 'transformers')


@dataclass(frozen=True, slots=True)
class ComparePlan:
    """What one comparison runs: openvla-7b in bf16 on ``cuda``, the tiny preset in fp32 on
    the CPU (``tiny`` picks the preset on either)."""

    device: str = 'cpu'
    tiny: bool = True
    batch_sizes: tuple[int, ...] = (1, 8)
    reps: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if self.device not in ('cpu', 'cuda'):
            raise ValueError(f'device must be cpu or cuda, got {self.device!r}')
        if self.reps < 1 or not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError('reps and every batch size must be >= 1')

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.device == 'cuda' else torch.float32

    @property
    def preset(self) -> str:
        return 'openvla-tiny' if self.tiny else 'openvla-7b'


# --- the models -----------------------------------------------------------------------------


def build_ours(plan: ComparePlan) -> tuple[dict[str, Any], Any, dict[str, torch.Tensor]]:
    """OpenVLA's config, our model with seeded random weights under OpenVLA's names, and
    those weights by their stored names."""
    from vla_sched.model.config.formats import spec_from_dicts
    from vla_sched.model.config.presets import openvla_config, openvla_norm_stats
    from vla_sched.model.loading.vla_model import assemble_model
    from vla_sched.model.loading.weights import canonical_name
    from vla_sched.testing.openvla_writer import openvla_state_dict

    config = openvla_config('fused', tiny=plan.tiny, norm_stats=openvla_norm_stats())
    spec = spec_from_dicts(config, {}, config['norm_stats'])
    device, dtype = plan.torch_device, plan.dtype
    stored = openvla_state_dict(config, seed=plan.seed, device=device, dtype=dtype)
    state = {canonical_name(name): tensor for name, tensor in stored.items()}
    ours = assemble_model(
        spec,
        list(state),
        shape_of=lambda name: tuple(state[name].shape),
        read=state.__getitem__,
        device=device,
        dtype=dtype,
    )
    return config, ours, stored


def build_models(plan: ComparePlan):
    """OpenVLA's config, our model (``build_ours``), and transformers' ``LlamaForCausalLM``
    sharing its decoder tensors."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from vla_sched.model.loading.weights import LM_HEAD, checkpoint_views

    config, ours, _ = build_ours(plan)
    device, dtype = plan.torch_device, plan.dtype
    with torch.device(device):
        hf = LlamaForCausalLM._from_config(LlamaConfig(**config['text_config']), dtype=dtype)
    # Our tensors under transformers' names (merged projections split into views): shared.
    views = checkpoint_views(ours.decoder.state_dict(), ours.spec.decoder)
    llm = {name if name == LM_HEAD else f'model.{name}': t for name, t in views.items()}
    hf.load_state_dict(llm, strict=True, assign=True)
    hf.eval()
    shared = ours.decoder.layers[0].mlp.gate_up_proj.weight.data_ptr()
    assert shared == hf.model.layers[0].mlp.gate_proj.weight.data_ptr()
    return config, ours, hf


def slot_table(spec, num_robots: int) -> torch.Tensor:
    """A slot table with a row per robot, each long enough for one control step."""
    context = spec.num_image_tokens + OPENVLA_TEXT_TOKENS + OPENVLA_ACTION_TOKENS + 8
    return torch.arange(num_robots * context, dtype=torch.int32).reshape(num_robots, context)


def padded_runner_config(plan: ComparePlan):
    """The "graphs" runner's settings: every CUDA graph on a GPU (decode captured at the
    plan's batch sizes), the padded decode path run eagerly on the CPU."""
    from vla_sched.model.runner.config import RunnerConfig

    if plan.device == 'cuda':
        return RunnerConfig(cuda_graphs=True, decode_batch_sizes=plan.batch_sizes)
    return RunnerConfig(padded_decode=True)


def make_runners(ours, plan: ComparePlan) -> dict[str, Any]:
    """Our runner eager and through its padded paths (captured as CUDA graphs on a GPU), on
    one slot table with a row per robot of the largest batch."""
    from vla_sched.model.runner.model_runner import ModelRunner, RunnerConfig

    table = slot_table(ours.spec, max(plan.batch_sizes))
    configs = {'eager': RunnerConfig(), 'graphs': padded_runner_config(plan)}
    return {
        name: ModelRunner(ours, req_to_token=table, num_kv_slots=table.numel(), config=config)
        for name, config in configs.items()
    }


# --- one control step -----------------------------------------------------------------------


def prompt_ids(spec, seed: int) -> list[int]:
    """OpenVLA's layout: BOS, the image placeholders, then the instruction's tokens."""
    rng = np.random.default_rng(seed)
    text = rng.integers(100, spec.action_tokens.token_start, OPENVLA_TEXT_TOKENS).tolist()
    return [1, *[spec.image_token_id] * spec.num_image_tokens, *text]


def frames(spec, count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    size = spec.preprocessing.image_size
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(count)]


def step_batch(
    *,
    mode: ForwardMode,
    prompts: list[list[int]],
    prefix_lens: list[int],
    req_to_token: torch.Tensor,
    images: tuple[tuple[ImageInput, ...], ...],
    sampling: SamplingParams,
) -> ForwardBatch:
    """A batch extending every prompt r from prefix_lens[r] to its end (robot r in row r)."""
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


def run_ours(runner, batch_size: int, seed: int) -> tuple[float, list[float], list[list[int]]]:
    """One control step for ``batch_size`` robots: (prefill s, decode step s list, tokens)."""
    spec = runner.model.spec
    prompts = [prompt_ids(spec, seed) for _ in range(batch_size)]
    images = tuple(
        (ImageInput(seed * 1000 + r, 1, spec.num_image_tokens, frame),)
        for r, frame in enumerate(frames(spec, batch_size, seed))
    )
    sampling = SamplingParams(0, spec.decoder.vocab_size)  # greedy over the whole vocabulary
    batch = step_batch(
        mode=ForwardMode.EXTEND, prompts=prompts, prefix_lens=[0] * batch_size,
        req_to_token=runner.req_to_token, images=images, sampling=sampling,
    )  # fmt: skip
    started = time.perf_counter()
    tokens = runner.launch(batch).result().next_token_ids
    prefill = time.perf_counter() - started
    generated, steps = [list(tokens)], []
    for _ in range(OPENVLA_ACTION_TOKENS - 1):
        lens = [len(p) for p in prompts]
        prompts = [[*p, t] for p, t in zip(prompts, tokens, strict=True)]
        batch = step_batch(
            mode=ForwardMode.DECODE, prompts=prompts, prefix_lens=lens,
            req_to_token=runner.req_to_token, images=((),) * batch_size, sampling=sampling,
        )  # fmt: skip
        started = time.perf_counter()
        tokens = runner.launch(batch).result().next_token_ids
        steps.append(time.perf_counter() - started)
        generated.append(list(tokens))
    return prefill, steps, [list(col) for col in zip(*generated, strict=True)]


def image_embeds(hf, ours, ids: torch.Tensor, batch_frames: list[np.ndarray]) -> torch.Tensor:
    """The prompt's input embeddings with our vision encoder's output right after BOS."""
    from vla_sched.model.layers.vision import preprocess_image

    spec = ours.spec
    pixels = torch.stack(
        [preprocess_image(f, spec.preprocessing, device=ids.device) for f in batch_frames]
    ).to(ours.dtype)
    embeds = hf.get_input_embeddings()(ids)
    embeds[:, 1 : 1 + spec.num_image_tokens] = ours.encode_images(pixels)
    return embeds


def run_hf(hf, ours, batch_size: int, seed: int, new_tokens: int):
    """transformers generate as OpenVLA calls it: (seconds, generated token lists)."""
    spec = ours.spec
    ids = torch.tensor([prompt_ids(spec, seed)] * batch_size)
    device = ours.decoder.embed_tokens.weight.device
    _sync(device)
    started = time.perf_counter()
    ids = ids.to(device)
    out = hf.generate(
        inputs_embeds=image_embeds(hf, ours, ids, frames(spec, batch_size, seed)),
        attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
        min_new_tokens=new_tokens, do_sample=False, pad_token_id=spec.image_token_id,
    )  # fmt: skip
    tokens = out[:, -new_tokens:].tolist()  # with inputs_embeds only new tokens come back
    return time.perf_counter() - started, tokens


def _sync(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def repeat(count: int, fn: Callable[[int], tuple]) -> list[tuple]:
    fn(WARMUP_SEED)  # compile kernels, capture graphs, fill allocator pools
    return [fn(rep) for rep in range(count)]


def logits_check(hf, ours, runner) -> dict[str, Any]:
    """Our prefill's last-token logits against transformers' on the same inputs."""
    spec = ours.spec
    prompt = prompt_ids(spec, 0)
    (frame,) = frames(spec, 1, 0)
    batch = step_batch(
        mode=ForwardMode.EXTEND, prompts=[prompt], prefix_lens=[0],
        req_to_token=runner.req_to_token,
        images=((ImageInput(77, 1, spec.num_image_tokens, frame),),),
        sampling=SamplingParams(0, spec.decoder.vocab_size),
    )  # fmt: skip
    ours_logits = runner.forward_logits(batch)[-1].float()
    ids = torch.tensor([prompt], device=runner.device)
    embeds = image_embeds(hf, ours, ids, [frame])
    hf_logits = hf(inputs_embeds=embeds, attention_mask=torch.ones_like(ids)).logits[0, -1]
    hf_logits = hf_logits.float()
    error = (ours_logits - hf_logits).abs().max() / hf_logits.abs().max().clamp_min(1e-30)
    top5 = set(ours_logits.topk(5).indices.tolist()) & set(hf_logits.topk(5).indices.tolist())
    return {
        'max_relative_error': float(error),
        'top1_equal': bool(ours_logits.argmax() == hf_logits.argmax()),
        'top5_overlap': len(top5),
    }


def measure_batch(hf, ours, runners: dict[str, Any], batch_size: int, reps: int) -> dict:
    """One robot count: each engine's prefill, decode step and step (ms, medians), and the
    share of greedy tokens each engine has in common with the others."""
    row: dict[str, Any] = {'robots': batch_size}
    tokens = {}
    for name, runner in runners.items():
        results = repeat(reps, lambda rep, r=runner: run_ours(r, batch_size, rep))
        row[name] = {
            'prefill_ms': 1e3 * statistics.median(r[0] for r in results),
            'decode_step_ms': 1e3 * statistics.median(s for r in results for s in r[1]),
            'step_ms': 1e3 * statistics.median(r[0] + sum(r[1]) for r in results),
        }
        tokens[name] = np.array([r[2] for r in results])
    one = repeat(reps, lambda rep: run_hf(hf, ours, batch_size, rep, 1))
    full = repeat(reps, lambda rep: run_hf(hf, ours, batch_size, rep, OPENVLA_ACTION_TOKENS))
    prefill = statistics.median(r[0] for r in one)
    total = statistics.median(r[0] for r in full)
    row['transformers'] = {
        'prefill_ms': 1e3 * prefill,
        'decode_step_ms': 1e3 * (total - prefill) / (OPENVLA_ACTION_TOKENS - 1),
        'step_ms': 1e3 * total,
    }
    hf_tokens = np.array([r[1] for r in full])
    row['graphs_equal_eager_share'] = float(np.mean(tokens['graphs'] == tokens['eager']))
    row['eager_equal_transformers_share'] = float(np.mean(tokens['eager'] == hf_tokens))
    row['graphs_equal_transformers_share'] = float(np.mean(tokens['graphs'] == hf_tokens))
    return row


def compare(
    plan: ComparePlan,
    *,
    rates: MeasuredRates | None = None,
    progress: Callable[[str], None] = print,
    on_update: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The whole comparison as a JSON-ready dict; with ``rates``, also the floor of one
    robot's step and our runner's (through its padded paths) against it. ``on_update`` gets
    the dict so far after the logits check and after each batch."""
    started = time.monotonic()
    config, ours, hf = build_models(plan)
    runners = make_runners(ours, plan)
    spec = ours.spec
    progress(f'models built in {time.monotonic() - started:.1f} s')
    out: dict[str, Any] = {
        'preset': plan.preset,
        'device': plan.device,
        'dtype': str(plan.dtype).removeprefix('torch.'),
        'reps': plan.reps,
        'prompt_tokens': 1 + spec.num_image_tokens + OPENVLA_TEXT_TOKENS,
        'num_action_tokens': OPENVLA_ACTION_TOKENS,
        'decoder_params_m': spec.decoder.num_params() / 1e6,
        'graphs_runner': 'CUDA graphs' if plan.device == 'cuda' else 'padded paths, no graphs',
        'batches': [],
    }
    updated = on_update or (lambda result: None)
    shape = openvla_shape(config, bytes_per_param=plan.dtype.itemsize)
    if rates is not None:
        out['floor'] = dataclasses.asdict(floor_of(shape, rates))
    with torch.inference_mode():
        out['logits'] = logits_check(hf, ours, runners['eager'])
        progress(f'last-token logits: {out["logits"]}')
        updated(out)
        for batch_size in plan.batch_sizes:
            row = measure_batch(hf, ours, runners, batch_size, plan.reps)
            progress(json.dumps(row))
            if rates is not None:
                row['batch_floor'] = dataclasses.asdict(batch_floor(shape, rates, row['robots']))
                row['graphs_step_over_batch_floor'] = (
                    row['graphs']['step_ms'] / row['batch_floor']['step_ms']
                )
                if not out['batches'] and row['robots'] == 1:
                    out['runner_step_over_floor'] = (
                        row['graphs']['step_ms'] / out['floor']['step_ms']
                    )
            out['batches'].append(row)
            updated(out)
    return out


# --- the report -----------------------------------------------------------------------------


def markdown_lines(result: dict[str, Any]) -> list[str]:
    """The comparison as a Markdown section (a heading, the logits, a table, the floor)."""
    lg = result['logits']
    rows = []
    for b in result['batches']:
        equal = {
            'eager': f'{100 * b["eager_equal_transformers_share"]:.0f}% to transformers',
            'graphs': f'{100 * b["graphs_equal_eager_share"]:.0f}% to eager, '
            f'{100 * b["graphs_equal_transformers_share"]:.0f}% to transformers',
            'transformers': '',
        }
        for engine in ENGINES:
            t = b[engine]
            rows.append(
                [b['robots'], engine, t['prefill_ms'], t['decode_step_ms'], t['step_ms'],
                 equal[engine]]
            )  # fmt: skip
    headers = ['robots', 'engine', 'prefill ms', 'decode step ms', 'step ms', 'tokens equal']
    lines = [
        f'## Model ({result["preset"]}, {result["dtype"]} on {result["device"]}, prompt '
        f'{result["prompt_tokens"]} tokens, {result["num_action_tokens"]} action tokens, '
        f'median of {result["reps"]}; "graphs": {result["graphs_runner"]})',
        '',
        f'Last-token logits against transformers: max relative error '
        f'{lg["max_relative_error"]:.2e}, top-1 {"equal" if lg["top1_equal"] else "differs"}, '
        f'top-5 overlap {lg["top5_overlap"]}/5.',
        '',
        markdown_table(headers, rows),
    ]
    if 'floor' in result:
        f = result['floor']
        lines += [
            '',
            f'Floor at {f["copy_gb_per_s"]:.0f} GB/s copy and {f["matmul_tflops"]:.3g} TFLOP/s: '
            f'prefill {f["prefill_ms"]:.2f} ms, decode step {f["decode_ms"]:.2f} ms, step '
            f'{f["step_ms"]:.2f} ms.',
        ]
        if 'runner_step_over_floor' in result:
            lines[-1] += f' One robot, "graphs" / floor: {result["runner_step_over_floor"]:.2f}x.'
        batched = [b for b in result['batches'] if b['robots'] > 1 and 'batch_floor' in b]
        for b in batched:
            f = b['batch_floor']
            lines[-1] += (
                f' {b["robots"]} robots in one batch: floor {f["step_ms"]:.1f} ms (prefill '
                f'{f["prefill_ms"]:.1f} ms, first decode step {f["decode_ms"]:.2f} ms with '
                f'every robot\'s KV), "graphs" / floor {b["graphs_step_over_batch_floor"]:.2f}x.'
            )
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu')
    parser.add_argument(
        '--tiny',
        action=argparse.BooleanOptionalAction,
        default=None,
        help='the tiny preset (default: on the CPU only)',
    )
    parser.add_argument('--batch-sizes', type=int, nargs='+', help='default: 1 8 (CPU), 1 16')
    parser.add_argument('--reps', type=int, default=10, help='timed steps per robot count')
    parser.add_argument('--threads', type=int, default=0, help='CPU threads (0: torch default)')
    parser.add_argument('--json', type=Path, help='also write the results here')
    parser.add_argument('--markdown', type=Path, help='also write the report here')
    return parser.parse_args(argv)


def plan_from_args(args: argparse.Namespace) -> ComparePlan:
    on_gpu = args.device == 'cuda'
    return ComparePlan(
        device=args.device,
        tiny=(not on_gpu) if args.tiny is None else args.tiny,
        batch_sizes=tuple(args.batch_sizes or ((1, 16) if on_gpu else (1, 8))),
        reps=args.reps,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == 'cuda' and not torch.cuda.is_available():
        print('no CUDA device: run with --device cpu', file=sys.stderr)
        return 2
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    if args.threads:
        torch.set_num_threads(args.threads)
    plan = plan_from_args(args)
    rates = measure_rates(plan.torch_device, plan.dtype)
    result = compare(plan, rates=rates, progress=lambda line: print(line, flush=True))
    report = '\n'.join(markdown_lines(result)) + '\n'
    print(report, end='')
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + '\n')
    if args.markdown:
        args.markdown.write_text(report)
    return 0


if __name__ == '__main__':
    sys.exit(main())
