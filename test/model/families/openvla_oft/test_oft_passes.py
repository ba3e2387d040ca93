"""The padded OFT pass's prepared sizes and the cut of a batch into passes (no model)."""

from __future__ import annotations

import pytest

from vla_sched.model.families.openvla_oft.passes import OFTPassSizes, PassSize, plan_passes

LIBERO_FIXED_LEN = 571  # BOS, two cameras of 256 patches, proprio, 8 x 7 action slots, </s>
LIBERO_SIZES = OFTPassSizes().pass_sizes(LIBERO_FIXED_LEN)


def test_libero_sizes_hold_one_to_eight_robots_of_48_prompt_tokens():
    expected = (PassSize(1, 640), PassSize(2, 1280), PassSize(4, 2496), PassSize(8, 4992))
    assert expected == LIBERO_SIZES


def test_robot_counts_that_round_to_one_token_count_keep_the_most_robots():
    sizes = OFTPassSizes(robot_counts=(1, 2, 3), prompt_tokens=4, token_multiple=64)
    assert sizes.pass_sizes(10) == (PassSize(3, 64),)


@pytest.mark.parametrize(
    ('fields', 'message'),
    [
        ({'robot_counts': ()}, 'robot_counts must be positive'),
        ({'robot_counts': (2, 2)}, 'robot_counts must be distinct'),
        ({'prompt_tokens': 0}, 'prompt_tokens must be >= 1'),
        ({'token_multiple': 0}, 'token_multiple must be >= 1'),
        ({'vision_batch_sizes': (0,)}, 'vision_batch_sizes must be positive'),
    ],
)
def test_bad_sizes_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        OFTPassSizes(**fields)


def _shape(seq_lens):
    return [
        (p.first, p.num_requests, p.size and p.size.num_requests)
        for p in plan_passes(seq_lens, LIBERO_SIZES)
    ]


def test_three_robots_run_as_two_and_one_with_fewer_padded_tokens_than_four():
    passes = plan_passes([600] * 3, LIBERO_SIZES)
    assert _shape([600] * 3) == [(0, 2, 2), (2, 1, 1)]
    assert sum(p.size.num_tokens for p in passes) == 1280 + 640 < 2496


def test_thirteen_robots_run_as_eight_four_and_one():
    passes = plan_passes([600] * 13, LIBERO_SIZES)
    assert sorted(p.num_requests for p in passes) == [1, 4, 8]
    assert sum(p.size.num_tokens for p in passes) == 4992 + 2496 + 640


def test_passes_cover_the_batch_in_order_each_within_its_size():
    seq_lens = [600, 590, 700, 580, 1500, 620, 600, 4000, 610]
    passes = plan_passes(seq_lens, LIBERO_SIZES)
    assert [p.first for p in passes] == sorted(p.first for p in passes)
    assert sum(p.num_requests for p in passes) == len(seq_lens)
    for p in passes:
        assert p.num_tokens == sum(seq_lens[p.requests])
        assert p.size.num_requests >= p.num_requests and p.size.num_tokens >= p.num_tokens


def test_a_request_longer_than_every_size_runs_alone_without_a_size():
    seq_lens = [600, 5000, 600]
    assert _shape(seq_lens) == [(0, 1, 1), (1, 1, None), (2, 1, 1)]
    assert plan_passes(seq_lens, LIBERO_SIZES)[1].tokens == slice(600, 5600)
