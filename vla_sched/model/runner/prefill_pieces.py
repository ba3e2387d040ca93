"""How a prefill too large for one padded pass is cut into pieces that each fit one.

The padded prefill path prepares token counts up to ``max_tokens`` for at most
``max_requests`` requests. A larger pass (16 OpenVLA robots are about 4,480 tokens; a mixed
pass may hold more requests) runs as pieces back to back, each at a prepared size. The
pieces take the batch's tokens in order, as full as the limits allow, so only the last one
is padded; a request whose tokens do not fit the rest of a piece is cut there, and its
later tokens run in the next piece on top of a longer prefix (as a chunked prefill would:
the earlier tokens' KV is in the cache by then). No token attends to a token of another
request, so the cut changes nothing but float rounding.

Index ranges (request ``i`` with ``prefix_lens[i] = p`` and ``extend_lens[i] = e``, cut
after ``a`` of its new tokens)::

    piece k:     rows ..., i   prefix p       extend a
    piece k + 1: rows i, ...   prefix p + a   extend e - a
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefillPiece:
    """One padded pass of a prefill: tokens ``token_start:token_end`` of the batch, from
    the requests at batch indices ``rows`` with the prefixes and new-token counts of this
    piece (requests that extend by nothing are in no piece)."""

    token_start: int
    token_end: int
    rows: tuple[int, ...]
    prefix_lens: tuple[int, ...]
    extend_lens: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return self.token_end - self.token_start


def split_prefill(
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    *,
    max_tokens: int,
    max_requests: int,
) -> list[PrefillPiece]:
    """The pieces of a prefill, in batch order, each of at most ``max_tokens`` tokens and
    ``max_requests`` requests; every piece but the last is full in tokens or requests.

    Raises:
        ValueError: for limits below 1 or lengths that do not pair up.
    """
    if max_tokens < 1 or max_requests < 1:
        raise ValueError(f'limits must be >= 1, got {max_tokens} tokens, {max_requests} requests')
    if len(prefix_lens) != len(extend_lens):
        raise ValueError(f'{len(prefix_lens)} prefix lengths for {len(extend_lens)} requests')
    pieces: list[PrefillPiece] = []
    parts: list[tuple[int, int, int]] = []  # (row, prefix_len, extend_len) of the open piece
    token_start = num_tokens = 0
    for i, (prefix_len, extend_len) in enumerate(zip(prefix_lens, extend_lens, strict=True)):
        done = 0
        while done < extend_len:
            if num_tokens == max_tokens or len(parts) == max_requests:
                pieces.append(_piece(token_start, parts))
                token_start, num_tokens, parts = token_start + num_tokens, 0, []
            take = min(extend_len - done, max_tokens - num_tokens)
            parts.append((i, prefix_len + done, take))
            num_tokens += take
            done += take
    if parts:
        pieces.append(_piece(token_start, parts))
    return pieces


def _piece(token_start: int, parts: Sequence[tuple[int, int, int]]) -> PrefillPiece:
    rows, prefix_lens, extend_lens = zip(*parts, strict=True)
    return PrefillPiece(
        token_start=token_start,
        token_end=token_start + sum(extend_lens),
        rows=rows,
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
    )
