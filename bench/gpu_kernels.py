"""Checks and times the paged-KV Triton kernels on a CUDA GPU.

For each kernel (decode attention, extend attention, KV store) the script checks the Triton
output against the float32 torch reference (bf16 and fp16 with ragged lengths, fp32, a
CUDA-graph replay, and every timed shape in bf16 and again in fp16), then times it
(``bench.lib.device_timing.Timer``: CUDA events, the median of many launches, rotating over
several independent input sets, the L2 cache flushed before every launch). Each launch is
timed twice: replayed from a CUDA graph (its device time, as the model's graphs run it;
GB/s and the speed-up come from this) and launched from Python (host time included, the
only timing before). It prints achieved GB/s next to the measured device-to-device copy
bandwidth, with torch SDPA over KV gathered through the same slot table (and index_put for
the store), also replayed from a graph, as the baseline. Shapes: batch 1 to 128, context
256 to 8192, a Llama-style GQA layer by default.

Then a sweep, bounded in time, times the launch configs of ``kernels/attention_configs.py``
against their alternatives on the largest shapes (decode: the rule's tiles at other split
counts, the previous tiles, SGLang's and two more; extend: the previous launch, SGLang's,
the rule without GQA packing and with 2 stages), so a run shows whether the rule picks the
fastest.

The prepared GPU run runs the same checks and timings, on fewer shapes, as its ``kernels``
part. Usage, from the repository root::

    python -m bench.gpu_kernels                 # full run on the GPU, a few minutes
    python -m bench.gpu_kernels --out k.md      # also write the report (Markdown) to k.md
    python -m bench.gpu_kernels --dry-run       # tiny shapes on the CPU under the Triton
                                                # interpreter: checks the script, not speed
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional

from bench.lib.device_timing import Timer, copy_bandwidth_gbs
from bench.lib.tables import markdown_table

TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}
MAX_KV_SPLITS = 8
SCRATCH_KEYS = ('out', 'attn_logits', 'attn_lse', 'num_kv_splits')


@dataclass(frozen=True, slots=True)
class BenchPlan:
    """Shapes and repetition counts of one run; the defaults are the GPU run's."""

    device: torch.device
    dtype: torch.dtype
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    batch_sizes: tuple[int, ...] = (1, 8, 32, 64, 128)
    context_lens: tuple[int, ...] = (256, 1024, 2048, 4096, 8192)
    extend_len: int = 256
    extend_batch_sizes: tuple[int, ...] = (1, 8, 32)
    store_token_counts: tuple[int, ...] = (1, 32, 128, 2048, 8192)
    num_input_sets: int = 3
    num_reps: int = 30
    # The sweep starts no candidate past this many seconds into run_kernels (the rule's own
    # launch always runs): the prepared run's kernels part has 75 s in all.
    sweep_until_s: float = 55.0

    def __post_init__(self) -> None:
        if self.num_kv_heads < 1 or self.num_q_heads % self.num_kv_heads:
            raise ValueError('num_q_heads must be a positive multiple of num_kv_heads')
        if self.num_input_sets < 1 or self.num_reps < 1:
            raise ValueError('num_input_sets and num_reps must be >= 1')

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads


def make_plan(args: argparse.Namespace) -> BenchPlan:
    """The GPU plan from the command line, or the tiny CPU plan for ``--dry-run``."""
    if args.dry_run:
        cpu = torch.device('cpu')
        return BenchPlan(cpu, torch.float32, 4, 2, 64, 4, (1, 3), (9, 24), 6, (2,), (5,), 2, 2)
    shape = (args.num_q_heads, args.num_kv_heads, args.head_dim, args.page_size)
    return BenchPlan(torch.device('cuda'), torch.bfloat16, *shape, num_reps=args.reps)


