"""SmolVLA's prefix pass and denoising pass on persistent buffers at prepared sizes, replayed
as CUDA graphs (``model/runner/graph_runner.py``; the sizes in ``passes.py``), as pi0's are
(``pi0/graphs.py``).

A denoising pass of ``B`` rows runs at the smallest prepared row count ``>= B`` on buffers
that hold each row's noisy actions ``x``, its time ``t``, its prefix length, its first scratch
slot and its slot table (a fixed width: the engine's context plus the chunk; the row's
prefix slots, then its actions' scratch slots). One prepared size is one fixed sequence of
kernels: the action tokens, the expert's joint layers over each row's prefix K/V and its
actions (causal), its cross layers over the row's prefix slots in the cross caches (queries
at positions ``0 ..``), the velocity and the Euler step ``x + dt * v``. Positions, slots and
lengths are computed inside from the prefix lengths and first slots. Padding rows have no
prefix, ``x`` zero at ``t`` 1, write their actions' K/V into ``chunk`` reserved slots they
share (every padding row computes the same values) and read one reserved slot in the cross
caches (a cross read needs a key); their rows are dropped. More rows than the largest size
run as passes of the largest size and the rest.

The prefix runs as pi0's does: whole requests at prepared token counts, each request's
span its prefix but the state token (images and language both ways, the state causal at
the end), unused request rows extending by nothing, the padding tokens one more request at
position 0 writing their K/V in turn into ``NUM_PREFIX_PADDING_SLOTS`` reserved slots. The
embeddings (each camera's scaled features, the scaled language embeddings, the state token)
are built eagerly and copied in; the graph holds the text layers, whose K/V stay in the
paged cache, and the cross layers' projections of that K/V into the cross caches at the
same slots. The cross caches span every slot of the paged cache, the reserved ones too.

The tower (transformers' SmolVLM vision transformer, the pixel shuffle, the connector and
the scale, ``SmolVLAImageFeatures``) runs through ``VisionGraphs`` at prepared image counts.

Rows with real-time-chunking guidance need a vector-Jacobian product through the expert
(autograd), which a captured graph does not hold: they run on the plain eager pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vla_sched.model.families.openvla_oft.passes import OFTPass, PassSize, plan_passes
from vla_sched.model.families.smolvla.model import CrossReads, SmolVLAModel
from vla_sched.model.layers.attention import AttentionMetadata, extend_positions
from vla_sched.model.layers.decoder import KVCache
from vla_sched.model.layers.transfer import to_device
from vla_sched.model.runner.graph_runner import GraphRunner
from vla_sched.model.runner.padding_stats import PaddingCounter

# Reserved KV slots the prefix's padding tokens write in turn (their K/V is never read).
NUM_PREFIX_PADDING_SLOTS = 64
# What each path counts (``SmolVLARunner.padding_stats``).
SMOLVLA_PATH_UNITS = {'prefix': 'tokens', 'denoise': 'rows', 'vision': 'images'}
# Rows of the prefix pass's per-request buffer: prefix length (always 0), extend length,
# first token row, sequence length.
_PREFIX, _EXTEND, _START, _SEQ = range(4)


class SmolVLADenoiseGraphs(GraphRunner):
    """Padded denoising passes (one Euler step of every row) for fixed row counts.

    Args:
        model: The SmolVLA model.
        kv_caches: The runner's per-layer caches, with ``chunk_size`` reserved slots from
            ``pad_slot``.
        cross_caches: The cross layers' projected prefix K/V (``pad_slot`` within them).
        batch_sizes: Prepared row counts.
        chunk_size: Actions per chunk.
        num_steps: Denoising passes per chunk (``dt = -1 / num_steps``).
        table_width: Columns of the rows' slot tables (the longest prefix plus the chunk).
        pad_slot: First of the reserved slots the padding rows' actions write.
        capture: Capture CUDA graphs (needs a CUDA device and the Triton kernels).
        backend: Kernel backend when not capturing.
        padding: Where the passes' real and padding rows are counted.
    """

    def __init__(
        self,
        model: SmolVLAModel,
        kv_caches: list[KVCache],
        cross_caches: dict[int, KVCache],
        *,
        batch_sizes: Sequence[int],
        chunk_size: int,
        num_steps: int,
        table_width: int,
        pad_slot: int,
        capture: bool,
        backend: str = 'auto',
        padding: PaddingCounter | None = None,
    ) -> None:
        super().__init__(
            sizes=batch_sizes,
            device=model.device,
            capture=capture,
            name='SmolVLA denoising pass',
            sizes_name='row counts',
            padding=padding,
        )
        self.model = model
        self.kv_caches = kv_caches
        self.cross_caches = cross_caches
        self.backend = 'triton' if capture else backend
        self.dt = -1.0 / num_steps
        self.chunk_size = chunk_size
        self.table_width = table_width
        device, n, s = model.device, self.max_size, chunk_size
        index = {'dtype': torch.int64, 'device': device}
        f32 = {'dtype': torch.float32, 'device': device}
        self.x = torch.zeros((n, chunk_size, model.max_action_dim), **f32)
        self.t = torch.ones(n, **f32)
        self.per_row = torch.zeros((2, n), **index)  # prefix length, first scratch slot
        self.per_row[1] = pad_slot
        self.tables = torch.zeros((n, table_width), dtype=torch.int32, device=device)
        self.pad_table = torch.zeros(table_width, dtype=torch.int32)
        self.pad_table[:s] = torch.arange(pad_slot, pad_slot + s, dtype=torch.int32)
        self.tables.copy_(self.pad_table.expand(n, -1))
        self.pad_slot = pad_slot
        self._offsets = torch.arange(s, **index)
        self._rows = torch.arange(n, **index)
        self._token_rows = self._rows.repeat_interleave(s)  # each action token's row
        self._extend = torch.full((n,), s, **index)
        self._starts = self._rows * s
        if capture:
            self.capture_all()

    def run(
        self,
        *,
        x: torch.Tensor,
        t: torch.Tensor,
        tables: torch.Tensor,
        prefix_lens: Sequence[int],
        first_slots: Sequence[int],
    ) -> torch.Tensor:
        """One Euler step of ``B`` rows: their new ``x`` ``[B, chunk, max_action_dim]``
        (float32, on the device, a new tensor).

        Args:
            x: ``[B, chunk, max_action_dim]`` the rows' noisy actions (on the device).
            t: ``[B]`` float32 their times (host).
            tables: int32 ``[B, table_width]`` each row's prefix slots then its actions'
                scratch slots (host).
            prefix_lens: Each row's prefix length.
            first_slots: Each row's first scratch slot (its actions' slots follow).
        """
        num_rows = int(x.shape[0])
        pieces = [
            self._run_piece(x, t, tables, prefix_lens, first_slots, rows)
            for rows in (
                slice(start, min(start + self.max_size, num_rows))
                for start in range(0, num_rows, self.max_size)
            )
        ]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def _run_piece(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        tables: torch.Tensor,
        prefix_lens: Sequence[int],
        first_slots: Sequence[int],
        rows: slice,
    ) -> torch.Tensor:
        num_rows = rows.stop - rows.start
        size = self.padded_size(num_rows)
        assert size is not None  # at most max_size rows
        device = self.device
        per_row = torch.tensor(
            [list(prefix_lens[rows]), list(first_slots[rows])], dtype=torch.int64
        )
        self.x[:num_rows].copy_(x[rows])
        self.x[num_rows:size].zero_()
        self.t[:num_rows].copy_(to_device(t[rows], device))
        self.t[num_rows:size].fill_(1.0)
        self.per_row[:, :num_rows].copy_(to_device(per_row, device))
        self.per_row[0, num_rows:size].zero_()
        self.per_row[1, num_rows:size].fill_(self.pad_slot)
        self.tables[:num_rows].copy_(to_device(tables[rows], device))
        self.tables[num_rows:size].copy_(self.pad_table.expand(size - num_rows, -1))
        # A replay's output is a buffer the next replay overwrites.
        return self.run_padded(size, num_real=num_rows)[:num_rows].clone()

    def _forward(self, size: int) -> torch.Tensor:
        s = self.chunk_size
        prefix, first = self.per_row[0, :size], self.per_row[1, :size]
        meta = AttentionMetadata(
            is_decode=False,
            positions=(prefix[:, None] + self._offsets).reshape(-1),
            out_cache_loc=(first[:, None] + self._offsets).reshape(-1),
            req_to_token=self.tables,
            req_pool_indices=self._rows[:size],
            seq_lens=prefix + s,
            prefix_lens=prefix,
            extend_lens=self._extend[:size],
            extend_start_loc=self._starts[:size],
            max_extend_len=s,
            backend=self.backend,
            check_values=False,  # the real slots are the request's; the padding's reserved
        )
        # A padding row reads its first table column (a reserved slot) in the cross caches.
        cross_lens = prefix.clamp(min=1)[:, None].expand(size, s).reshape(-1)
        reads = CrossReads(
            req_to_token=self.tables,
            rows=self._token_rows[: size * s],
            prefix_lens=cross_lens,
            backend=self.backend,
        )
        x = self.x[:size]
        v = self.model.velocity(
            x_t=x, t=self.t[:size], meta=meta, reads=reads, kv_caches=self.kv_caches,
            cross_caches=self.cross_caches,
        )  # fmt: skip
        return x + self.dt * v


class SmolVLAPrefixGraphs(GraphRunner):
    """Padded prefix passes (the text layers over whole prefixes, their K/V into the paged
    cache and the cross layers' projections into the cross caches) for fixed sizes of
    requests and tokens.

    Args:
        model: The SmolVLA model.
        kv_caches: The runner's per-layer caches, with ``NUM_PREFIX_PADDING_SLOTS`` reserved
            slots from ``first_pad_slot``.
        cross_caches: The cross layers' caches (the reserved slots within them).
        sizes: Prepared sizes, ascending in requests and tokens (``Pi0PassSizes``).
        first_pad_slot: First reserved KV slot of the padding tokens.
        capture: Capture CUDA graphs (needs a CUDA device and the Triton kernels).
        backend: Kernel backend when not capturing.
        padding: Where the passes' real and padding tokens are counted.
    """

    def __init__(
        self,
        model: SmolVLAModel,
        kv_caches: list[KVCache],
        cross_caches: dict[int, KVCache],
        *,
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
            name='SmolVLA prefix pass',
            sizes_name='token counts',
            padding=padding,
        )
        self.pass_sizes = tuple(sorted(sizes, key=lambda size: size.num_tokens))
        self._requests_at = {size.num_tokens: size.num_requests for size in self.pass_sizes}
        if len(self._requests_at) != len(self.pass_sizes) or list(self.pass_sizes) != sorted(
            self.pass_sizes, key=lambda size: size.num_requests
        ):
            raise ValueError(f'sizes must grow in requests and tokens together, got {sizes}')
        self.model = model
        self.kv_caches = kv_caches
        self.cross_caches = cross_caches
        self.backend = 'triton' if capture else backend
        device, n = model.device, self.max_size
        index = {'dtype': torch.int64, 'device': device}
        max_requests = self.pass_sizes[-1].num_requests
        self.embeds = torch.zeros((n, model.sizes.text.width), dtype=model.dtype, device=device)
        self.positions = torch.zeros(n, **index)
        self.pad_slots = torch.arange(n, **index) % NUM_PREFIX_PADDING_SLOTS + first_pad_slot
        self.out_cache_loc = self.pad_slots.clone()
        self.per_request = torch.zeros((4, max_requests + 1), **index)
        self.spans = torch.zeros((max_requests + 1, 2), **index)
        self._rows = torch.arange(max_requests + 1, **index)
        # Never read (every request starts at position 0); the kernels take a table.
        self._table = torch.zeros((max_requests + 1, 1), dtype=torch.int32, device=device)
        if capture:
            self.capture_all()

    def plan(self, seq_lens: Sequence[int]) -> list[OFTPass]:
        """The passes of a batch of whole prefixes (``plan_passes``; a pass without a size
        holds one prefix longer than every size, which runs on the plain eager pass)."""
        return plan_passes(seq_lens, self.pass_sizes)

    def run_pass(
        self, p: OFTPass, *, embeds: torch.Tensor, seq_lens: Sequence[int],
        out_cache_loc: torch.Tensor,
    ) -> None:  # fmt: skip
        """Run pass ``p`` (a prepared size) of a batch: its prefixes' K/V, and the cross
        layers' projections of them, go to their slots.

        Args:
            p: One of the batch's passes (:meth:`plan`).
            embeds: The batch's prefix embeddings ``[T, width]``, request after request, each
                ending in its state token (on the device).
            seq_lens: Each request's prefix length (all new tokens, from position 0).
            out_cache_loc: int64 ``[T]`` KV slots of the batch's tokens (host).
        """
        assert p.size is not None  # a prefix too long for every size runs eagerly
        size, k = p.size.num_tokens, p.size.num_requests
        n, num_tokens = p.num_requests, p.num_tokens
        lens = torch.tensor(seq_lens[p.requests], dtype=torch.int64)
        positions, starts = extend_positions(torch.zeros_like(lens), lens, num_tokens=num_tokens)
        device = self.device
        self.embeds[:num_tokens].copy_(embeds[p.tokens])
        self.embeds[num_tokens:size].zero_()
        self.positions[:num_tokens].copy_(to_device(positions, device))
        self.positions[num_tokens:size].zero_()
        self.out_cache_loc[:num_tokens].copy_(to_device(out_cache_loc[p.tokens], device))
        self.out_cache_loc[num_tokens:size].copy_(self.pad_slots[: size - num_tokens])
        # Rows 0 .. n-1 the prefixes, n .. k-1 unused, k the padding tokens.
        per_request = torch.zeros((4, k + 1), dtype=torch.int64)
        per_request[_EXTEND, :n] = lens
        per_request[_EXTEND, k] = size - num_tokens
        per_request[_START, :n] = starts
        per_request[_START, n:] = num_tokens
        per_request[_SEQ] = per_request[_EXTEND]
        spans = torch.zeros((k + 1, 2), dtype=torch.int64)
        spans[:, 1] = per_request[_EXTEND]
        spans[:n, 1] -= 1  # the state token (each prefix's last) attends causally
        self.per_request[:, : k + 1].copy_(to_device(per_request, device))
        self.spans[: k + 1].copy_(to_device(spans, device))
        self.run_padded(size, num_real=num_tokens)

    def _forward(self, size: int) -> torch.Tensor:
        num_requests = self._requests_at[size]
        rows = self.per_request[:, : num_requests + 1]
        meta = AttentionMetadata(
            is_decode=False,
            positions=self.positions[:size],
            out_cache_loc=self.out_cache_loc[:size],
            req_to_token=self._table,
            req_pool_indices=self._rows[: num_requests + 1],
            seq_lens=rows[_SEQ],
            prefix_lens=rows[_PREFIX],
            extend_lens=rows[_EXTEND],
            extend_start_loc=rows[_START],
            max_extend_len=size,
            image_spans=self.spans[: num_requests + 1],
            backend=self.backend,
            check_values=False,  # the real slots were the scheduler's; the padding's reserved
        )
        self.model.run_prefix(self.embeds[:size], meta, self.kv_caches)
        self.model.store_cross_kv(self.out_cache_loc[:size], self.kv_caches, self.cross_caches)
        return self.positions[:size]  # nothing is read back: the caches are the output


class SmolVLAImageFeatures(nn.Module):
    """The tower, the pixel shuffle, the connector and the scale as one module
    (``VisionGraphs`` captures it): ``[N, 3, S, S]`` pixels in [-1, 1] -> ``[N, tokens, text
    width]`` in the model dtype."""

    def __init__(self, model: SmolVLAModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model.image_features(pixels)
