"""Prefill passes on persistent buffers, padded to a few token counts, optionally CUDA graphs.

One robot's OpenVLA step prefills about 280 tokens, a few milliseconds of matrix work on a
large GPU but a few hundred kernel launches across the decoder's layers, so an eager prefill
is bound by host time. Here a prefill of ``T`` new tokens for at most ``max_requests``
requests runs at the smallest prepared token count ``>= T`` (see ``graph_runner``): the
embeddings (image features already in place), positions and slots go into persistent
buffers. The padding tokens form one more request (no prefix, its KV in reserved slots of
its own, in the reserved slot-table row) and unused request rows extend by nothing (the
attention kernel skips them), so every shape is fixed per token count. Padding never
reaches a real request: attention reads only each request's own tokens and its cached
prefix.

A prefill of more tokens or requests than the largest prepared size runs as pieces back to
back (``prefill_pieces``: full pieces of the largest size, then the rest at its padded
size), so no prefill falls back to an eager pass. Pieces of the largest size already run
the matrix products at their compute-bound rate; larger sizes would only grow the graphs'
shared memory pool and the attention grid. A mixed pass (a prefill with one-token rows of
running requests on their cached prefix) is a prefill like any other here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vla_sched.model.layers.attention import AttentionMetadata, extend_positions
from vla_sched.model.layers.decoder import KVCache, PagedDecoder
from vla_sched.model.layers.transfer import to_device
from vla_sched.model.runner.graph_runner import GraphRunner
from vla_sched.model.runner.padding_stats import PaddingCounter
from vla_sched.model.runner.prefill_pieces import PrefillPiece, split_prefill


class PrefillGraphs(GraphRunner):
    """Padded prefill forward passes of the decoder for fixed token counts.

    Args:
        decoder: The decoder.
        kv_caches: The runner's per-layer caches.
        req_to_token: The runner's device slot table; row ``dummy_row`` is reserved.
        token_counts: Padded token counts to prepare.
        max_requests: Most requests in one prefill batch.
        dummy_row: Reserved slot-table row for padding requests.
        first_pad_slot: First of ``max_padding(token_counts)`` reserved KV slots that padding
            tokens write.
        capture: Capture CUDA graphs (needs a CUDA device and the Triton kernels).
        backend: Kernel backend.
        padding: Where the pieces' real and padding tokens are counted.
    """

    def __init__(
        self,
        decoder: PagedDecoder,
        kv_caches: list[KVCache],
        req_to_token: torch.Tensor,
        *,
        token_counts: Sequence[int],
        max_requests: int,
        dummy_row: int,
        first_pad_slot: int,
        capture: bool,
        backend: str = 'auto',
        padding: PaddingCounter | None = None,
    ) -> None:
        super().__init__(
            sizes=token_counts,
            device=decoder.device,
            capture=capture,
            name='prefill',
            sizes_name='token counts',
            padding=padding,
        )
        if max_requests < 1:
            raise ValueError(f'max_requests must be >= 1, got {max_requests}')
        self.decoder = decoder
        self.kv_caches = kv_caches
        self.req_to_token = req_to_token
        self.max_requests = max_requests
        self.dummy_row = dummy_row
        self.backend = 'triton' if capture else backend
        device, n, r = decoder.device, self.max_size, max_requests + 1  # + the padding
        index = {'dtype': torch.int64, 'device': device}
        hidden = decoder.spec.hidden_size
        self.embeds = torch.zeros((n, hidden), dtype=decoder.dtype, device=device)
        self.positions = torch.zeros(n, **index)
        self.pad_slots = torch.arange(max_padding(self.sizes), **index) + first_pad_slot
        self.out_cache_loc = self.pad_slots[torch.arange(n, device=device) % len(self.pad_slots)]
        self.req_pool_indices = torch.full((r,), dummy_row, **index)
        self.prefix_lens = torch.zeros(r, **index)
        self.extend_lens = torch.zeros(r, **index)
        self.extend_start_loc = torch.zeros(r, **index)
        self.seq_lens = torch.zeros(r, **index)
        if capture:
            self.capture_all()

    def padded_size(self, num_tokens: int, num_requests: int = 1) -> int | None:
        """The prepared token count a prefill runs at in one piece, or None if it needs
        several."""
        if num_requests > self.max_requests:
            return None
        return super().padded_size(num_tokens)

    def run(
        self,
        *,
        embeds: torch.Tensor,
        out_cache_loc: torch.Tensor,
        req_pool_indices: torch.Tensor,
        prefix_lens: torch.Tensor,
        extend_lens: torch.Tensor,
    ) -> torch.Tensor:
        """The final-normed hidden ``[T, hidden]`` of a prefill of any size; ``embeds`` on
        the device, the other tensors int64 on the host (``extend_lens`` sums to ``T``).

        A prefill that fits one prepared size returns a view of a buffer the next ``run``
        overwrites; one cut into pieces returns a new tensor.
        """
        pieces = split_prefill(
            prefix_lens.tolist(),
            extend_lens.tolist(),
            max_tokens=self.max_size,
            max_requests=self.max_requests,
        )
        if len(pieces) == 1 and len(pieces[0].rows) == int(extend_lens.shape[0]):
            return self._run_piece(embeds, out_cache_loc, req_pool_indices, pieces[0])
        hidden = None
        for piece in pieces:
            piece_hidden = self._run_piece(embeds, out_cache_loc, req_pool_indices, piece)
            if hidden is None:
                hidden = piece_hidden.new_empty((int(embeds.shape[0]), piece_hidden.shape[1]))
            hidden[piece.token_start : piece.token_end].copy_(piece_hidden)
        if hidden is None:  # no new tokens at all
            return self.embeds[:0]
        return hidden

    def _run_piece(
        self,
        embeds: torch.Tensor,
        out_cache_loc: torch.Tensor,
        req_pool_indices: torch.Tensor,
        piece: PrefillPiece,
    ) -> torch.Tensor:
        """One piece's hidden ``[piece.num_tokens, hidden]``, a view of the padded output."""
        num_tokens, num_reqs = piece.num_tokens, len(piece.rows)
        size = self.padded_size(num_tokens, num_reqs)
        assert size is not None  # split_prefill keeps a piece within the prepared limits
        prefix_lens = torch.tensor(piece.prefix_lens, dtype=torch.int64)
        extend_lens = torch.tensor(piece.extend_lens, dtype=torch.int64)
        tokens = slice(piece.token_start, piece.token_end)
        positions, starts = extend_positions(prefix_lens, extend_lens, num_tokens=num_tokens)
        device = self.embeds.device
        self.embeds[:num_tokens].copy_(embeds[tokens])
        self.embeds[num_tokens:size].zero_()
        self.positions[:num_tokens].copy_(to_device(positions, device))
        self.positions[num_tokens:size].zero_()
        self.out_cache_loc[:num_tokens].copy_(to_device(out_cache_loc[tokens], device))
        self.out_cache_loc[num_tokens:size].copy_(self.pad_slots[: size - num_tokens])
        per_request = (
            (self.req_pool_indices, req_pool_indices[list(piece.rows)], self.dummy_row),
            (self.prefix_lens, prefix_lens, 0),
            (self.extend_lens, extend_lens, 0),
            (self.extend_start_loc, starts, num_tokens),
            (self.seq_lens, prefix_lens + extend_lens, 0),
        )
        for buffer, values, unused in per_request:
            buffer[:num_reqs].copy_(to_device(values.to(torch.int64), device))
            buffer[num_reqs:].fill_(unused)
        self.extend_lens[-1] = size - num_tokens  # the padding request, after the unused rows
        self.seq_lens[-1] = size - num_tokens
        return self.run_padded(size, num_real=num_tokens)[:num_tokens]

    def _forward(self, size: int) -> torch.Tensor:
        meta = AttentionMetadata(
            is_decode=False,
            positions=self.positions[:size],
            out_cache_loc=self.out_cache_loc[:size],
            req_to_token=self.req_to_token,
            req_pool_indices=self.req_pool_indices,
            seq_lens=self.seq_lens,
            prefix_lens=self.prefix_lens,
            extend_lens=self.extend_lens,
            extend_start_loc=self.extend_start_loc,
            max_extend_len=size,
            backend=self.backend,
        )
        return self.decoder(self.embeds[:size], meta, self.kv_caches)


def max_padding(token_counts: Sequence[int]) -> int:
    """Most padding tokens a prefill gets: the widest gap below a prepared count."""
    counts = sorted(set(token_counts))
    return max(high - low - 1 for low, high in zip([0, *counts], counts, strict=False))
