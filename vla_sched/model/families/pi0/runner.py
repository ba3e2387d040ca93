"""The flow-matching runner: a ``ForwardBatch`` of pi0 rows in, pass markers and action
chunks out (the scheduler's ``BatchRunner``).

A row is a robot's prefix pass or one of its denoising passes (``batch.denoise_passes``: -1,
or the pass index; see ``core/forward_batch.py``):

- prefix rows run PaliGemma over ``[camera 0 patches | camera 1 patches | ... | language]``
  in one extend pass, each row attending both ways over its own prefix; the K/V stay in the
  paged cache at the row's slots, and the row's denoising state starts from its noise;
- denoising rows, of every robot in flight, run together: each row's suffix attends over its
  prefix (the row's slots in ``req_to_token``, positions ``0 .. P - 1``) and over the
  suffix itself, at positions ``P ..``; the suffix's K/V go to scratch slots past the
  engine's and are overwritten by the next pass. Each row moves by one Euler step (pass
  ``k`` of ``K``: LeRobot's ``x <- x + dt * v(x, t)``, ``dt = -1 / K``, ``t = 1 + k * dt``),
  and its last pass returns the row's chunk (normalized, ``[chunk_size, max_action_dim]``).

A row with real-time-chunking guidance (``batch.guidance``) gets its velocity guided towards
its target (``model/runner/flow_guidance.py``: one vector-Jacobian product through the
expert per pass), batched with the other rows of the pass.

The denoising state lives on the request's row (``[num_req_slots, chunk, max_action_dim]``),
so a row's passes chain on the device whatever the host has processed; a retracted request
gets a new row and starts over from its prefix. The marker of every pass is token 0.

With ``cuda_graphs`` (or ``pass_sizes`` for the same paths run eagerly, as the CPU tests do)
the prefix and denoising passes run padded at prepared sizes (``graphs.py``, sizes in
``passes.py``: replayed as CUDA graphs on a GPU) and the tower through ``VisionGraphs``;
guided rows stay on the plain eager pass (a backward pass). What each path ran is counted
(``padding_stats``: ``prefix`` in tokens, ``denoise`` in rows, ``vision`` in images).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from vla_sched.core.forward_batch import (
    FlowGuidance,
    ForwardBatch,
    ForwardMode,
    ForwardOutput,
)
from vla_sched.model.families.openvla_oft.passes import OFTPass
from vla_sched.model.families.pi0.graphs import (
    NUM_PREFIX_PADDING_SLOTS,
    PI0_PATH_UNITS,
    DenoiseGraphs,
    ImageFeatures,
    PrefixGraphs,
)
from vla_sched.model.families.pi0.model import Pi0Model
from vla_sched.model.families.pi0.passes import Pi0PassSizes
from vla_sched.model.layers.attention import AttentionMetadata
from vla_sched.model.layers.transfer import to_device
from vla_sched.model.runner.flow_guidance import guided_rows
from vla_sched.model.runner.padded_paths import captured_or_eager
from vla_sched.model.runner.padding_stats import PaddingCounter, PaddingStats
from vla_sched.model.runner.vision_graphs import VisionGraphs

MARKER_TOKEN_ID = 0  # every pass's output id: the scheduler counts passes by them
PixelsOf = Callable[[Sequence[np.ndarray]], torch.Tensor]


@dataclass(frozen=True, slots=True)
class _Done:
    output: ForwardOutput

    def result(self) -> ForwardOutput:
        return self.output


class FlowMatchingRunner:
    """Runs pi0 / pi0.5 prefix and denoising rows on the paged KV (see the module docstring).

    Args:
        model: the loaded model.
        req_to_token: the engine's slot table ``[num_req_slots, max_context_len]``.
        num_kv_slots: the engine's KV slots; the runner's cache has scratch slots past them
            for one suffix per request row.
        num_steps: denoising passes per chunk (the folder's ``num_inference_steps``).
        chunk_size: actions per chunk.
        pixels_of: a step's camera images (uint8 ``[H, W, 3]``) as the tower's input
            ``[N, 3, S, S]`` in [-1, 1] (the family's processor).
        backend: the attention kernels' backend ('auto': Triton on CUDA, torch elsewhere).
        cuda_graphs: capture the padded prefix and denoising passes and the tower as CUDA
            graphs (a CUDA device and ``pass_sizes``; the passes run the Triton kernels).
        pass_sizes: the padded paths' prepared sizes; given without ``cuda_graphs``, the
            same padded passes run eagerly. None: the plain eager passes.

    Raises:
        ValueError: for ``cuda_graphs`` off CUDA or without ``pass_sizes``.
    """

    def __init__(
        self,
        model: Pi0Model,
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
        self.suffix_len = model.suffix_len + chunk_size
        num_rows = req_to_token.shape[0]
        self.scratch_start = num_kv_slots
        # Past the engine's slots: one suffix per request row, then (padded paths) the
        # padding rows' suffix and the prefix padding's slots.
        pad_slot = num_kv_slots + num_rows * self.suffix_len
        num_slots = pad_slot
        if pass_sizes is not None:
            num_slots += self.suffix_len + NUM_PREFIX_PADDING_SLOTS
        self.kv_caches = model.allocate_kv_cache(num_slots)
        self._x = torch.zeros(
            (num_rows, chunk_size, model.max_action_dim), dtype=torch.float32, device=self.device
        )
        self._padding = {path: PaddingCounter() for path in PI0_PATH_UNITS}
        self.denoise_graphs: DenoiseGraphs | None = None
        self.prefix_graphs: PrefixGraphs | None = None
        self.vision_graphs: VisionGraphs | None = None
        if pass_sizes is not None:
            self._build_padded_paths(pass_sizes, pad_slot=pad_slot, cuda_graphs=cuda_graphs)

    def _build_padded_paths(
        self, sizes: Pi0PassSizes, *, pad_slot: int, cuda_graphs: bool
    ) -> None:
        """The padded paths (each captured with ``cuda_graphs``; one that cannot be runs
        eagerly, with a warning)."""
        model = self.model

        def denoise(capture: bool) -> DenoiseGraphs:
            return DenoiseGraphs(
                model,
                self.kv_caches,
                batch_sizes=sizes.denoise_batch_sizes,
                chunk_size=self.chunk_size,
                num_steps=self.num_steps,
                table_width=self.engine_table.shape[1] + self.suffix_len,
                pad_slot=pad_slot,
                capture=capture,
                backend=self.backend,
                padding=self._padding['denoise'],
            )

        def prefix(capture: bool) -> PrefixGraphs:
            return PrefixGraphs(
                model,
                self.kv_caches,
                sizes=sizes.prefix_sizes(),
                first_pad_slot=pad_slot + self.suffix_len,
                capture=capture,
                backend=self.backend,
                padding=self._padding['prefix'],
            )

        def vision(capture: bool) -> VisionGraphs:
            image = model.sizes.vision.image_size
            return VisionGraphs(
                ImageFeatures(model),
                pixel_shape=(3, image, image),
                batch_sizes=sizes.vision_batch_sizes,
                device=self.device,
                output_dtype=model.dtype,
                capture=capture,
                padding=self._padding['vision'],
            )

        self.vision_graphs = captured_or_eager(cuda_graphs, vision, 'pi0 tower')
        self.prefix_graphs = captured_or_eager(cuda_graphs, prefix, 'pi0 prefix pass')
        self.denoise_graphs = captured_or_eager(cuda_graphs, denoise, 'pi0 denoising pass')

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
        rows = batch.req_pool_indices.tolist()
        prefix = [i for i, k in enumerate(passes) if k == -1]
        if prefix:
            if batch.forward_mode is not ForwardMode.EXTEND:
                raise ValueError('a prefix pass is an extend pass')
            self._run_prefix(batch, prefix)
        denoising = [i for i, k in enumerate(passes) if k >= 0]
        num_steps = batch.num_decode_steps if batch.forward_mode is ForwardMode.DECODE else 1
        chunks: list[np.ndarray | None] = [None] * batch.batch_size
        for j in range(num_steps if denoising else 0):
            for i, chunk in self._denoise(batch, denoising, rows, step=j).items():
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
        if images:
            features = self._image_features(self.pixels_of([im.pixels for im in images]))
            offset, n = 0, 0
            for i in indices:
                for image in batch.images[i]:
                    span = slice(offset + image.token_offset, offset + image.token_end)
                    embeds[span] = features[n, : image.num_tokens]
                    n += 1
                offset += extend[i]
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
        """The prefixes of ``lens`` on the plain eager pass, each attending both ways."""
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
            image_spans=torch.stack([torch.zeros_like(lens_t), lens_t], dim=1),
        )
        self.model.run_prefix(embeds, meta, self.kv_caches)

    # ---- a denoising pass ---------------------------------------------------------------

    def _denoise(
        self, batch: ForwardBatch, indices: list[int], rows: list[int], *, step: int
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
        row_ids = [rows[i] for i in indices]
        dt = -1.0 / self.num_steps
        t = torch.tensor([1.0 + k * dt for k in passes], dtype=torch.float32)
        state = None
        if self.model.state_proj is not None:
            state = torch.stack(
                [torch.as_tensor(np.asarray(batch.proprio[i], np.float32)) for i in indices]
            )
        guidance = [batch.guidance[i] for i in indices] if batch.guidance else []
        x = self._x[row_ids]
        if self.denoise_graphs is None:
            x = self._plain_step(row_ids, prefix_lens, t, state, x, guidance)
        else:
            x = self._padded_step(row_ids, prefix_lens, t, state, x, guidance)
        self._x[row_ids] = x
        return {
            i: x[n].cpu().numpy().copy()
            for n, (i, k) in enumerate(zip(indices, passes, strict=True))
            if k == self.num_steps - 1
        }

    def _padded_step(
        self,
        row_ids: list[int],
        prefix_lens: list[int],
        t: torch.Tensor,
        state: torch.Tensor | None,
        x: torch.Tensor,
        guidance: list[FlowGuidance | None],
    ) -> torch.Tensor:
        """The rows' new ``x``: those without guidance from the padded pass, the guided
        ones from the plain eager pass."""
        guided = [n for n, g in enumerate(guidance) if g is not None]
        plain = [n for n in range(len(row_ids)) if not guidance or guidance[n] is None]
        out = torch.empty_like(x)
        if plain:
            rows = [row_ids[n] for n in plain]
            lens = [prefix_lens[n] for n in plain]
            out[plain] = self.denoise_graphs.run(
                x=x[plain],
                t=t[plain],
                state=None if state is None else state[plain],
                tables=self._suffix_tables(rows, lens, width=self.denoise_graphs.table_width),
                prefix_lens=lens,
                first_slots=[self._first_scratch_slot(row) for row in rows],
            )
        if guided:
            out[guided] = self._plain_step(
                [row_ids[n] for n in guided],
                [prefix_lens[n] for n in guided],
                t[guided],
                None if state is None else state[guided],
                x[guided],
                [guidance[n] for n in guided],
            )
        return out

    def _plain_step(
        self,
        row_ids: list[int],
        prefix_lens: list[int],
        t: torch.Tensor,
        state: torch.Tensor | None,
        x: torch.Tensor,
        guidance: list[FlowGuidance | None],
    ) -> torch.Tensor:
        """The rows' new ``x`` from the plain eager pass (guided where they have guidance)."""
        self._padding['denoise'].add_eager(len(row_ids))
        meta = self._suffix_metadata(row_ids, prefix_lens)

        def velocity_of(x_t: torch.Tensor) -> torch.Tensor:
            return self.model.velocity(
                x_t=x_t, t=t, state=state, meta=meta, kv_caches=self.kv_caches
            )

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
        return self.scratch_start + row * self.suffix_len

    def _suffix_tables(
        self, rows: list[int], prefix_lens: list[int], *, width: int
    ) -> torch.Tensor:
        """int32 ``[B, width]`` on the host: each row's prefix slots (the engine's table),
        then its suffix's scratch slots; the columns past them are never read."""
        suffix = self.suffix_len
        rows_t = torch.tensor(rows, dtype=torch.int64)
        table = torch.zeros((len(rows), width), dtype=torch.int32)
        held = min(width, self.engine_table.shape[1])
        table[:, :held] = self.engine_table[rows_t, :held]
        offsets = torch.arange(suffix, dtype=torch.int64)
        columns = torch.tensor(prefix_lens, dtype=torch.int64)[:, None] + offsets
        first = self.scratch_start + rows_t * suffix
        table.scatter_(1, columns, (first[:, None] + offsets).to(torch.int32))
        return table

    def _suffix_metadata(self, rows: list[int], prefix_lens: list[int]) -> AttentionMetadata:
        """Each suffix over its row's prefix: a slot table of the rows' prefix slots then
        their scratch slots; pi0's state token attends causally (it sees the prefix and
        itself), the action tokens both ways among themselves."""
        size = len(rows)
        suffix = self.suffix_len
        table = self._suffix_tables(rows, prefix_lens, width=max(prefix_lens) + suffix)
        scratch = [
            torch.arange(self._first_scratch_slot(row), self._first_scratch_slot(row) + suffix)
            for row in rows
        ]
        prefix = torch.tensor(prefix_lens, dtype=torch.int64)
        actions_start = prefix + self.model.suffix_len
        return AttentionMetadata.build(
            is_decode=False,
            req_to_token=to_device(table, self.device),
            req_pool_indices=torch.arange(size, dtype=torch.int64),
            prefix_lens=prefix,
            extend_lens=torch.full((size,), suffix, dtype=torch.int64),
            out_cache_loc=torch.cat(scratch),
            device=self.device,
            backend=self.backend,
            image_spans=torch.stack([actions_start, prefix + suffix], dim=1),
        )
