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
from vla_sched.model.families.pi0.model import Pi0Model
from vla_sched.model.layers.attention import AttentionMetadata
from vla_sched.model.runner.flow_guidance import guided_velocity

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
        self.suffix_len = model.suffix_len + chunk_size
        num_rows = req_to_token.shape[0]
        self.scratch_start = num_kv_slots
        self.kv_caches = model.allocate_kv_cache(num_kv_slots + num_rows * self.suffix_len)
        self._x = torch.zeros(
            (num_rows, chunk_size, model.max_action_dim), dtype=torch.float32, device=self.device
        )

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
            features = model.image_features(self.pixels_of([im.pixels for im in images]))
            offset, n = 0, 0
            for i in indices:
                for image in batch.images[i]:
                    span = slice(offset + image.token_offset, offset + image.token_end)
                    embeds[span] = features[n, : image.num_tokens]
                    n += 1
                offset += extend[i]
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
            image_spans=torch.stack([torch.zeros_like(lens), lens], dim=1),
        )
        model.run_prefix(embeds, meta, self.kv_caches)
        for i in indices:
            noise = batch.noise[i] if batch.noise else None
            if noise is None:
                raise ValueError(f'request {batch.rids[i]!r} starts denoising without noise')
            row = int(batch.req_pool_indices[i])
            self._x[row] = torch.as_tensor(np.asarray(noise, np.float32), device=self.device)

    # ---- a denoising pass ---------------------------------------------------------------

    def _denoise(
        self, batch: ForwardBatch, indices: list[int], rows: list[int], *, step: int
    ) -> dict[int, np.ndarray]:
        """One Euler step of every denoising row; the chunks of the rows that finished."""
        passes = [batch.denoise_passes[i] + step for i in indices]
        if any(k >= self.num_steps for k in passes):
            raise ValueError(f'a denoising pass index is past the {self.num_steps} passes')
        pos = batch.prefix_lens.tolist()
        # Pass k's marker sits at position P + k: the prefix is the first P positions.
        prefix_lens = [pos[i] - batch.denoise_passes[i] for i in indices]
        row_ids = [rows[i] for i in indices]
        meta = self._suffix_metadata(row_ids, prefix_lens)
        dt = -1.0 / self.num_steps
        t = torch.tensor([1.0 + k * dt for k in passes], dtype=torch.float32)
        state = None
        if self.model.state_proj is not None:
            state = torch.stack(
                [torch.as_tensor(np.asarray(batch.proprio[i], np.float32)) for i in indices]
            )
        x = self._x[row_ids]

        def velocity_of(x_t: torch.Tensor) -> torch.Tensor:
            return self.model.velocity(
                x_t=x_t, t=t, state=state, meta=meta, kv_caches=self.kv_caches
            )

        guidance = [batch.guidance[i] for i in indices] if batch.guidance else []
        if any(g is not None for g in guidance):
            v = self._guided(velocity_of, x, t, guidance)
        else:
            v = velocity_of(x)
        x = x + dt * v
        self._x[row_ids] = x
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
        for k_cache, v_cache in self.kv_caches:  # the pass wrote the suffix with its graph
            k_cache.detach_()
            v_cache.detach_()
        return v

    def _suffix_metadata(self, rows: list[int], prefix_lens: list[int]) -> AttentionMetadata:
        """Each suffix over its row's prefix: a slot table of the rows' prefix slots then
        their scratch slots; pi0's state token attends causally (it sees the prefix and
        itself), the action tokens both ways among themselves."""
        size = len(rows)
        suffix = self.suffix_len
        longest = max(prefix_lens) + suffix
        table = torch.zeros((size, longest), dtype=self.req_to_token.dtype, device=self.device)
        scratch = []
        for n, (row, p) in enumerate(zip(rows, prefix_lens, strict=True)):
            table[n, :p] = self.req_to_token[row, :p]
            first = self.scratch_start + row * suffix
            slots = torch.arange(first, first + suffix, device=self.device)
            table[n, p : p + suffix] = slots.to(table.dtype)
            scratch.append(slots)
        prefix = torch.tensor(prefix_lens, dtype=torch.int64)
        actions_start = prefix + self.model.suffix_len
        return AttentionMetadata.build(
            is_decode=False,
            req_to_token=table,
            req_pool_indices=torch.arange(size, dtype=torch.int64),
            prefix_lens=prefix,
            extend_lens=torch.full((size,), suffix, dtype=torch.int64),
            out_cache_loc=torch.cat(scratch),
            device=self.device,
            backend=self.backend,
            image_spans=torch.stack([actions_start, prefix + suffix], dim=1),
        )
