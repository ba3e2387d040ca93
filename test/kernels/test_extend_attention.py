"""The Triton extend kernel under the interpreter against its float32 reference.

The output starts as NaN and every slot no request owns holds NaN, so an element the kernel
forgets to write or a slot it reads by mistake fails the check.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from paged_kv_cases import build_paged_kv, max_rel_error

from vla_sched.kernels.attention_configs import (
    ExtendConfig,
    extend_alternatives,
    extend_config,
    extend_heads_per_program,
)
from vla_sched.kernels.extend_attention import (
    extend_attention,
    extend_attention_torch,
    run_extend_attention,
)

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

TOLERANCE = 1e-5


@dataclass(frozen=True)
class ExtendCase:
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    page_size: int
    prefix_lens: tuple[int, ...]
    extend_lens: tuple[int, ...]
    image_spans: tuple[tuple[int, int], ...] | None = None


CASES = {
    'mha-d64-page1-no-prefix': ExtendCase(2, 2, 64, 64, 1, (0, 3), (5, 17)),
    'gqa2-d80-page16': ExtendCase(4, 2, 80, 80, 16, (0, 16, 21), (20, 1, 9)),
    'gqa2-d96-image-span': ExtendCase(6, 3, 96, 96, 16, (33,), (18,), ((40, 48),)),
    'mqa-d128-span-from-prefix-and-empty-span': ExtendCase(
        4, 1, 128, 128, 1, (4, 0), (11, 13), ((2, 9), (3, 3))
    ),
    'request-without-new-tokens': ExtendCase(2, 1, 64, 64, 16, (5, 9, 0), (3, 0, 4)),
    'span-crossing-query-blocks': ExtendCase(2, 2, 64, 64, 16, (2,), (37,), ((10, 30),)),
    'v-head-dim-differs': ExtendCase(4, 2, 64, 80, 16, (7,), (19,), ((7, 12),)),
}


def _make_inputs(case: ExtendCase, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    totals = [p + e for p, e in zip(case.prefix_lens, case.extend_lens, strict=True)]
    paged = build_paged_kv(
        seq_lens=totals,
        num_kv_heads=case.num_kv_heads,
        head_dim=case.head_dim,
        v_head_dim=case.v_head_dim,
        page_size=case.page_size,
        dtype=torch.float32,
        generator=generator,
    )
    prefixes = case.prefix_lens
    k = torch.cat([dense[p:] for dense, p in zip(paged.dense_k, prefixes, strict=True)])
    v = torch.cat([dense[p:] for dense, p in zip(paged.dense_v, prefixes, strict=True)])
    extend_lens = torch.tensor(case.extend_lens, dtype=torch.int64)
    num_tokens = int(extend_lens.sum())
    q = torch.randn((num_tokens, case.num_q_heads, case.head_dim), generator=generator)
    spans = None if case.image_spans is None else torch.tensor(case.image_spans)
    return dict(
        q=q,
        k=k,
        v=v,
        k_cache=paged.k_cache,
        v_cache=paged.v_cache,
        req_to_token=paged.req_to_token,
        req_pool_indices=paged.req_pool_indices,
        prefix_lens=torch.tensor(case.prefix_lens, dtype=torch.int64),
        extend_lens=extend_lens,
        extend_start_loc=torch.cumsum(extend_lens, 0) - extend_lens,
        sm_scale=case.head_dim**-0.5,
        image_spans=spans,
    )


def _poisoned_out(inputs: dict) -> torch.Tensor:
    num_tokens, num_q_heads, _ = inputs['q'].shape
    return torch.full((num_tokens, num_q_heads, inputs['v'].shape[2]), float('nan'))


@pytest.mark.parametrize('name', list(CASES))
def test_extend_kernel_matches_reference(name):
    case = CASES[name]
    inputs = _make_inputs(case, seed=len(name) * 17 + sum(case.extend_lens))
    out = _poisoned_out(inputs)
    max_extend_len = max(case.extend_lens)
    extend_attention(**inputs, max_extend_len=max_extend_len, out=out, debug=True)
    assert max_rel_error(out, extend_attention_torch(**inputs)) <= TOLERANCE


@pytest.mark.parametrize('head_dim', [64, 80, 96, 128])
@pytest.mark.parametrize('page_size', [1, 16])
@pytest.mark.parametrize('use_spans', [False, True])
def test_extend_kernel_matches_reference_across_head_dims_pages_and_masks(
    head_dim, page_size, use_spans
):
    seed = head_dim * 100 + page_size * 2 + use_spans
    generator = torch.Generator().manual_seed(seed)
    prefix_lens = tuple(int(x) for x in torch.randint(0, 30, (2,), generator=generator))
    extend_lens = tuple(int(x) for x in torch.randint(1, 24, (2,), generator=generator))
    spans = None
    if use_spans:
        spans = tuple(
            (p + 1, p + e - 1) if e > 2 else (0, 0)
            for p, e in zip(prefix_lens, extend_lens, strict=True)
        )
    case = ExtendCase(4, 2, head_dim, head_dim, page_size, prefix_lens, extend_lens, spans)
    inputs = _make_inputs(case, seed=seed + 1)
    out = _poisoned_out(inputs)
    extend_attention(**inputs, max_extend_len=max(extend_lens), out=out, debug=True)
    assert max_rel_error(out, extend_attention_torch(**inputs)) <= TOLERANCE


GPU_RULE = extend_config(head_dim=128, group=2, itemsize=2, on_gpu=True)
GPU_CONFIGS = {
    'rule-bf16': GPU_RULE,
    'rule-fp32': extend_config(head_dim=128, group=2, itemsize=4, on_gpu=True),
    'rule-d256': extend_config(head_dim=256, group=2, itemsize=2, on_gpu=True),
    **extend_alternatives(GPU_RULE),
}


@pytest.mark.parametrize('name', list(GPU_CONFIGS))
def test_extend_kernel_with_each_gpu_config_matches_reference(name):
    # 64 tokens per packed 128-row program: the second request crosses two token blocks.
    case = ExtendCase(4, 2, 128, 128, 16, (70, 0), (100, 65), ((80, 150), (0, 0)))
    inputs = _make_inputs(case, seed=77)
    out = _poisoned_out(inputs)
    extend_attention(**inputs, max_extend_len=100, out=out, config=GPU_CONFIGS[name])
    assert max_rel_error(out, extend_attention_torch(**inputs)) <= TOLERANCE


@pytest.mark.parametrize('heads', [1, 3])
def test_extend_kernel_packs_a_gqa_group_of_three_or_runs_one_head(heads):
    # 16 rows hold 5 tokens of 3 heads (one row idle) or 16 tokens of one head.
    case = ExtendCase(6, 2, 64, 64, 16, (9, 0), (13, 6), ((10, 14), (0, 0)))
    inputs = _make_inputs(case, seed=31 + heads)
    out = _poisoned_out(inputs)
    config = ExtendConfig(16, 8, heads, 4, 1)
    extend_attention(**inputs, max_extend_len=13, out=out, config=config, debug=True)
    assert max_rel_error(out, extend_attention_torch(**inputs)) <= TOLERANCE


def test_extend_programs_pack_the_gqa_group_while_it_leaves_four_tokens_each():
    assert [extend_heads_per_program(g, 128) for g in (1, 2, 4, 8, 32, 64)] == [
        1, 2, 4, 8, 32, 1,
    ]  # fmt: skip
    assert extend_heads_per_program(8, 16) == 1


def test_extend_kernel_takes_int64_slot_tables_and_int32_lengths():
    case = ExtendCase(2, 1, 64, 64, 16, (9, 0), (5, 12), ((10, 13), (2, 8)))
    inputs = _make_inputs(case, seed=13)
    expected = extend_attention_torch(**inputs)
    inputs['req_to_token'] = inputs['req_to_token'].long()
    for name in ('req_pool_indices', 'prefix_lens', 'extend_lens', 'extend_start_loc'):
        inputs[name] = inputs[name].int()
    inputs['image_spans'] = inputs['image_spans'].int()
    out = _poisoned_out(inputs)
    extend_attention(**inputs, max_extend_len=12, out=out, debug=True)
    assert max_rel_error(out, expected) <= TOLERANCE


def test_run_extend_attention_triton_backend_matches_reference():
    case = ExtendCase(4, 2, 80, 80, 16, (3, 12), (9, 14), ((5, 9), (0, 0)))
    inputs = _make_inputs(case, seed=8)
    out = run_extend_attention(**inputs, backend='triton')
    assert max_rel_error(out, extend_attention_torch(**inputs)) <= TOLERANCE
