"""Cutting a prefill into pieces that each fit the padded prefill path."""

from __future__ import annotations

import pytest

from vla_sched.model.runner.prefill_pieces import PrefillPiece, split_prefill


def _check_cover(pieces, prefix_lens, extend_lens) -> None:
    """The pieces take every new token once, in batch order, each part on top of the
    request's tokens before it."""
    seen = [0] * len(extend_lens)
    token = 0
    for piece in pieces:
        assert piece.token_start == token
        for row, prefix_len, extend_len in zip(
            piece.rows, piece.prefix_lens, piece.extend_lens, strict=True
        ):
            assert prefix_len == prefix_lens[row] + seen[row] and extend_len > 0
            seen[row] += extend_len
        token = piece.token_end
    assert seen == list(extend_lens)


def test_a_prefill_that_fits_is_one_piece_of_every_request():
    pieces = split_prefill([0, 10, 4], [30, 1, 5], max_tokens=64, max_requests=4)
    assert pieces == [PrefillPiece(0, 36, (0, 1, 2), (0, 10, 4), (30, 1, 5))]


def test_pieces_are_full_in_tokens_and_cut_requests_continue_on_a_longer_prefix():
    prefix_lens, extend_lens = [0, 0, 7], [280, 280, 100]
    pieces = split_prefill(prefix_lens, extend_lens, max_tokens=256, max_requests=16)
    assert [p.num_tokens for p in pieces] == [256, 256, 148]
    assert pieces[0].rows == (0,)
    assert (pieces[1].rows, pieces[1].prefix_lens, pieces[1].extend_lens) == (
        (0, 1),
        (256, 0),
        (24, 232),
    )
    assert (pieces[2].rows, pieces[2].prefix_lens) == ((1, 2), (232, 7))
    _check_cover(pieces, prefix_lens, extend_lens)


def test_pieces_are_full_in_requests_when_the_request_cap_binds_first():
    # a mixed pass: one prompt, then five running requests' one-token rows
    prefix_lens, extend_lens = [0, 50, 60, 70, 80, 90], [40, 1, 1, 1, 1, 1]
    pieces = split_prefill(prefix_lens, extend_lens, max_tokens=64, max_requests=2)
    assert [p.rows for p in pieces] == [(0, 1), (2, 3), (4, 5)]
    assert [p.num_tokens for p in pieces] == [41, 2, 2]
    _check_cover(pieces, prefix_lens, extend_lens)


def test_requests_with_no_new_tokens_are_in_no_piece():
    pieces = split_prefill([0, 5, 0], [3, 0, 4], max_tokens=4, max_requests=8)
    assert [p.rows for p in pieces] == [(0, 2), (2,)]
    _check_cover(pieces, [0, 5, 0], [3, 0, 4])


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match='limits must be >= 1'):
        split_prefill([0], [4], max_tokens=0, max_requests=1)
    with pytest.raises(ValueError, match='2 prefix lengths for 1 requests'):
        split_prefill([0, 0], [4], max_tokens=8, max_requests=1)
