"""The resident-program count the decode split rule plans with comes from the build: its
registers, shared memory and warps against the device's limits."""

from __future__ import annotations

import pytest
import torch

from vla_sched.kernels.attention_configs import decode_config
from vla_sched.kernels.decode_attention import (
    choose_num_kv_splits,
    config_for_build,
    device_decode_config,
)
from vla_sched.kernels.residency import (
    SM90,
    KernelBuild,
    launched_builds,
    record_launch,
    resident_programs,
)


def _build(registers: int, shared_bytes: int = 39424, num_warps: int = 4) -> KernelBuild:
    return KernelBuild(
        registers=registers, spills=0, shared_bytes=shared_bytes, num_warps=num_warps
    )


@pytest.mark.parametrize(
    ('registers', 'expected'),
    [(80, 5), (87, 5), (112, 4), (121, 4), (164, 3), (210, 2)],
)
def test_resident_programs_follow_the_registers_of_the_build(registers, expected):
    # Decode stage 1 at 4 warps and ~39 KB of shared memory, as Triton 3.8 and 3.6 build it.
    assert resident_programs(_build(registers), SM90) == expected


def test_resident_programs_are_bounded_by_shared_memory_threads_and_slots():
    assert resident_programs(_build(32, shared_bytes=131072), SM90) == 1
    assert resident_programs(_build(16, shared_bytes=0, num_warps=4), SM90) == 16  # threads
    assert resident_programs(_build(16, shared_bytes=0, num_warps=1), SM90) == 32  # slots
    assert resident_programs(_build(255, shared_bytes=0, num_warps=8), SM90) == 1  # at least 1


def test_split_rule_plans_fewer_splits_when_the_build_fits_fewer_programs():
    claimed = decode_config(head_dim=128, group=4, itemsize=2, on_gpu=True)
    as_built = config_for_build(claimed, _build(121), SM90)
    assert (claimed.programs_per_sm, as_built.programs_per_sm) == (5, 4)

    def splits(config, seq_len):
        return choose_num_kv_splits(
            seq_lens=torch.full((32,), seq_len), num_q_heads=32, num_kv_heads=8, max_kv_splits=8,
            num_sms=132, config=config,
        ).tolist()  # fmt: skip

    # 32 x 8192 tokens, 256 programs per split: 660 slots a wave take 5 splits in 2 waves,
    # 528 slots only 2 splits in one wave.
    assert splits(claimed, 8192) == [5] * 32
    assert splits(as_built, 8192) == [2] * 32


def test_nothing_is_recorded_for_launches_off_a_gpu():
    before = launched_builds()
    record_launch('decode_stage1', {'HEAD_DIM': 128}, None, torch.device('cpu'))
    assert launched_builds() == before


def test_a_build_that_cannot_be_read_plans_with_the_fallback_and_says_so():
    # No CUDA device here: compiling the variant fails, and the split rule keeps the table's
    # number with a warning rather than stopping decode.
    config = decode_config(head_dim=128, group=1, itemsize=2, on_gpu=True)
    with pytest.warns(RuntimeWarning, match='planning with the fallback of 5 programs'):
        resolved = device_decode_config(
            config, dtype=torch.bfloat16, num_q_heads=32, num_kv_heads=32, head_dim=128,
            v_head_dim=128, max_kv_splits=8, device=torch.device('cuda', 0),
        )  # fmt: skip
    assert resolved == config