def paged_cache(plan: BenchPlan, seq_lens: list[int], seed: int) -> dict:
    """A fresh KV cache whose requests own shuffled pages, as the engine's allocator hands out."""
    from vla_sched.core.memory.pages import num_pages_for

    generator = torch.Generator(device=plan.device).manual_seed(seed)
    device, page = plan.device, plan.page_size
    pages_per_req = [num_pages_for(length, page) for length in seq_lens]
    num_pages = sum(pages_per_req) + 1
    shape = (num_pages * page, plan.num_kv_heads, plan.head_dim)
    k_cache = torch.randn(shape, generator=generator, device=device).to(plan.dtype)
    v_cache = torch.randn(shape, generator=generator, device=device).to(plan.dtype)
    order = torch.randperm(num_pages, generator=generator, device=device)
    req_to_token = torch.zeros((len(seq_lens), max(seq_lens)), dtype=torch.int32, device=device)
    first_page = 0
    for i, length in enumerate(seq_lens):
        pages = order[first_page : first_page + pages_per_req[i]]
        first_page += pages_per_req[i]
        slots = (pages[:, None] * page + torch.arange(page, device=device)).reshape(-1)
        req_to_token[i, :length] = slots[:length].to(torch.int32)
    return dict(
        k_cache=k_cache,
        v_cache=v_cache,
        req_to_token=req_to_token,
        req_pool_indices=torch.arange(len(seq_lens), device=device),
    )


