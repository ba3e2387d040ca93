"""Radix keys: image spans keyed by content hash, namespaces, alignment."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from vla_sched.core.memory.radix_key import RadixKey, build_key_tokens, fold62, image_key_values

IMAGE_TOKEN = 32000


@dataclass(frozen=True)
class Span:
    content_hash: int
    token_offset: int
    num_tokens: int


def test_text_tokens_keep_their_ids_and_image_tokens_turn_negative() -> None:
    ids = [1, 2, IMAGE_TOKEN, IMAGE_TOKEN, IMAGE_TOKEN, 3]
    key = build_key_tokens(ids, [Span(0xABC, 2, 3)])
    assert key[[0, 1, 5]].tolist() == [1, 2, 3]
    assert bool((key[2:5] < 0).all())
    assert key[2:5].unique().numel() == 3  # index within the image is part of the value


def test_two_images_with_identical_placeholders_differ_at_every_position() -> None:
    ids = [5] + [IMAGE_TOKEN] * 64
    key_a = build_key_tokens(ids, [Span(0x1111, 1, 64)])
    key_b = build_key_tokens(ids, [Span(0x2222, 1, 64)])
    assert key_a[0] == key_b[0]
    assert bool((key_a[1:] != key_b[1:]).all())


def test_same_image_gives_the_same_key() -> None:
    ids = [IMAGE_TOKEN] * 16
    assert torch.equal(
        build_key_tokens(ids, [Span(-42, 0, 16)]), build_key_tokens(ids, [Span(-42, 0, 16)])
    )


def test_first_image_position_is_distinct_for_distinct_62_bit_hashes() -> None:
    hashes = [0, 1, 2, (1 << 62) - 1, 12345678901234]
    firsts = {int(image_key_values(h, 1)[0]) for h in hashes}
    assert len(firsts) == len(hashes)
    assert all(v < 0 for v in firsts)


def test_fold62_is_identity_below_2_pow_62_and_accepts_negative_hashes() -> None:
    assert fold62(123) == 123
    assert 0 <= fold62(-1) < (1 << 62)
    assert 0 <= fold62(1 << 100) < (1 << 62)


def test_negative_token_id_is_rejected_naming_its_position() -> None:
    with pytest.raises(ValueError, match='token id -3 at position 1'):
        build_key_tokens([1, -3, 2])


def test_overlapping_or_outside_image_spans_are_rejected() -> None:
    ids = [IMAGE_TOKEN] * 8
    with pytest.raises(ValueError, match='overlaps'):
        build_key_tokens(ids, [Span(1, 0, 4), Span(2, 3, 4)])
    with pytest.raises(ValueError, match='outside the 8-token prompt'):
        build_key_tokens(ids, [Span(1, 6, 4)])


def test_page_aligned_prefix_and_namespace_aware_starts_with() -> None:
    key = RadixKey(torch.arange(10), extra_key='widowx')
    assert len(key.page_aligned(4)) == 8
    assert key.starts_with(RadixKey(torch.arange(3), extra_key='widowx'))
    assert not key.starts_with(RadixKey(torch.arange(3), extra_key='franka'))
    assert not key.starts_with(RadixKey(torch.tensor([0, 2]), extra_key='widowx'))


def test_key_must_be_a_1d_int64_tensor() -> None:
    with pytest.raises(ValueError, match='1-D int64'):
        RadixKey(torch.arange(4, dtype=torch.int32))


def test_a_tensor_prompt_gives_the_same_key_as_a_list_and_is_not_shared() -> None:
    ids = [1, IMAGE_TOKEN, IMAGE_TOKEN, 3]
    prompt = torch.tensor(ids, dtype=torch.int64)
    key = build_key_tokens(prompt, [Span(0x77, 1, 2)])
    assert key.dtype == torch.int64
    assert torch.equal(key, build_key_tokens(tuple(ids), [Span(0x77, 1, 2)]))
    prompt[0] = 9
    assert key[0] == 1
    assert prompt[1] == IMAGE_TOKEN
