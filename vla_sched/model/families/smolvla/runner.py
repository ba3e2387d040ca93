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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from vla_sched.core.forward_batch import FlowGuidance, ForwardBatch, ForwardMode, ForwardOutput
from vla_sched.model.families.pi0.runner import MARKER_TOKEN_ID, _Done
from vla_sched.model.families.smolvla.model import CrossReads, SmolVLAModel
from vla_sched.model.layers.attention import AttentionMetadata
from vla_sched.model.runner.flow_guidance import guided_velocity

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
    ) -> None:
        if num_steps < 1:
            raise ValueError(f'num_steps must be >= 1, got {num_steps}')
        self.model = model
        self.device = model.device
        self.req_to_token = req_to_token.to(self.device)
        self.num_steps = num_steps
        self.chunk_size = chunk_size
        self.pixels_of = pixels_of
        self.backend = backend
        num_rows = req_to_token.shape[0]
        self.scratch_start = num_kv_slots
        self.kv_caches = model.allocate_kv_cache(num_kv_slots + num_rows * chunk_size)
        self.cross_caches = model.allocate_cross_cache(num_kv_slots)
        self._x = torch.zeros(
            (num_rows, chunk_size, model.max_action_dim), dtype=torch.float32, device=self.device
        )

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
            features = model.image_features(self.pixels_of([im.pixels for im in images]))
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
        lens = torch.tensor([extend[i] for i in indices], dtype=torch.int64)
        meta = AttentionMetadata.build(
            is_decode=False,
            req_to_token=self.req_to_token,
            req_pool_indices=batch.req_pool_indices[indices],
            prefix_lens=torch.zeros(len(indices), dtype=torch.int64),
            extend_lens=lens,
            out_cache_loc=slots,
            device=self.device,
            backend=self.backend,
            image_spans=torch.stack([torch.zeros_like(lens), lens - 1], dim=1),
        )
        model.run_prefix(embeds, meta, self.kv_caches)
        model.store_cross_kv(slots, self.kv_caches, self.cross_caches)
        for i in indices:
            noise = batch.noise[i] if batch.noise else None
            if noise is None:
                raise ValueError(f'request {batch.rids[i]!r} starts denoising without noise')
            row = int(batch.req_pool_indices[i])
            self._x[row] = torch.as_tensor(np.asarray(noise, np.float32), device=self.device)

    # ---- a denoising pass ---------------------------------------------------------------

    def _denoise(
        self, batch: ForwardBatch, indices: list[int], *, step: int
    ) -> dict[int, np.ndarray]:
        """One Euler step of every denoising row; the chunks of the rows that finished."""
        passes = [batch.denoise_passes[i] + step for i in indices]
        if any(k >= self.num_steps for k in passes):
            raise ValueError(f'a denoising pass index is past the {self.num_steps} passes')
        pos = batch.prefix_lens.tolist()
        # Pass k's marker sits at position P + k: the prefix is the first P positions.
        prefix_lens = [pos[i] - batch.denoise_passes[i] for i in indices]
        rows = [int(batch.req_pool_indices[i]) for i in indices]
        meta = self._suffix_metadata(rows, prefix_lens)
        reads = CrossReads(
            req_to_token=self.req_to_token,
            rows=torch.tensor(rows, device=self.device).repeat_interleave(self.chunk_size),
            prefix_lens=torch.tensor(prefix_lens, device=self.device).repeat_interleave(
                self.chunk_size
            ),
            backend=self.backend,
        )
        dt = -1.0 / self.num_steps
        t = torch.tensor([1.0 + k * dt for k in passes], dtype=torch.float32)
        x = self._x[rows]

        def velocity_of(x_t: torch.Tensor) -> torch.Tensor:
            return self.model.velocity(
                x_t=x_t, t=t, meta=meta, reads=reads, kv_caches=self.kv_caches,
                cross_caches=self.cross_caches,
            )  # fmt: skip

        guidance = [batch.guidance[i] for i in indices] if batch.guidance else []
        if any(g is not None for g in guidance):
            v = self._guided(velocity_of, x, t, guidance)
        else:
            v = velocity_of(x)
        x = x + dt * v
        self._x[rows] = x
        return {
            i: x[n].cpu().numpy().copy()
            for n, (i, k) in enumerate(zip(indices, passes, strict=True))
            if k == self.num_steps - 1
        }

    def _guided(
        self,
        velocity_of: Callable[[torch.Tensor], torch.Tensor],
        x: torch.Tensor,
        t: torch.Tensor,
        guidance: list[FlowGuidance | None],
    ) -> torch.Tensor:
        """Real-time chunking: the rows' velocities guided towards their targets (rows
        without guidance get a zero mask, so their velocity is the plain one)."""
        zeros = torch.zeros(x.shape[1:], dtype=torch.float32)
        target = torch.stack(
            [zeros if g is None else torch.as_tensor(g.target) for g in guidance]
        ).to(self.device)
        weights = torch.stack(
            [zeros[:, 0] if g is None else torch.as_tensor(g.weights) for g in guidance]
        ).to(self.device)
        max_weight = torch.tensor(
            [0.0 if g is None else g.max_weight for g in guidance], device=self.device
        )
        v = guided_velocity(
            velocity_of,
            x_t=x,
            t=t.to(self.device),
            target=target,
            weights=weights,
            max_weight=max_weight,
        )
        for k_cache, v_cache in self.kv_caches:  # the pass wrote the actions with its graph
            k_cache.detach_()
            v_cache.detach_()
        return v

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