def check_close(name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Raises AssertionError when the normwise relative error passes the dtype's tolerance."""
    scale = expected.float().abs().max().clamp_min(1e-30)
    error = float((actual.float() - expected.float()).abs().max() / scale)
    tolerance = TOLERANCES[expected.dtype]
    if not error <= tolerance:
        raise AssertionError(f'{name}: relative error {error:.2e} exceeds {tolerance:.0e}')


def rule_splits(plan: BenchPlan, seq_lens: torch.Tensor, num_sms: int, config=None):
    """Each request's split count by the rule, for ``config`` (the rule's launch if None)."""
    from vla_sched.kernels.decode_attention import choose_num_kv_splits

    return choose_num_kv_splits(
        seq_lens=seq_lens,
        num_q_heads=plan.num_q_heads,
        num_kv_heads=plan.num_kv_heads,
        max_kv_splits=MAX_KV_SPLITS,
        num_sms=num_sms,
        head_dim=plan.head_dim,
        itemsize=plan.dtype.itemsize,
        config=config,
    )


def decode_set(plan: BenchPlan, seq_lens: list[int], seed: int, num_sms: int) -> dict:
    """Keyword arguments of one decode launch, scratch buffers included."""
    batch_size, num_q_heads = len(seq_lens), plan.num_q_heads
    q = torch.randn((batch_size, num_q_heads, plan.head_dim), device=plan.device)
    seq_lens_t = torch.tensor(seq_lens, device=plan.device)
    splits = rule_splits(plan, seq_lens_t, num_sms)
    scratch_shape = (batch_size, num_q_heads, MAX_KV_SPLITS)
    return dict(
        paged_cache(plan, seq_lens, seed),
        q=q.to(plan.dtype),
        seq_lens=seq_lens_t,
        sm_scale=plan.head_dim**-0.5,
        out=q.new_empty(q.shape, dtype=plan.dtype),
        attn_logits=q.new_empty((*scratch_shape, plan.head_dim), dtype=torch.float32),
        attn_lse=q.new_empty(scratch_shape, dtype=torch.float32),
        num_kv_splits=splits,
    )


def extend_set(plan: BenchPlan, prefix_lens: list[int], extend_lens: list[int], seed: int) -> dict:
    """Keyword arguments of one extend launch; the new tokens' K/V are also in the cache."""
    totals = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    cache = paged_cache(plan, totals, seed)
    new_slots = torch.cat(
        [
            cache['req_to_token'][i, p:t].long()
            for i, (p, t) in enumerate(zip(prefix_lens, totals, strict=True))
        ]
    )
    extend_lens_t = torch.tensor(extend_lens, device=plan.device)
    q = torch.randn((len(new_slots), plan.num_q_heads, plan.head_dim), device=plan.device)
    return dict(
        cache,
        q=q.to(plan.dtype),
        k=cache['k_cache'][new_slots],
        v=cache['v_cache'][new_slots],
        prefix_lens=torch.tensor(prefix_lens, device=plan.device),
        extend_lens=extend_lens_t,
        extend_start_loc=torch.cumsum(extend_lens_t, 0) - extend_lens_t,
        sm_scale=plan.head_dim**-0.5,
    )


def run_decode(inputs: dict, config=None) -> None:
    from vla_sched.kernels.decode_attention import decode_attention

    decode_attention(**inputs, config=config)


def decode_ref(inputs: dict) -> torch.Tensor:
    from vla_sched.kernels.decode_attention import decode_attention_torch

    return decode_attention_torch(**{k: v for k, v in inputs.items() if k not in SCRATCH_KEYS})


def run_extend(inputs: dict, max_extend_len: int, config=None) -> torch.Tensor:
    from vla_sched.kernels.extend_attention import extend_attention

    q, v_cache = inputs['q'], inputs['v_cache']
    out = q.new_empty((q.shape[0], q.shape[1], v_cache.shape[2]))
    extend_attention(**inputs, max_extend_len=max_extend_len, out=out, config=config)
    return out


def extend_ref(inputs: dict) -> torch.Tensor:
    from vla_sched.kernels.extend_attention import extend_attention_torch

    return extend_attention_torch(**inputs)


def correctness_checks(plan: BenchPlan, num_sms: int) -> list[str]:
    """Ragged shapes in every dtype, plus a CUDA-graph replay of decode on a GPU."""
    done = []
    on_gpu = plan.device.type == 'cuda'
    dtypes = (torch.bfloat16, torch.float16, torch.float32) if on_gpu else (torch.float32,)
    decode_lens = [1, 37, 300, 1000, 2053] if on_gpu else [1, 37]
    prefix_lens, extend_lens = ([0, 13, 250], [40, 1, 77]) if on_gpu else ([0, 5, 11], [9, 1, 7])
    spans = [[3, 20], [0, 0], [260, 300]] if on_gpu else [[2, 6], [0, 0], [12, 16]]
    for dtype in dtypes:
        sub = replace(plan, dtype=dtype)
        inputs = decode_set(sub, decode_lens, 7, num_sms)
        run_decode(inputs)
        check_close(f'decode ragged {dtype}', inputs['out'], decode_ref(inputs))
        inputs = extend_set(sub, prefix_lens, extend_lens, 8)
        inputs['image_spans'] = torch.tensor(spans, device=plan.device)
        out = run_extend(inputs, max(extend_lens))
        check_close(f'extend ragged {dtype}', out, extend_ref(inputs))
        done.append(f'decode and extend, ragged lengths, {dtype}')
    if plan.device.type == 'cuda':
        inputs = decode_set(plan, [2048] * 32, 9, num_sms)
        run_decode(inputs)  # compile before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run_decode(inputs)
        inputs['q'].copy_(torch.randn_like(inputs['q']))
        graph.replay()
        torch.cuda.synchronize()
        check_close('decode CUDA-graph replay', inputs['out'], decode_ref(inputs))
        done.append('decode captured in a CUDA graph and replayed on new queries')
    return done


def _sdpa_over_gathered(s: dict, query: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Baseline: gather each request's KV through the slot table, then dense SDPA."""
    slots = s['req_to_token'].long()
    keys = s['k_cache'][slots].transpose(1, 2)
    values = s['v_cache'][slots].transpose(1, 2)
    return functional.scaled_dot_product_attention(
        query, keys, values, attn_mask=mask, scale=s['sm_scale'], enable_gqa=True
    )


def graph_median_ms(timer: Timer, fn, sets: list[dict]) -> float:
    """Median device time of ``fn`` replayed from a CUDA graph captured per input set (the
    way the model's graphs run the kernels: no host time between the launches), the L2
    flushed before each replay; off CUDA the host clock of plain calls."""
    if not timer.is_cuda:
        return timer.median_ms(fn, sets)
    graphs = []
    for inputs in sets:
        fn(inputs)  # compile and allocate outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(inputs)
        graphs.append({'graph': graph})
    return timer.median_ms(lambda g: g['graph'].replay(), graphs)


def _measure(timer: Timer, sets: list[dict], run, baseline, num_bytes: int, flops: float = 0):
    """Times the kernel (graph replay and Python launch) and the baseline (graph replay);
    returns the table columns they fill."""
    ms = graph_median_ms(timer, run, sets)
    return dict(
        ms=ms,
        launch_ms=timer.median_ms(run, sets) if timer.is_cuda else ms,
        gbs=num_bytes / ms / 1e6,
        tflops=flops / ms / 1e9,
        baseline_ms=graph_median_ms(timer, baseline, sets),
    )


def decode_bytes(plan: BenchPlan, batch_size: int, context_len: int) -> int:
    """Bytes a decode launch must move: K/V of every position, q in and out, slot ids."""
    kv_elements = 2 * batch_size * context_len * plan.num_kv_heads * plan.head_dim
    q_elements = batch_size * plan.num_q_heads * plan.head_dim
    return (kv_elements + 2 * q_elements) * plan.dtype.itemsize + 4 * batch_size * context_len


def extend_bytes_and_flops(plan: BenchPlan, batch_size: int, prefix_len: int) -> tuple[int, float]:
    """Bytes an extend launch must move (K/V of every position, q in and out) and its
    attention FLOPs (causal pairs only)."""
    ext = plan.extend_len
    kv_elements = 2 * batch_size * (prefix_len + ext) * plan.num_kv_heads * plan.head_dim
    q_elements = batch_size * ext * plan.num_q_heads * plan.head_dim
    pairs = batch_size * ext * (prefix_len + (ext + 1) / 2)  # query-key pairs computed
    num_bytes = (kv_elements + 2 * q_elements) * plan.dtype.itemsize
    return num_bytes, 4 * pairs * plan.num_q_heads * plan.head_dim


def bench_decode(plan: BenchPlan, timer: Timer, num_sms: int) -> list[dict]:
    rows = []
    for batch_size, context_len in itertools.product(plan.batch_sizes, plan.context_lens):
        lens = [context_len] * batch_size
        sets = [decode_set(plan, lens, seed, num_sms) for seed in range(plan.num_input_sets)]
        run_decode(sets[0])
        label = f'decode b={batch_size} ctx={context_len}'
        check_close(label, sets[0]['out'], decode_ref(sets[0]))
        num_bytes = decode_bytes(plan, batch_size, context_len)

        def sdpa(s: dict) -> torch.Tensor:
            return _sdpa_over_gathered(s, s['q'][:, :, None], None)

        columns = _measure(timer, sets, run_decode, sdpa, num_bytes)
        rows.append(dict(kernel='decode', batch=batch_size, context=context_len, **columns))
    return rows


def bench_extend(plan: BenchPlan, timer: Timer) -> list[dict]:
    rows = []
    ext = plan.extend_len
    for batch_size, prefix_len in itertools.product(plan.extend_batch_sizes, plan.context_lens):
        prefixes, extends = [prefix_len] * batch_size, [ext] * batch_size
        sets = [extend_set(plan, prefixes, extends, seed) for seed in range(plan.num_input_sets)]
        label = f'extend b={batch_size} prefix={prefix_len}'
        check_close(label, run_extend(sets[0], ext), extend_ref(sets[0]))
        positions = torch.arange(prefix_len + ext, device=plan.device)
        mask = positions[None, :] <= positions[prefix_len:, None]
        num_bytes, flops = extend_bytes_and_flops(plan, batch_size, prefix_len)

        def sdpa(s: dict, mask=mask, batch_size=batch_size) -> torch.Tensor:
            query = s['q'].view(batch_size, ext, plan.num_q_heads, -1).transpose(1, 2)
            return _sdpa_over_gathered(s, query, mask)

        def run(s: dict) -> torch.Tensor:
            return run_extend(s, ext)

        columns = _measure(timer, sets, run, sdpa, num_bytes, flops)
        rows.append(
            dict(kernel='extend', batch=batch_size, context=f'{prefix_len}+{ext}', **columns)
        )
    return rows


def _index_put(s: dict) -> None:
    """Baseline for the store: two indexed copies, no validation."""
    s['k_cache'][s['out_cache_loc']] = s['k']
    s['v_cache'][s['out_cache_loc']] = s['v']


def bench_store(plan: BenchPlan, timer: Timer) -> list[dict]:
    from vla_sched.kernels.store_kv import store_kv

    rows = []
    for num_tokens in plan.store_token_counts:
        shape = (4 * num_tokens, plan.num_kv_heads, plan.head_dim)
        sets = []
        for _ in range(plan.num_input_sets):
            k_cache, v_cache = (
                torch.zeros(shape, dtype=plan.dtype, device=plan.device) for _ in 'kv'
            )
            k, v = torch.randn((2, num_tokens, *shape[1:]), device=plan.device).to(plan.dtype)
            loc = torch.randperm(shape[0], device=plan.device)[:num_tokens]
            sets.append(dict(k=k, v=v, k_cache=k_cache, v_cache=v_cache, out_cache_loc=loc))
        first = sets[0]
        store_kv(**first)
        for name in ('k', 'v'):
            written = first[f'{name}_cache'][first['out_cache_loc']]
            check_close(f'store_kv {name} t={num_tokens}', written, first[name])
        num_bytes = 2 * (first['k'].nbytes + first['v'].nbytes) + 8 * num_tokens
        columns = _measure(timer, sets, lambda s: store_kv(**s), _index_put, num_bytes)
        rows.append(dict(kernel='store_kv', batch=num_tokens, context='-', **columns))
    return rows


@dataclass(frozen=True, slots=True)
class Candidate:
    """One launch the sweep times: a config, and for decode a fixed split count (None: the
    rule's split counts for that config)."""

    label: str
    config: Any
    num_splits: int | None = None


def describe(config: Any) -> str:
    """A config in a table cell, e.g. ``h16 n64 w4 s3`` or ``m128 n64 h4 w8 s3``."""
    if hasattr(config, 'block_h'):
        return f'h{config.block_h} n{config.block_n} w{config.num_warps} s{config.num_stages}'
    return (
        f'm{config.block_m} n{config.block_n} h{config.heads_per_program} '
        f'w{config.num_warps} s{config.num_stages}'
    )


def sweep_candidates(plan: BenchPlan, kernel: str) -> list[Candidate]:
    """The rule's launch first, then its alternatives; off CUDA (the dry run) only three:
    the sweep's code is checked, not its timings."""
    from vla_sched.kernels import attention_configs as configs

    shape = dict(
        head_dim=plan.head_dim,
        group=plan.group,
        itemsize=plan.dtype.itemsize,
        on_gpu=plan.device.type == 'cuda',
    )
    if kernel == 'decode':
        rule = configs.decode_config(**shape)
        fixed = [Candidate(f'rule tiles, {n} splits', rule, n) for n in (1, 2, 4, 8)]
        others = [Candidate(k, c) for k, c in configs.decode_alternatives(rule).items()]
    else:
        rule = configs.extend_config(**shape)
        fixed = []
        others = [Candidate(k, c) for k, c in configs.extend_alternatives(rule).items()]
    candidates = [Candidate('rule', rule), *fixed, *others]
    if plan.device.type != 'cuda':
        return [candidates[0], candidates[-1], candidates[1]]
    return candidates


def _sweep(deadline, shapes, candidates, timed_row, on_row=None) -> tuple[list, list]:
    """Times each candidate on each shape, candidate by candidate (one compile each); past
    ``deadline`` only the rule (the first) still runs. ``on_row`` gets each row as timed."""
    rows, skipped = [], []
    for index, candidate in enumerate(candidates):
        for shape in shapes:
            if index and time.perf_counter() > deadline:
                skipped.append(f'{candidate.label} at {shape}')
                continue
            rows.append(timed_row(candidate, shape))
            if on_row is not None:
                on_row(rows[-1])
    return rows, skipped


def sweep_decode(
    plan: BenchPlan, timer: Timer, num_sms: int, deadline: float, on_row=None
) -> dict:
    """The decode launches of the largest shapes: the rule against the alternatives."""
    shapes = [(b, c) for b in plan.batch_sizes[-2:] for c in plan.context_lens[-2:]]
    if plan.device.type != 'cuda':
        shapes = shapes[-1:]
    sets = {
        shape: [decode_set(plan, [shape[1]] * shape[0], seed, num_sms) for seed in range(2)]
        for shape in shapes
    }
    refs = {shape: decode_ref(sets[shape][0]) for shape in shapes}

    def timed_row(candidate: Candidate, shape: tuple[int, int]) -> dict:
        batch_size, context_len = shape
        lens = sets[shape][0]['seq_lens']
        if candidate.num_splits is None:
            splits = rule_splits(plan, lens, num_sms, candidate.config)
        else:
            splits = torch.full_like(lens, candidate.num_splits, dtype=torch.int32)
        runs = [dict(s, num_kv_splits=splits) for s in sets[shape]]

        def run(s: dict) -> None:
            run_decode(s, candidate.config)

        run(runs[0])
        label = f'decode {candidate.label} b={batch_size} ctx={context_len}'
        check_close(label, runs[0]['out'], refs[shape])
        ms = graph_median_ms(timer, run, runs)
        return dict(
            kernel='decode',
            batch=batch_size,
            context=str(context_len),
            candidate=candidate.label,
            config=describe(candidate.config),
            splits=int(splits[0]),
            ms=ms,
            gbs=decode_bytes(plan, batch_size, context_len) / ms / 1e6,
        )

    rows, skipped = _sweep(deadline, shapes, sweep_candidates(plan, 'decode'), timed_row, on_row)
    return dict(rows=rows, skipped=skipped)


def sweep_extend(plan: BenchPlan, timer: Timer, deadline: float, on_row=None) -> dict:
    """The extend launches of the largest batch over the longest prefixes: the rule against
    the alternatives."""
    ext = plan.extend_len
    shapes = [(plan.extend_batch_sizes[-1], c) for c in plan.context_lens[-2:]]
    if plan.device.type != 'cuda':
        shapes = shapes[-1:]
    sets = {
        shape: [extend_set(plan, [shape[1]] * shape[0], [ext] * shape[0], s) for s in range(2)]
        for shape in shapes
    }
    refs = {shape: extend_ref(sets[shape][0]) for shape in shapes}

    def timed_row(candidate: Candidate, shape: tuple[int, int]) -> dict:
        batch_size, prefix_len = shape

        def run(s: dict) -> torch.Tensor:
            return run_extend(s, ext, candidate.config)

        label = f'extend {candidate.label} b={batch_size} prefix={prefix_len}'
        check_close(label, run(sets[shape][0]), refs[shape])
        ms = graph_median_ms(timer, run, sets[shape])
        num_bytes, flops = extend_bytes_and_flops(plan, batch_size, prefix_len)
        return dict(
            kernel='extend',
            batch=batch_size,
            context=f'{prefix_len}+{ext}',
            candidate=candidate.label,
            config=describe(candidate.config),
            splits=None,
            ms=ms,
            gbs=num_bytes / ms / 1e6,
            tflops=flops / ms / 1e9,
        )

    rows, skipped = _sweep(deadline, shapes, sweep_candidates(plan, 'extend'), timed_row, on_row)
    return dict(rows=rows, skipped=skipped)


def sweep_verdicts(rows: list[dict], baselines: dict[tuple, float]) -> list[dict]:
    """Per swept shape: the fastest candidate, the rule's time over it, and the rule against
    the main table's baseline (SDPA) of that shape."""
    verdicts = []
    shapes = dict.fromkeys((r['kernel'], r['batch'], r['context']) for r in rows)
    for shape in shapes:
        timed = [r for r in rows if (r['kernel'], r['batch'], r['context']) == shape]
        rule = next(r for r in timed if r['candidate'] == 'rule')
        best = min(timed, key=lambda r: r['ms'])
        baseline = baselines.get(shape)
        verdicts.append(
            dict(
                kernel=shape[0],
                batch=shape[1],
                context=shape[2],
                fastest=best['candidate'],
                rule_over_fastest=rule['ms'] / best['ms'],
                rule_over_baseline=rule['ms'] / baseline if baseline else None,
                num_timed=len(timed),
            )
        )
    return verdicts


def check_shapes_in(plan: BenchPlan, dtype: torch.dtype, num_sms: int) -> str:
    """Every decode and extend shape of ``plan`` once more in ``dtype``, against the
    reference (the timed runs check them in ``plan.dtype``)."""
    other = replace(plan, dtype=dtype)
    for batch_size, context_len in itertools.product(plan.batch_sizes, plan.context_lens):
        inputs = decode_set(other, [context_len] * batch_size, 11, num_sms)
        run_decode(inputs)
        label = f'decode b={batch_size} ctx={context_len} {dtype}'
        check_close(label, inputs['out'], decode_ref(inputs))
    ext = plan.extend_len
    for batch_size, prefix_len in itertools.product(plan.extend_batch_sizes, plan.context_lens):
        inputs = extend_set(other, [prefix_len] * batch_size, [ext] * batch_size, 12)
        label = f'extend b={batch_size} prefix={prefix_len} {dtype}'
        check_close(label, run_extend(inputs, ext), extend_ref(inputs))
    return f'every benchmark shape in {plan.dtype} (timed) and {dtype}'


def run_kernels(
    plan: BenchPlan,
    *,
    copy_gb_per_s: float | None = None,
    extra_dtype: torch.dtype | None = None,
    progress=print,
    on_update=None,
) -> dict[str, Any]:
    """Check every kernel, then time every shape of ``plan``: a JSON-ready dict.

    ``copy_gb_per_s`` is the device's copy bandwidth the rows are set against (measured
    here when not given); ``extra_dtype`` checks every timed shape again in that dtype.
    ``on_update`` gets the dict so far (in the same layout) after the checks, after each
    kernel's timed shapes, after each sweep row and after each kernel's sweep (the last is
    the whole dict).
    """
    started = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 references must be exact fp32
    on_gpu = plan.device.type == 'cuda'
    num_sms = torch.cuda.get_device_properties(plan.device).multi_processor_count if on_gpu else 1
    timer = Timer(plan.device, plan.num_reps)
    if copy_gb_per_s is None:
        copy_gb_per_s = copy_bandwidth_gbs(timer, 1 << 30 if on_gpu else 1 << 20)
    checks = correctness_checks(plan, num_sms)
    progress('checked: ' + '; '.join(checks))
    rows: list[dict] = []
    sweep: dict[str, list] = {'rows': [], 'skipped': []}

    def update() -> None:
        if on_update is not None:
            on_update(kernels_result(plan, checks, copy_gb_per_s, rows, sweep))

    def add_rows(new_rows: list[dict]) -> None:
        for row in new_rows:
            row['copy_share'] = row['gbs'] / copy_gb_per_s
            row['context'] = str(row['context'])
        rows.extend(new_rows)
        update()

    update()
    if extra_dtype is not None:
        checks.append(check_shapes_in(plan, extra_dtype, num_sms))
        progress(f'checked every benchmark shape in {extra_dtype}')
    add_rows(bench_decode(plan, timer, num_sms))
    progress(f'decode timed ({len(rows)} shapes)')
    add_rows(bench_extend(plan, timer))
    add_rows(bench_store(plan, timer))
    progress(f'timed {len(rows)} shapes at {time.perf_counter() - started:.0f} s; sweeping')

    def add_sweep_row(row: dict) -> None:
        row['copy_share'] = row['gbs'] / copy_gb_per_s
        sweep['rows'].append(row)
        update()

    deadline = started + plan.sweep_until_s
    sweep['skipped'] += sweep_decode(plan, timer, num_sms, deadline, add_sweep_row)['skipped']
    update()
    sweep['skipped'] += sweep_extend(plan, timer, deadline, add_sweep_row)['skipped']
    update()
    return kernels_result(plan, checks, copy_gb_per_s, rows, sweep)


def kernels_result(
    plan: BenchPlan, checks: list[str], copy_gb_per_s: float, rows: list[dict], sweep: dict
) -> dict[str, Any]:
    """``run_kernels``' dict from what it has checked, timed and swept so far."""
    on_gpu = plan.device.type == 'cuda'
    baselines = {(r['kernel'], r['batch'], r['context']): r['baseline_ms'] for r in rows}
    target = [
        r['copy_share']
        for r in rows
        if r['kernel'] == 'decode' and r['batch'] >= 32 and int(r['context']) >= 2048
    ]
    return {
        'device': torch.cuda.get_device_name(plan.device) if on_gpu else 'CPU (interpreter)',
        'shape': {
            'num_q_heads': plan.num_q_heads,
            'num_kv_heads': plan.num_kv_heads,
            'head_dim': plan.head_dim,
            'page_size': plan.page_size,
            'dtype': str(plan.dtype).removeprefix('torch.'),
            'num_reps': plan.num_reps,
        },
        'checks': list(checks),
        'copy_gb_per_s': copy_gb_per_s,
        'rows': rows,
        'decode_worst_copy_share': min(target) if target else None,
        'sweep': {
            'rows': sweep['rows'],
            'skipped': sweep['skipped'],
            'verdicts': sweep_verdicts(sweep['rows'], baselines),
        },
    }


def markdown_lines(result: dict[str, Any]) -> list[str]:
    """The kernels' report: a heading, what was checked, a row per timed shape (the baseline
    is SDPA over gathered KV, index_put for store_kv), then the sweep of launch configs."""
    s = result['shape']
    rows = [
        [r['kernel'], r['batch'], r['context'], f'{r["ms"]:.3f}', f'{r["launch_ms"]:.3f}',
         f'{r["gbs"]:.0f}', f'{100 * r["copy_share"]:.0f}%',
         f'{r["tflops"]:.1f}' if r['tflops'] else '-', f'{r["baseline_ms"]:.3f}',
         f'{r["baseline_ms"] / r["ms"]:.2f}x']
        for r in result['rows']
    ]  # fmt: skip
    headers = ['kernel', 'batch (tokens)', 'context', 'graph ms', 'launch ms', 'GB/s']
    headers += ['of copy', 'TFLOP/s', 'baseline graph ms', 'speed-up']
    worst = result['decode_worst_copy_share']
    lines = [
        f'## Kernels on {result["device"]} (Hq={s["num_q_heads"]}, Hkv={s["num_kv_heads"]}, '
        f'D={s["head_dim"]}, page {s["page_size"]}, {s["dtype"]}, median of {s["num_reps"]}, '
        'L2 flushed)',
        '',
        'Checked against the float32 reference: ' + '; '.join(result['checks']) + '.',
        f'"of copy": of the device-to-device copy bandwidth, {result["copy_gb_per_s"]:.0f} GB/s '
        '(reads + writes). "graph ms": the launch replayed from a CUDA graph (device time; '
        'GB/s, TFLOP/s and the speed-up use it); "launch ms": launched from Python, host '
        'time included.',
        '',
        markdown_table(headers, rows),
    ]
    if worst is not None:
        lines += [
            '',
            f'Decode at batch >= 32 and context >= 2048: worst {100 * worst:.0f}% of copy '
            'bandwidth (target 70%).',
        ]
    return lines + sweep_lines(result['sweep'])


def sweep_lines(sweep: dict[str, Any]) -> list[str]:
    """The sweep's table (graph replay; decode's "splits" is each request's count) and, per
    shape, the fastest launch and the rule's time over it."""
    if not sweep['rows']:
        return []
    rows = [
        [r['kernel'], r['batch'], r['context'], r['candidate'], r['config'],
         r['splits'] if r['splits'] is not None else '-', f'{r["ms"]:.3f}', f'{r["gbs"]:.0f}',
         f'{100 * r["copy_share"]:.0f}%']
        for r in sweep['rows']
    ]  # fmt: skip
    headers = ['kernel', 'batch', 'context', 'launch', 'config', 'splits', 'graph ms', 'GB/s']
    lines = [
        '',
        '### Launch configs against the alternatives (graph replay)',
        '',
        markdown_table([*headers, 'of copy'], rows),
        '',
    ]
    for v in sweep['verdicts']:
        against = ''
        if v['rule_over_baseline'] is not None:
            against = f"; rule {v['rule_over_baseline']:.2f}x the SDPA baseline's time"
        lines.append(
            f'- {v["kernel"]} b={v["batch"]} ctx={v["context"]}: fastest of {v["num_timed"]} '
            f'is "{v["fastest"]}"; rule {v["rule_over_fastest"]:.2f}x its time{against}.'
        )
    if sweep['skipped']:
        lines.append('- Not timed (time budget): ' + '; '.join(sweep['skipped']) + '.')
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument(
        '--dry-run', action='store_true', help='tiny shapes on the CPU interpreter'
    )
    parser.add_argument('--num-q-heads', type=int, default=32)
    parser.add_argument('--num-kv-heads', type=int, default=8)
    parser.add_argument('--head-dim', type=int, default=128)
    parser.add_argument('--page-size', type=int, default=16)
    parser.add_argument('--reps', type=int, default=30, help='timed launches per shape')
    parser.add_argument('--out', type=Path, help='also write the report (Markdown) here')
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        # Kernel modules are imported on first launch, so this still reaches them.
        os.environ.setdefault('TRITON_INTERPRET', '1')
    elif not torch.cuda.is_available():
        print('no CUDA device: run with --dry-run to check the script on the CPU', file=sys.stderr)
        return 2
    import triton

    plan = make_plan(args)
    started = time.perf_counter()
    extra = torch.float16 if plan.device.type == 'cuda' else None
    result = run_kernels(plan, extra_dtype=extra, progress=lambda line: None)
    report = '\n'.join(
        [
            *markdown_lines(result),
            '',
            f'torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}; '
            f'wall time {time.perf_counter() - started:.0f} s.',
        ]
    )
    print(report)
    if args.out:
        args.out.write_text(report + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
