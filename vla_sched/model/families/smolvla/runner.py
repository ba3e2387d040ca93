"""SmolVLA's flow-matching runner: a ``ForwardBatch`` of SmolVLA rows in, pass markers and
action chunks out (the scheduler's ``BatchRunner``).

A row is a robot's prefix pass or one of its denoising passes (``batch.denoise_passes``: -1,
or the pass index; see ``core/forward_batch.py``):

- prefix rows run the text layers over ``[camera tokens ... | language | state]`` in one
  extend pass (the request's prompt ends in one placeholder the state token replaces, its
  state the request's ``proprio``), images and language attending both ways and the state
  causal at the end; the K/V stay in the paged cache at the row's slots, the cross layers'
  projections of them go to the cross caches at the same slots (kept while the request holds
  its prefix, overwritten by whoever holds the slots next), and the row's denoising state
  starts from its noise;
- denoising rows, of every robot in flight, run together: the joint layers attend over the
  row's prefix (its slots in ``req_to_token``) and the actions causally at positions
  ``P ..``, the actions' K/V in scratch slots past the engine's (overwritten by the next
  pass); the cross layers read the row's prefix slots in the cross caches, queries at
  positions ``0 ..``. Each row moves by one Euler step (``dt = -1 / K``, ``t = 1 + k dt``)
  and its last pass returns the normalized chunk ``[chunk_size, max_action_dim]``.

A row with real-time-chunking guidance (``batch.guidance``) gets its velocity guided towards
its target as pi0's rows do (``model/runner/flow_guidance.py``: one vector-Jacobian product
through the expert per pass, the rows without guidance in the same pass with a zero mask);
the cross caches are only read, so the product flows through the actions alone.

The denoising state lives on the request's row, so passes chain on the device whatever the
host has processed; a retracted request gets a new row and starts over from its prefix.

With ``cuda_graphs`` (or ``pass_sizes`` for the same paths run eagerly, as the CPU tests do)
the prefix and denoising passes run padded at prepared sizes (``graphs.py``, sizes in
``passes.py``: replayed as CUDA graphs on a GPU) and the tower through ``VisionGraphs``;
guided rows stay on the plain eager pass (a backward pass). What each path ran is counted
(``padding_stats``: ``prefix`` in tokens, ``denoise`` in rows, ``vision`` in images).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from vla_sched.core.forward_batch import FlowGuidance, ForwardBatch, ForwardMode, ForwardOutput
from vla_sched.model.families.openvla_oft.passes import OFTPass
from vla_sched.model.families.pi0.passes import Pi0PassSizes
from vla_sched.model.families.pi0.runner import MARKER_TOKEN_ID, _Done
from vla_sched.model.families.smolvla.graphs import (
    NUM_PREFIX_PADDING_SLOTS,
    SMOLVLA_PATH_UNITS,
    SmolVLADenoiseGraphs,
    SmolVLAImageFeatures,
    SmolVLAPrefixGraphs,
)
from vla_sched.model.families.smolvla.model import CrossReads, SmolVLAModel
from vla_sched.model.layers.attention import AttentionMetadata
from vla_sched.model.runner.flow_guidance import guided_rows
from vla_sched.model.runner.padded_paths import captured_or_eager
from vla_sched.model.runner.padding_stats import PaddingCounter, PaddingStats
from vla_sched.model.runner.vision_graphs import VisionGraphs

PixelsOf = Callable[[Sequence[np.ndarray]], torch.Tensor]


class SmolVLARunner:
    """Runs SmolVLA prefix and denoising rows on the paged KV (see the module docstring).

    Args:
        model: the loaded model.
        req_to_token: the engine's slot table ``[num_req_slots, max_context_len]``.
        num_kv_slots: the engine's KV slots; the runner's cache has scratch slots past them
            for one chunk of actions per request row.
        num_steps: denoising passes per chunk (the folder's ``num_steps``).
        chunk_size: actions per chunk.
        pixels_of: a step's camera images (uint8 ``[H, W, 3]``) as the tower's input
            ``[N, 3, S, S]`` in [-1, 1] (the family's processor).
        backend: the attention kernels' backend ('auto': Triton on CUDA, torch elsewhere).
        cuda_graphs: capture the padded prefix and denoising passes and the tower as CUDA
            graphs (a CUDA device and ``pass_sizes``; the passes run the Triton kernels).
        pass_sizes: the padded paths' prepared sizes (``smolvla_pass_sizes``); given without
            ``cuda_graphs``, the same padded passes run eagerly. None: the plain eager passes.

    Raises:
        ValueError: for ``cuda_graphs`` off CUDA or without ``pass_sizes``.
    """

    def __init__(
        self,
        model: SmolVLAModel,
        *,
        req_to_token: torch.Tensor,
        num_kv_slots: int,
        num_steps: int,
        chunk_size: int,
        pixels_of: PixelsOf,
        backend: str = 'auto',
        cuda_graphs: bool = False,
        pass_sizes: Pi0PassSizes | None = None,
    ) -> None:
        if num_steps < 1:
            raise ValueError(f'num_steps must be >= 1, got {num_steps}')
        if cuda_graphs and model.device.type != 'cuda':
            raise ValueError('CUDA graphs need the model on a CUDA device')
        if cuda_graphs and pass_sizes is None:
            raise ValueError('CUDA graphs need the prepared sizes (pass_sizes)')
        self.model = model
        self.device = model.device
        # The engine's table (on the host): a row's slots are read from it at each pass.
        self.engine_table = req_to_token
        self.req_to_token = req_to_token.to(self.device)
        self.num_steps = num_steps
        self.chunk_size = chunk_size
        self.pixels_of = pixels_of
        self.backend = backend
        num_rows = req_to_token.shape[0]
        self.scratch_start = num_kv_slots
        # Past the engine's slots: one chunk per request row, then (padded paths) the padding
        # rows' chunk and the prefix padding's slots, which the cross caches hold too.
        pad_slot = num_kv_slots + num_rows * chunk_size
        num_slots, num_cross_slots = pad_slot, num_kv_slots
        if pass_sizes is not None:
            num_slots += chunk_size + NUM_PREFIX_PADDING_SLOTS
            num_cross_slots = num_slots
        self.kv_caches = model.allocate_kv_cache(num_slots)
        self.cross_caches = model.allocate_cross_cache(num_cross_slots)
        self._x = torch.zeros(
            (num_rows, chunk_size, model.max_action_dim), dtype=torch.float32, device=self.device
        )
        self._padding = {path: PaddingCounter() for path in SMOLVLA_PATH_UNITS}
        self.denoise_graphs: SmolVLADenoiseGraphs | None = None
        self.prefix_graphs: SmolVLAPrefixGraphs | None = None
        self.vision_graphs: VisionGraphs | None = None
        if pass_sizes is not None:
            self._build_padded_paths(pass_sizes, pad_slot=pad_slot, cuda_graphs=cuda_graphs)

    def _build_padded_paths(
        self, sizes: Pi0PassSizes, *, pad_slot: int, cuda_graphs: bool
    ) -> None:
        """The padded paths (each captured with ``cuda_graphs``; one that cannot be runs
        eagerly, with a warning)."""

        def denoise(capture: bool) -> SmolVLADenoiseGraphs:
            return SmolVLADenoiseGraphs(
                self.model,
                self.kv_caches,
                self.cross_caches,
                batch_sizes=sizes.denoise_batch_sizes,
                chunk_size=self.chunk_size,
                num_steps=self.num_steps,
                table_width=self.engine_table.shape[1] + self.chunk_size,
                pad_slot=pad_slot,
                capture=capture,
                backend=self.backend,
                padding=self._padding['denoise'],
            )

        def prefix(capture: bool) -> SmolVLAPrefixGraphs:
            return SmolVLAPrefixGraphs(
                self.model,
                self.kv_caches,
                self.cross_caches,
                sizes=sizes.prefix_sizes(),
                first_pad_slot=pad_slot + self.chunk_size,
                capture=capture,
                backend=self.backend,
                padding=self._padding['prefix'],
            )

        def vision(capture: bool) -> VisionGraphs:
            image = self.model.sizes.vision.image_size
            return VisionGraphs(
                SmolVLAImageFeatures(self.model),
                pixel_shape=(3, image, image),
                batch_sizes=sizes.vision_batch_sizes,
                device=self.device,
                output_dtype=self.model.dtype,
                capture=capture,
                padding=self._padding['vision'],
            )

        self.vision_graphs = captured_or_eager(cuda_graphs, vision, 'SmolVLA tower')
        self.prefix_graphs = captured_or_eager(cuda_graphs, prefix, 'SmolVLA prefix pass')
        self.denoise_graphs = captured_or_eager(cuda_graphs, denoise, 'SmolVLA denoising pass')

    def padding_stats(self) -> dict[str, PaddingStats]:
        """What each path ran since the runner was built: ``'prefix'`` (tokens),
        ``'denoise'`` (rows of denoising passes) and ``'vision'`` (images), as
        ``PaddingStats``; passes on the plain eager path (guided rows among them) count as
        eager runs."""
        return {path: counter.snapshot() for path, counter in self._padding.items()}

    @torch.no_grad()  # not inference mode: a guided pass runs autograd on this pass's tensors
    def launch(self, batch: ForwardBatch) -> _Done:
        batch.check()
        passes = batch.denoise_passes
        if batch.batch_size and (not passes or any(k is None for k in passes)):
            raise ValueError('a flow-matching runner runs flow-matching rows only')
        prefix = [i for i, k in enumerate(passes) if k == -1]
        if prefix:
            if batch.forward_mode is not ForwardMode.EXTEND:
                raise ValueError('a prefix pass is an extend pass')
            self._run_prefix(batch, prefix)
        denoising = [i for i, k in enumerate(passes) if k >= 0]
        num_steps = batch.num_decode_steps if batch.forward_mode is ForwardMode.DECODE else 1
        chunks: list[np.ndarray | None] = [None] * batch.batch_size
        for j in range(num_steps if denoising else 0):
            for i, chunk in self._denoise(batch, denoising, step=j).items():
                chunks[i] = chunk
        markers = (MARKER_TOKEN_ID,) * batch.batch_size
        burst = None
        if num_steps > 1:
            burst = tuple((MARKER_TOKEN_ID,) * num_steps for _ in range(batch.batch_size))
        return _Done(
            ForwardOutput(
                next_token_ids=markers, burst_token_ids=burst, action_chunks=tuple(chunks)
            )
        )

    # ---- the prefix ---------------------------------------------------------------------

    def _run_prefix(self, batch: ForwardBatch, indices: list[int]) -> None:
        model = self.model
        extend = batch.extend_lens.tolist()
        starts = np.concatenate([[0], np.cumsum(extend)]).tolist()
        ids = torch.cat([batch.input_ids[starts[i] : starts[i] + extend[i]] for i in indices])
        slots = torch.cat(
            [batch.out_cache_loc[starts[i] : starts[i] + extend[i]] for i in indices]
        )
        embeds = model.language_embeddings(ids)
        images = [image for i in indices for image in batch.images[i]]
        features = None
        if images:
            features = self._image_features(self.pixels_of([im.pixels for im in images]))
        states = []
        for i in indices:
            state = batch.proprio[i] if batch.proprio else None
            if state is None:
                raise ValueError(f'request {batch.rids[i]!r} has no state for its state token')
            states.append(torch.as_tensor(np.asarray(state, np.float32)))
        state_tokens = model.state_embeddings(torch.stack(states))
        offset, n = 0, 0
        for row, i in enumerate(indices):
            for image in batch.images[i]:
                span = slice(offset + image.token_offset, offset + image.token_end)
                embeds[span] = features[n, : image.num_tokens]
                n += 1
            offset += extend[i]
            embeds[offset - 1] = state_tokens[row]
        lens = [extend[i] for i in indices]
        if self.prefix_graphs is None:
            passes = [OFTPass(0, len(indices), 0, len(ids), size=None)]
        else:
            passes = self.prefix_graphs.plan(lens)
        pool_rows = batch.req_pool_indices[indices]
        for p in passes:
            if p.size is not None:
                self.prefix_graphs.run_pass(p, embeds=embeds, seq_lens=lens, out_cache_loc=slots)
            else:
                self._plain_prefix(
                    embeds[p.tokens], slots[p.tokens], pool_rows[p.requests], lens[p.requests]
                )
        for i in indices:
            noise = batch.noise[i] if batch.noise else None
            if noise is None:
                raise ValueError(f'request {batch.rids[i]!r} starts denoising without noise')
            row = int(batch.req_pool_indices[i])
            self._x[row] = torch.as_tensor(np.asarray(noise, np.float32), device=self.device)

    def _image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.vision_graphs is not None:
            return self.vision_graphs.encode(pixels)
        self._padding['vision'].add_eager(int(pixels.shape[0]))
        return self.model.image_features(pixels)

    def _plain_prefix(
        self, embeds: torch.Tensor, slots: torch.Tensor, pool_rows: torch.Tensor, lens: list[int]
    ) -> None:
        """The prefixes of ``lens`` on the plain eager pass, images and language both ways,
        the state token causal; then the cross layers' projections of their K/V."""
        self._padding['prefix'].add_eager(int(slots.shape[0]))
        lens_t = torch.tensor(lens, dtype=torch.int64)
        meta = AttentionMetadata.build(
            is_decode=False,
            req_to_token=self.req_to_token,
            req_pool_indices=pool_rows,
            prefix_lens=torch.zeros(len(lens), dtype=torch.int64),
            extend_lens=lens_t,
            out_cache_loc=slots,
            device=self.device,
            backend=self.backend,
            image_spans=torch.stack([torch.zeros_like(lens_t), lens_t - 1], dim=1),
        )
        self.model.run_prefix(embeds, meta, self.kv_caches)
        self.model.store_cross_kv(slots, self.kv_caches, self.cross_caches)

    # ---- a denoising pass ---------------------------------------------------------------

    def _denoise(
        self, batch: ForwardBatch, indices: list[int], *, step: int
    ) -> dict[int, np.ndarray]:
        """One Euler step of every denoising row; the chunks of the rows that finished.

        On the padded path the rows without guidance run there; guided rows (and every
        row without the padded path) run on the plain eager pass."""
        passes = [batch.denoise_passes[i] + step for i in indices]
        if any(k >= self.num_steps for k in passes):
            raise ValueError(f'a denoising pass index is past the {self.num_steps} passes')
        pos = batch.prefix_lens.tolist()
        # Pass k's marker sits at position P + k: the prefix is the first P positions.
        prefix_lens = [pos[i] - batch.denoise_passes[i] for i in indices]
        rows = [int(batch.req_pool_indices[i]) for i in indices]
        dt = -1.0 / self.num_steps
        t = torch.tensor([1.0 + k * dt for k in passes], dtype=torch.float32)
        guidance = [batch.guidance[i] for i in indices] if batch.guidance else []
        x = self._x[rows]
        if self.denoise_graphs is None:
            x = self._plain_step(rows, prefix_lens, t, x, guidance)
        else:
            x = self._padded_step(rows, prefix_lens, t, x, guidance)
        self._x[rows] = x
        return {
            i: x[n].cpu().numpy().copy()
            for n, (i, k) in enumerate(zip(indices, passes, strict=True))
            if k == self.num_steps - 1
        }

    def _padded_step(
        self,
        rows: list[int],
        prefix_lens: list[int],
        t: torch.Tensor,
        x: torch.Tensor,
        guidance: list[FlowGuidance | None],
    ) -> torch.Tensor:
        """The rows' new ``x``: those without guidance from the padded pass, the guided
        ones from the plain eager pass."""
        guided = [n for n, g in enumerate(guidance) if g is not None]
        plain = [n for n in range(len(rows)) if not guidance or guidance[n] is None]
        out = torch.empty_like(x)
        if plain:
            plain_rows = [rows[n] for n in plain]
            lens = [prefix_lens[n] for n in plain]
            out[plain] = self.denoise_graphs.run(
                x=x[plain],
                t=t[plain],
                tables=self._suffix_tables(
                    plain_rows, lens, width=self.denoise_graphs.table_width
                ),
                prefix_lens=lens,
                first_slots=[self._first_scratch_slot(row) for row in plain_rows],
            )
        if guided:
            out[guided] = self._plain_step(
                [rows[n] for n in guided],
                [prefix_lens[n] for n in guided],
                t[guided],
                x[guided],
                [guidance[n] for n in guided],
            )
        return out

    def _plain_step(
        self,
        rows: list[int],
        prefix_lens: list[int],
        t: torch.Tensor,
        x: torch.Tensor,
        guidance: list[FlowGuidance | None],
    ) -> torch.Tensor:
        """The rows' new ``x`` from the plain eager pass (guided where they have guidance)."""
        self._padding['denoise'].add_eager(len(rows))
        meta = self._suffix_metadata(rows, prefix_lens)
        reads = CrossReads(
            req_to_token=self.req_to_token,
            rows=torch.tensor(rows, device=self.device).repeat_interleave(self.chunk_size),
            prefix_lens=torch.tensor(prefix_lens, device=self.device).repeat_interleave(
                self.chunk_size
            ),
            backend=self.backend,
        )

        def velocity_of(x_t: torch.Tensor) -> torch.Tensor:
            return self.model.velocity(
                x_t=x_t, t=t, meta=meta, reads=reads, kv_caches=self.kv_caches,
                cross_caches=self.cross_caches,
            )  # fmt: skip

        if any(g is not None for g in guidance):
            v = self._guided(velocity_of, x, t, guidance)
        else:
            v = velocity_of(x)
        return x + (-1.0 / self.num_steps) * v

    def _guided(
        self,
        velocity_of: Callable[[torch.Tensor], torch.Tensor],
        x: torch.Tensor,
        t: torch.Tensor,
        guidance: list[FlowGuidance | None],
    ) -> torch.Tensor:
        """Real-time chunking: the rows' velocities guided towards their targets
        (``guided_rows``); the pass wrote its suffix into the caches with its graph, which
        is dropped."""
        v = guided_rows(velocity_of, x_t=x, t=t, guidance=guidance)
        for k_cache, v_cache in self.kv_caches:
            k_cache.detach_()
            v_cache.detach_()
        return v

    def _first_scratch_slot(self, row: int) -> int:
        return self.scratch_start + row * self.chunk_size

    def _suffix_tables(
        self, rows: list[int], prefix_lens: list[int], *, width: int
    ) -> torch.Tensor:
        """int32 ``[B, width]`` on the host: each row's prefix slots (the engine's table),
        then its actions' scratch slots; the columns past them are never read."""
        chunk = self.chunk_size
        rows_t = torch.tensor(rows, dtype=torch.int64)
        table = torch.zeros((len(rows), width), dtype=torch.int32)
        held = min(width, self.engine_table.shape[1])
        table[:, :held] = self.engine_table[rows_t, :held]
        offsets = torch.arange(chunk, dtype=torch.int64)
        columns = torch.tensor(prefix_lens, dtype=torch.int64)[:, None] + offsets
        first = self.scratch_start + rows_t * chunk
        table.scatter_(1, columns, (first[:, None] + offsets).to(torch.int32))
        return table

    def _suffix_metadata(self, rows: list[int], prefix_lens: list[int]) -> AttentionMetadata:
        """The actions over each row's prefix for the joint layers: a slot table of the rows'
        prefix slots then their scratch slots, causal among the actions."""
        size, chunk = len(rows), self.chunk_size
        longest = max(prefix_lens) + chunk
        table = torch.zeros((size, longest), dtype=self.req_to_token.dtype, device=self.device)
        scratch = []
        for n, (row, p) in enumerate(zip(rows, prefix_lens, strict=True)):
            table[n, :p] = self.req_to_token[row, :p]
            first = self.scratch_start + row * chunk
            slots = torch.arange(first, first + chunk, device=self.device)
            table[n, p : p + chunk] = slots.to(table.dtype)
            scratch.append(slots)
        return AttentionMetadata.build(
            is_decode=False,
            req_to_token=table,
            req_pool_indices=torch.arange(size, dtype=torch.int64),
            prefix_lens=torch.tensor(prefix_lens, dtype=torch.int64),
            extend_lens=torch.full((size,), chunk, dtype=torch.int64),
            out_cache_loc=torch.cat(scratch),
            device=self.device,
            backend=self.backend,
        )
