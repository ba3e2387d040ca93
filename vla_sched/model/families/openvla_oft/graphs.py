"""The OpenVLA-OFT pass (decoder and L1 head) on persistent buffers, optionally CUDA graphs.

An eager OFT pass of openvla-7b is bound by host time (hundreds of kernel launches across the
decoder's layers), as an eager prefill is. Here a batch runs as padded passes of whole
requests at the prepared sizes of ``oft_passes`` (see ``graph_runner``): the embeddings
(image features, the projected state and the zeroed action slots already in place),
positions, KV slots, each request's attention span and the rows the head reads go into
persistent buffers, and one prepared size is one fixed sequence of kernels: the decoder over
every token, then the head on ``num_requests`` fixed rows per request.

Request rows of a size of ``k`` requests, for a pass of ``n`` real requests and ``T`` real
tokens at ``S`` prepared tokens::

    row        tokens          span           head rows
    0 .. n-1   its sequence    [0, seq_len)   start + head_offset + (0 .. A*K-1)
    n .. k-1   none            [0, 0)         0 .. A*K-1 (read, then dropped)
    k          T .. S-1        [0, S - T)     none (the padding request)

Every request is computed from position 0 with no cached prefix, so no slot table is read
(the metadata points at one because the kernels take one). Padding tokens sit at position 0
and write their K/V, which nothing reads, into a few reserved slots past the engine's, in
turn; a span that covers only the padding request keeps it from every real request, and an
unused row extends by nothing (the attention kernels skip it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from vla_sched.model.families.openvla_oft.model import OFTModel
from vla_sched.model.families.openvla_oft.passes import (
    OFTPass,
    OFTPassSizes,
    PassSize,
    oft_fixed_len,
    plan_passes,
)
from vla_sched.model.layers.attention import AttentionMetadata, extend_positions
from vla_sched.model.layers.decoder import KVCache
from vla_sched.model.layers.rope import RopeTables
from vla_sched.model.layers.transfer import to_device
from vla_sched.model.runner.graph_runner import GraphRunner
from vla_sched.model.runner.padded_paths import captured_or_eager, vision_graphs_for
from vla_sched.model.runner.padding_stats import PaddingCounter
from vla_sched.model.runner.vision_graphs import VisionGraphs

# Reserved KV slots the padding tokens write in turn (their K/V is never read).
NUM_OFT_PADDING_SLOTS = 64
# Rows of the per-request buffer: pool row, prefix length (always 0), extend length,
# first token row, sequence length.
_ROW, _PREFIX, _EXTEND, _START, _SEQ = range(5)


class OFTGraphs(GraphRunner):
    """Padded OFT passes (decoder and head) for fixed sizes of requests and tokens.

    Args:
        model: The OFT model.
        kv_caches: The runner's per-layer caches, with ``NUM_OFT_PADDING_SLOTS`` reserved
            slots from ``first_pad_slot``.
        req_to_token: The runner's persistent slot table (never read: see the module).
        rope: Rotary tables for positions ``0 .. max_context_len - 1``.
        sizes: Prepared sizes, ascending in requests and tokens (``OFTPassSizes.pass_sizes``).
        first_pad_slot: First reserved KV slot of the padding tokens.
        capture: Capture CUDA graphs (needs a CUDA device and the Triton kernels).
        backend: Kernel backend when not capturing.
        padding: Where the passes' real and padding tokens are counted.
    """

    def __init__(
        self,
        model: OFTModel,
        kv_caches: list[KVCache],
        req_to_token: torch.Tensor,
        *,
        rope: RopeTables,
        sizes: Sequence[PassSize],
        first_pad_slot: int,
        capture: bool,
        backend: str = 'auto',
        padding: PaddingCounter | None = None,
    ) -> None:
        super().__init__(
            sizes=[size.num_tokens for size in sizes],
            device=model.device,
            capture=capture,
            name='OFT pass',
            sizes_name='token counts',
            padding=padding,
        )
        self.pass_sizes = tuple(sorted(sizes, key=lambda size: size.num_tokens))
        self._requests_at = {size.num_tokens: size.num_requests for size in self.pass_sizes}
        if len(self._requests_at) != len(self.pass_sizes) or list(self.pass_sizes) != sorted(
            self.pass_sizes, key=lambda size: size.num_requests
        ):
            raise ValueError(f'sizes must grow in requests and tokens together, got {sizes}')
        self.decoder = model.vla.decoder
        self.head = model.action_head
        self.kv_caches = kv_caches
        self.req_to_token = req_to_token
        self.rope = rope
        self.backend = 'triton' if capture else backend
        device, n = model.device, self.max_size
        max_requests = self.pass_sizes[-1].num_requests
        index = {'dtype': torch.int64, 'device': device}
        self.num_head_rows = model.spec.settings.num_action_tokens
        self.embeds = torch.zeros(
            (n, self.decoder.spec.hidden_size), dtype=self.decoder.dtype, device=device
        )
        self.positions = torch.zeros(n, **index)
        self.pad_slots = torch.arange(n, **index) % NUM_OFT_PADDING_SLOTS + first_pad_slot
        self.out_cache_loc = self.pad_slots.clone()
        self.per_request = torch.zeros((5, max_requests + 1), **index)
        self.spans = torch.zeros((max_requests + 1, 2), **index)
        self.head_rows = torch.zeros((max_requests, self.num_head_rows), **index)
        if capture:
            self.capture_all()

    def plan(self, seq_lens: Sequence[int]) -> list[OFTPass]:
        """The passes of a batch of whole sequences (``oft_passes.plan_passes``)."""
        return plan_passes(seq_lens, self.pass_sizes)

    def run_pass(
        self,
        p: OFTPass,
        *,
        embeds: torch.Tensor,
        seq_lens: Sequence[int],
        out_cache_loc: torch.Tensor,
        req_pool_indices: torch.Tensor,
        head_offsets: Sequence[int],
    ) -> torch.Tensor:
        """Pass ``p`` (a prepared size) of a batch: its requests' head output
        ``[p.num_requests, chunk_len, action_dim]`` (a new tensor).

        Args:
            p: One of the batch's passes (:meth:`plan`).
            embeds: The batch's input embeddings ``[T, hidden]``, request after request
                (on the device).
            seq_lens: Each request's sequence length (all new tokens, from position 0).
            out_cache_loc: int64 ``[T]`` KV slots of the batch's tokens (host).
            req_pool_indices: int64 ``[B]`` slot-table rows of the requests (host).
            head_offsets: Per request, the first position the head reads
                (``OFTSequence.head_offset``).
        """
        assert p.size is not None  # a request too long for every size runs eagerly
        size, k = p.size.num_tokens, p.size.num_requests
        n, num_tokens = p.num_requests, p.num_tokens
        requests, tokens = p.requests, p.tokens
        lens = torch.tensor(seq_lens[requests], dtype=torch.int64)
        positions, starts = extend_positions(torch.zeros_like(lens), lens, num_tokens=num_tokens)
        self.embeds[:num_tokens].copy_(embeds[tokens])
        self.embeds[num_tokens:size].zero_()
        self.positions[:num_tokens].copy_(to_device(positions, self.device))
        self.positions[num_tokens:size].zero_()
        self.out_cache_loc[:num_tokens].copy_(to_device(out_cache_loc[tokens], self.device))
        self.out_cache_loc[num_tokens:size].copy_(self.pad_slots[: size - num_tokens])
        # Host staging: the per-request rows, spans and head rows of rows 0 .. k (table above).
        per_request = torch.zeros((5, k + 1), dtype=torch.int64)
        per_request[_ROW, :n] = req_pool_indices[requests]
        per_request[_EXTEND, :n] = lens
        per_request[_EXTEND, k] = size - num_tokens
        per_request[_START, :n] = starts
        per_request[_START, n:] = num_tokens
        per_request[_SEQ] = per_request[_EXTEND]
        spans = torch.zeros((k + 1, 2), dtype=torch.int64)
        spans[:, 1] = per_request[_EXTEND]
        offsets = torch.tensor(head_offsets[requests], dtype=torch.int64)
        head_rows = torch.arange(self.num_head_rows, dtype=torch.int64).repeat(k, 1)
        head_rows[:n] += (starts + offsets)[:, None]
        self.per_request[:, : k + 1].copy_(to_device(per_request, self.device))
        self.spans[: k + 1].copy_(to_device(spans, self.device))
        self.head_rows[:k].copy_(to_device(head_rows, self.device))
        # A replay's output is a buffer the next replay overwrites.
        return self.run_padded(size, num_real=num_tokens)[:n].clone()

    def _forward(self, size: int) -> torch.Tensor:
        num_requests = self._requests_at[size]
        rows = self.per_request[:, : num_requests + 1]
        positions = self.positions[:size]
        meta = AttentionMetadata(
            is_decode=False,
            positions=positions,
            out_cache_loc=self.out_cache_loc[:size],
            req_to_token=self.req_to_token,
            req_pool_indices=rows[_ROW],
            seq_lens=rows[_SEQ],
            prefix_lens=rows[_PREFIX],
            extend_lens=rows[_EXTEND],
            extend_start_loc=rows[_START],
            max_extend_len=size,
            image_spans=self.spans[: num_requests + 1],
            backend=self.backend,
            check_values=False,  # the real slots were checked; the padding's are reserved
        )
        hidden = self.decoder(
            self.embeds[:size], meta, self.kv_caches, rope=self.rope.at(positions)
        )
        return self.head(hidden[self.head_rows[:num_requests]])


def build_oft_paths(
    model: OFTModel,
    kv_caches: list[KVCache],
    req_to_token: torch.Tensor,
    *,
    rope: RopeTables,
    pass_sizes: OFTPassSizes,
    first_pad_slot: int,
    cuda_graphs: bool,
    backend: str,
    counters: Mapping[str, PaddingCounter],
) -> tuple[OFTGraphs | None, VisionGraphs | None]:
    """The padded OFT pass and the vision encoder's padded path, captured with
    ``cuda_graphs`` (None for a path that cannot be: it runs eagerly). Arguments as
    ``OFTGraphs``; ``counters`` holds the ``'oft'`` and ``'vision'`` counters."""
    sizes = pass_sizes.pass_sizes(oft_fixed_len(model.spec))

    def build(capture: bool) -> OFTGraphs:
        return OFTGraphs(
            model,
            kv_caches,
            req_to_token,
            rope=rope,
            sizes=sizes,
            first_pad_slot=first_pad_slot,
            capture=capture,
            backend=backend,
            padding=counters['oft'],
        )

    oft = captured_or_eager(cuda_graphs, build, 'OFT pass')
    vision = vision_graphs_for(
        model.vla,
        batch_sizes=pass_sizes.vision_batch_sizes,
        cuda_graphs=cuda_graphs,
        padding=counters['vision'],
    )
    return oft, vision
