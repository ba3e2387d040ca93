"""The Triton decode kernel under the interpreter against its float32 reference.

Every output and scratch buffer starts as NaN and every slot no request owns holds NaN, so
an element the kernel forgets to write or a slot it reads by mistake fails the check.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from paged_kv_cases import build_paged_kv, max_rel_error

from vla_sched.kernels.attention_configs import (
    DecodeConfig,
    decode_alternatives,
    decode_config,
    decode_heads_per_program,
)
from vla_sched.kernels.decode_attention import (
    choose_num_kv_splits,
    decode_attention,
    decode_attention_torch,
    run_decode_attention,
)

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

TOLERANCE = 1e-5


@dataclass(frozen=True)
class DecodeCase:
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    page_size: int
    seq_lens: tuple[int, ...]
    num_kv_splits: tuple[int, ...]
    max_kv_splits: int


CASES = {
    'mha-d64-page1': DecodeCase(4, 4, 64, 64, 1, (1, 9, 23), (1, 2, 3), 4),
    'gqa4-d80-page16': DecodeCase(8, 2, 80, 80, 16, (37, 5, 16), (4, 1, 2), 4),
    'gqa2-d96-more-splits-than-tiles': DecodeCase(6, 3, 96, 96, 16, (50, 1), (8, 8), 8),
    'mqa8-d128-page1': DecodeCase(8, 1, 128, 128, 1, (33, 17, 2), (2, 3, 1), 3),
    'mqa32-whole-group-in-one-program': DecodeCase(32, 1, 64, 64, 16, (19,), (3,), 3),
    'mqa128-two-head-blocks': DecodeCase(128, 1, 64, 64, 16, (19, 4), (3, 1), 3),
    'v-head-dim-differs': DecodeCase(4, 2, 64, 80, 16, (45, 12), (5, 2), 6),
}


def _make_inputs(case: DecodeCase, seed: int, dtype: torch.dtype = torch.float32):
    generator = torch.Generator().manual_seed(seed)
    paged = build_paged_kv(
        seq_lens=list(case.seq_lens),
        num_kv_heads=case.num_kv_heads,
        head_dim=case.head_dim,
        v_head_dim=case.v_head_dim,
        page_size=case.page_size,
        dtype=dtype,
        generator=generator,
    )
    batch_size = len(case.seq_lens)
    q = torch.randn((batch_size, case.num_q_heads, case.head_dim), generator=generator)
    return dict(
        q=q.to(dtype),
        k_cache=paged.k_cache,
        v_cache=paged.v_cache,
        req_to_token=paged.req_to_token,
        req_pool_indices=paged.req_pool_indices,
        seq_lens=torch.tensor(case.seq_lens, dtype=torch.int64),
        sm_scale=case.head_dim**-0.5,
    )


def _poisoned_buffers(case: DecodeCase, dtype: torch.dtype = torch.float32):
    shape = (len(case.seq_lens), case.num_q_heads)
    nan = float('nan')
    return dict(
        out=torch.full((*shape, case.v_head_dim), nan, dtype=dtype),
        attn_logits=torch.full((*shape, case.max_kv_splits, case.v_head_dim), nan),
        attn_lse=torch.full((*shape, case.max_kv_splits), nan),
        num_kv_splits=torch.tensor(case.num_kv_splits, dtype=torch.int32),
    )


@pytest.mark.parametrize('name', list(CASES))
def test_decode_kernel_matches_reference(name):
    case = CASES[name]
    inputs = _make_inputs(case, seed=len(name) * 31 + sum(case.seq_lens))
    buffers = _poisoned_buffers(case)
    decode_attention(**inputs, **buffers, debug=True)
    expected = decode_attention_torch(**inputs)
    assert max_rel_error(buffers['out'], expected) <= TOLERANCE


@pytest.mark.parametrize('head_dim', [64, 80, 96, 128])
@pytest.mark.parametrize('page_size', [1, 16])
@pytest.mark.parametrize('num_q_heads,num_kv_heads', [(2, 2), (4, 1), (6, 2)])
def test_decode_kernel_matches_reference_across_head_dims_pages_and_groups(
    head_dim, page_size, num_q_heads, num_kv_heads
):
    seed = head_dim * 1000 + page_size * 10 + num_q_heads + num_kv_heads
    generator = torch.Generator().manual_seed(seed)
    seq_lens = tuple(int(x) for x in torch.randint(1, 48, (3,), generator=generator))
    splits = tuple(int(x) for x in torch.randint(1, 5, (3,), generator=generator))
    case = DecodeCase(
        num_q_heads, num_kv_heads, head_dim, head_dim, page_size, seq_lens, splits, 4
    )
    inputs = _make_inputs(case, seed=seed + 1)
    buffers = _poisoned_buffers(case)
    decode_attention(**inputs, **buffers, debug=True)
    expected = decode_attention_torch(**inputs)
    assert max_rel_error(buffers['out'], expected) <= TOLERANCE


GPU_RULE = decode_config(head_dim=128, group=4, itemsize=2, on_gpu=True)
GPU_CONFIGS = {
    'rule-bf16': GPU_RULE,
    'rule-fp32': decode_config(head_dim=128, group=4, itemsize=4, on_gpu=True),
    'rule-d256': decode_config(head_dim=256, group=4, itemsize=2, on_gpu=True),
    **decode_alternatives(GPU_RULE),
}


@pytest.mark.parametrize('name', list(GPU_CONFIGS))
def test_decode_kernel_with_each_gpu_config_matches_reference(name):
    # Lengths cross the configs' 32 to 128-row tiles and split alignments.
    case = DecodeCase(8, 2, 128, 128, 16, (130, 70, 3), (2, 3, 1), 3)
    inputs = _make_inputs(case, seed=2024)
    buffers = _poisoned_buffers(case)
    decode_attention(**inputs, **buffers, config=GPU_CONFIGS[name], debug=True)
    expected = decode_attention_torch(**inputs)
    assert max_rel_error(buffers['out'], expected) <= TOLERANCE


def test_a_decode_program_holds_its_whole_gqa_group_up_to_64_heads():
    assert [decode_heads_per_program(g) for g in (1, 4, 16, 24, 32, 64, 128)] == [
        16, 16, 16, 32, 32, 64, 64,
    ]  # fmt: skip


def test_decode_kernel_takes_int64_slot_tables_and_int32_lengths():
    case = DecodeCase(4, 2, 64, 64, 16, (21, 6), (2, 1), 2)
    inputs = _make_inputs(case, seed=41)
    expected = decode_attention_torch(**inputs)
    inputs['req_to_token'] = inputs['req_to_token'].long()
    inputs['req_pool_indices'] = inputs['req_pool_indices'].int()
    inputs['seq_lens'] = inputs['seq_lens'].int()
    buffers = _poisoned_buffers(case)
    decode_attention(**inputs, **buffers, debug=True)
    assert max_rel_error(buffers['out'], expected) <= TOLERANCE


def test_decode_kernel_result_does_not_depend_on_the_split_count():
    base = DecodeCase(4, 2, 64, 64, 16, (61, 40), (1, 1), 8)
    inputs = _make_inputs(base, seed=99)
    outputs = []
    for splits in ((1, 1), (3, 2), (8, 8)):
        case = DecodeCase(4, 2, 64, 64, 16, (61, 40), splits, 8)
        buffers = _poisoned_buffers(case)
        decode_attention(**inputs, **buffers)
        outputs.append(buffers['out'])
    assert max_rel_error(outputs[1], outputs[0]) <= TOLERANCE
    assert max_rel_error(outputs[2], outputs[0]) <= TOLERANCE


def test_decode_kernel_bf16_inputs_stay_close_to_the_float32_reference():
    case = DecodeCase(4, 2, 64, 64, 16, (29, 8), (2, 1), 2)
    inputs = _make_inputs(case, seed=5, dtype=torch.bfloat16)
    buffers = _poisoned_buffers(case, dtype=torch.bfloat16)
    decode_attention(**inputs, **buffers)
    assert buffers['out'].dtype == torch.bfloat16
    expected = decode_attention_torch(**inputs)
    assert max_rel_error(buffers['out'], expected) <= 1e-2


def test_run_decode_attention_triton_backend_picks_splits_and_matches_reference():
    case = DecodeCase(8, 2, 80, 80, 1, (300, 7), (1, 1), 4)
    inputs = _make_inputs(case, seed=17)
    out = run_decode_attention(**inputs, backend='triton', max_kv_splits=4)
    assert max_rel_error(out, decode_attention_torch(**inputs)) <= TOLERANCE


def _gpu_splits(batch_size: int, seq_len: int, config: DecodeConfig = GPU_RULE) -> list[int]:
    splits = choose_num_kv_splits(
        seq_lens=torch.full((batch_size,), seq_len),
        num_q_heads=32,
        num_kv_heads=8,
        max_kv_splits=8,
        num_sms=132,
        config=config,
    )
    assert splits.dtype == torch.int32
    return splits.tolist()


def test_choose_num_kv_splits_fills_the_h200_in_whole_waves():
    # 8 KV heads x batch programs per split, 132 SMs x 5 resident programs, 64-row tiles.
    assert _gpu_splits(1, 8192) == [8]  # 64 programs: every split allowed helps
    assert _gpu_splits(32, 2048) == [2] * 32  # 512 programs, one wave of 16 tiles
    assert _gpu_splits(32, 8192) == [5] * 32  # 1280 programs, two waves of 26 tiles
    assert _gpu_splits(128, 2048) == [3] * 128  # 3072 programs, five waves of 11 tiles


def test_choose_num_kv_splits_gives_a_split_per_256_tokens_at_most():
    assert _gpu_splits(1, 256) == [1]
    assert _gpu_splits(1, 600) == [3]
    assert _gpu_splits(32, 256) == [1] * 32


def test_choose_num_kv_splits_follows_the_config_resident_programs():
    # Fewer resident programs per SM mean fewer slots per wave, so fewer splits pay off.
    one_per_sm = DecodeConfig(16, 64, 64, 4, 3, 1)
    assert _gpu_splits(32, 2048, one_per_sm) == [1] * 32
    assert _gpu_splits(32, 2048) == [2] * 32


def test_choose_num_kv_splits_takes_each_request_length_and_the_device_default():
    seq_lens = torch.tensor([100, 600, 5000])
    mixed = choose_num_kv_splits(
        seq_lens=seq_lens, num_q_heads=8, num_kv_heads=2, max_kv_splits=8, num_sms=132,
        config=GPU_RULE,
    )  # fmt: skip
    assert mixed.tolist() == [1, 3, 8]
    on_cpu = choose_num_kv_splits(
        seq_lens=seq_lens, num_q_heads=8, num_kv_heads=2, max_kv_splits=8, num_sms=1
    )
    # The interpreter's config: 8-row tiles, one resident program on one "SM".
    assert on_cpu.tolist() == [1, 1, 1]
