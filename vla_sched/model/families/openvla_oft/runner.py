"""One parallel pass per OpenVLA-OFT step, batched across robots: action chunks out.

Each request of the batch is a whole OFT sequence (``prompt.py``) computed
from position 0 with no cached prefix: the images' patches, the projected state and zeroed
action slots replace their placeholders' embeddings, the decoder runs with every request's
span set to its whole sequence (a query sees every position of its own sequence: fully
bidirectional attention, as the fork of transformers OFT runs with), the L1 head reads the
final hidden states one position before each action slot, and the actions are
un-normalized with the selected dataset's bounds (gripper and other unmasked dimensions
left as the model gives them). The K/V the pass writes go to the slots the caller gave; an
OFT step keeps none of them afterwards, so the caller frees them once the call returns.

With ``cuda_graphs`` (or ``pass_sizes`` for the same path run eagerly, as the CPU tests do)
the decoder and the head run as padded passes at prepared sizes (``oft_graphs``: whole
requests, as few padded tokens as the sizes allow, replayed as CUDA graphs on a GPU) and
the towers through ``VisionGraphs``; the embeddings are built eagerly either way. What each
path ran is counted (``padding_stats``: ``oft`` in tokens, ``vision`` in images).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vla_sched.core.forward_batch import ForwardBatch, ForwardMode, ForwardOutput
from vla_sched.model.families.openvla_oft.checkpoint import OFT_STOP_TOKEN_ID, NormalizationBounds
from vla_sched.model.families.openvla_oft.graphs import (
    NUM_OFT_PADDING_SLOTS,
    OFTGraphs,
    build_oft_paths,
)
from vla_sched.model.families.openvla_oft.model import OFTModel
from vla_sched.model.families.openvla_oft.passes import OFTPass, OFTPassSizes
from vla_sched.model.families.openvla_oft.prompt import OFTSequence
from vla_sched.model.layers.attention import AttentionMetadata
from vla_sched.model.layers.decoder import KVCache
from vla_sched.model.layers.transfer import to_device
from vla_sched.model.layers.vision import FeatureCache
from vla_sched.model.runner.padding_stats import OFT_PATH_UNITS, PaddingCounter, PaddingStats
from vla_sched.model.runner.step_inputs import check_batch
from vla_sched.model.runner.vision_graphs import VisionGraphs


class LaunchedActions:
    """A launched OFT step (``ResultHandle``): the head's output on its way to the host;
    ``result()`` waits for the device if needed and un-normalizes the chunks.

    Args:
        normalized: The head's output ``[B, chunk_len, action_dim]`` (on the device).
        bounds: The dataset's action bounds.
    """

    def __init__(self, normalized: torch.Tensor, bounds: NormalizationBounds) -> None:
        self._bounds = bounds
        self._event: torch.cuda.Event | None = None
        self._output: ForwardOutput | None = None
        if normalized.device.type == 'cuda':
            self._host = torch.empty(normalized.shape, dtype=torch.float32, pin_memory=True)
            self._host.copy_(normalized.float(), non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = normalized.float()

    def result(self) -> ForwardOutput:
        if self._output is None:
            if self._event is not None:
                self._event.synchronize()
            actions = self._bounds.unnormalize(self._host.numpy()).astype(np.float32)
            self._output = ForwardOutput(
                next_token_ids=(-1,) * actions.shape[0], action_chunks=tuple(actions)
            )
        return self._output


class FinishedActions:
    """A step with nothing to run (``ResultHandle``)."""

    def __init__(self, output: ForwardOutput) -> None:
        self._output = output

    def result(self) -> ForwardOutput:
        return self._output


class ParallelActionRunner:
    """Runs batches of OFT steps on a paged KV cache and returns their action chunks.

    ``launch`` is the scheduler's ``BatchRunner`` call (a prefill-only ``ForwardBatch`` with
    its states in ``proprio``); ``forward_actions`` takes the states as an argument.

    Args:
        model: The loaded OFT model.
        req_to_token: The engine's slot table ``int32 [num_req_slots, max_context_len]``; a
            request's row lists the slots of its whole sequence before the call.
        num_kv_slots: KV capacity in tokens (slot ids the caller may hand out).
        backend: Attention kernel backend (``auto``, ``triton``, ``torch``).
        kv_caches: Per-layer caches to write into (e.g. shared with another runner);
            allocated here when None. They hold ``num_kv_slots`` slots, and
            ``NUM_OFT_PADDING_SLOTS`` more for the padding tokens on the padded path.
        feature_cache_size: Projected image features kept by content hash.
        cuda_graphs: Capture the padded passes and the vision encoder as CUDA graphs (a
            CUDA device; the passes run the Triton kernels).
        pass_sizes: The padded path's prepared sizes; given without ``cuda_graphs``, the
            same padded passes run eagerly. None: ``OFTPassSizes()`` with ``cuda_graphs``,
            else the plain eager pass.

    Raises:
        ValueError: for ``cuda_graphs`` off CUDA.
    """

    def __init__(
        self,
        model: OFTModel,
        *,
        req_to_token: torch.Tensor,
        num_kv_slots: int,
        backend: str = 'auto',
        kv_caches: list[KVCache] | None = None,
        feature_cache_size: int = 64,
        cuda_graphs: bool = False,
        pass_sizes: OFTPassSizes | None = None,
    ) -> None:
        if req_to_token.dim() != 2 or req_to_token.dtype not in (torch.int32, torch.int64):
            raise ValueError('req_to_token must be an int32 [num_req_slots, max_context_len]')
        if num_kv_slots < 1:
            raise ValueError(f'num_kv_slots must be >= 1, got {num_kv_slots}')
        if cuda_graphs and model.device.type != 'cuda':
            raise ValueError('CUDA graphs need the model on a CUDA device')
        if cuda_graphs and pass_sizes is None:
            pass_sizes = OFTPassSizes()
        decoder = model.vla.decoder
        num_slots = num_kv_slots + (NUM_OFT_PADDING_SLOTS if pass_sizes is not None else 0)
        if kv_caches is None:
            kv_caches = decoder.allocate_kv_cache(num_slots)
        elif len(kv_caches) != decoder.spec.num_layers or kv_caches[0][0].shape[0] < num_slots:
            raise ValueError(
                f'kv_caches must hold {decoder.spec.num_layers} layers of at least '
                f'{num_slots} slots'
            )
        self.model = model
        self.device = model.device
        self.backend = backend
        self.req_to_token = req_to_token
        self.num_kv_slots = num_kv_slots
        self.kv_caches = kv_caches
        self.feature_cache = FeatureCache(feature_cache_size)
        self._rope = decoder.rope_tables(req_to_token.shape[1])
        self._reads_engine_table = (
            self.device.type == 'cpu'
            and req_to_token.dtype == torch.int32
            and req_to_token.is_contiguous()
        )
        if not self._reads_engine_table:
            self._req_to_token_dev = torch.zeros(
                req_to_token.shape, dtype=torch.int32, device=self.device
            )
        self._padding = {path: PaddingCounter() for path in OFT_PATH_UNITS}
        self.oft_graphs: OFTGraphs | None = None
        self.vision_graphs: VisionGraphs | None = None
        if pass_sizes is not None:
            self.oft_graphs, self.vision_graphs = build_oft_paths(
                model,
                kv_caches,
                req_to_token if self._reads_engine_table else self._req_to_token_dev,
                rope=self._rope,
                pass_sizes=pass_sizes,
                first_pad_slot=num_kv_slots,
                cuda_graphs=cuda_graphs,
                backend=backend,
                counters=self._padding,
            )

    def padding_stats(self) -> dict[str, PaddingStats]:
        """What each path ran since the runner was built: ``'oft'`` (the decoder and head
        passes, in tokens) and ``'vision'`` (images), as ``PaddingStats``; steps on the
        plain eager pass count as eager runs."""
        return {path: counter.snapshot() for path, counter in self._padding.items()}

    @property
    def chunk_shape(self) -> tuple[int, int]:
        """``(chunk_len, action_dim)`` of one request's result."""
        return self.model.spec.chunk_len, self.model.spec.action_dim

    def launch(self, batch: ForwardBatch) -> LaunchedActions | FinishedActions:
        """Run a prefill-only batch (``batch.proprio``: each request's state, or empty when
        the settings use none); its handle's ``result()`` gives the chunks as
        ``ForwardOutput.action_chunks``.

        On a GPU this returns once the pass is queued (the chunks are copied back on the
        side and ``result()`` waits for them), so the overlap loop processes the previous
        pass's results while this one runs; elsewhere the pass has run when it returns.

        Raises:
            ValueError, IndexError: for a batch that is not prefill-only, or naming the
                request whose inputs are wrong.
        """
        num_reqs = batch.batch_size
        if batch.forward_mode is ForwardMode.IDLE or num_reqs == 0:
            return FinishedActions(ForwardOutput(next_token_ids=(), action_chunks=()))
        if not batch.prefill_only:
            raise ValueError('an OFT model runs prefill-only batches (one whole pass per step)')
        states = batch.proprio if batch.proprio else (None,) * num_reqs
        normalized = self.forward_normalized(batch, states=states)
        return LaunchedActions(normalized, self.model.spec.selected_action_bounds)

    def layouts(self, batch: ForwardBatch) -> list[OFTSequence]:
        """Each request's sequence layout, checked against its ids and images.

        Raises:
            ValueError: naming the request whose sequence is not an OFT step of this model.
        """
        spec = self.model.spec
        settings = spec.settings
        if batch.forward_mode is not ForwardMode.EXTEND:
            raise ValueError('OFT steps run as one extend pass')
        prefix = batch.prefix_lens.tolist()
        seq = batch.seq_lens.tolist()
        starts = np.cumsum(batch.extend_lens.numpy()) - batch.extend_lens.numpy()
        ids = batch.input_ids
        appended = spec.base.prompt.append_token_id
        layouts = []
        for i, rid in enumerate(batch.rids):
            if prefix[i]:
                raise ValueError(f'request {rid}: an OFT step is computed whole (prefix_len 0)')
            images = batch.images[i]
            if len(images) != settings.num_images:
                raise ValueError(
                    f'request {rid}: {len(images)} images, the OFT settings take '
                    f'{settings.num_images} (primary camera first)'
                )
            try:
                layout = OFTSequence.from_length(
                    seq[i],
                    num_images=settings.num_images,
                    num_image_tokens=spec.num_image_tokens,
                    has_proprio=settings.use_proprio,
                    num_action_tokens=settings.num_action_tokens,
                )
            except ValueError as exc:
                raise ValueError(f'request {rid}: {exc}') from None
            for c, image in enumerate(images):
                if (image.token_offset, image.num_tokens) != (
                    layout.image_offset(c),
                    layout.num_image_tokens,
                ):
                    raise ValueError(
                        f'request {rid}: image {c} spans [{image.token_offset}, '
                        f'{image.token_end}), its layout [{layout.image_offset(c)}, '
                        f'{layout.image_offset(c) + layout.num_image_tokens})'
                    )
            start = int(starts[i])
            if int(ids[start + layout.stop_offset]) != OFT_STOP_TOKEN_ID:
                raise ValueError(f'request {rid}: the sequence does not end with the stop token')
            if int(ids[start + layout.head_offset]) != appended:
                raise ValueError(f'request {rid}: the prompt does not end with {appended}')
            layouts.append(layout)
        return layouts

    def forward_actions(
        self, batch: ForwardBatch, *, states: Sequence[np.ndarray | None]
    ) -> np.ndarray:
        """Run one pass over the batch's OFT steps.

        Args:
            batch: An extend batch of whole OFT sequences (``OFTPromptBuilder``), each with
                its camera images (primary first) at their spans, on slots of
                ``req_to_token``.
            states: Per request, the robot state in robot units (``proprio_dim`` values)
                when the settings use proprio, else None.

        Returns:
            float32 ``[B, chunk_len, action_dim]`` actions in robot units.

        Raises:
            ValueError, IndexError: naming the request whose inputs are wrong.
        """
        normalized = self.forward_normalized(batch, states=states)
        bounds = self.model.spec.selected_action_bounds
        return bounds.unnormalize(normalized.float().cpu().numpy()).astype(np.float32)

    @torch.inference_mode()
    def forward_normalized(
        self, batch: ForwardBatch, *, states: Sequence[np.ndarray | None]
    ) -> torch.Tensor:
        """The head's output ``[B, chunk_len, action_dim]`` (model dtype, on the device):
        the actions before un-normalization. Arguments as ``forward_actions``."""
        check_batch(
            batch,
            req_to_token=self.req_to_token,
            num_kv_slots=self.num_kv_slots,
            vocab_size=self.model.spec.base.decoder.vocab_size,
        )
        layouts = self.layouts(batch)
        proprio = self._proprio_tokens(batch, states)
        decoder = self.model.vla.decoder
        embeds = decoder.embed(to_device(batch.input_ids, self.device))
        starts = (torch.cumsum(batch.extend_lens, 0) - batch.extend_lens).tolist()
        self._place_images(batch, embeds, starts)
        action_rows, proprio_rows = [], []
        for start, layout in zip(starts, layouts, strict=True):
            first = start + layout.action_offset
            action_rows.append(torch.arange(first, first + layout.num_action_tokens))
            if layout.has_proprio:
                proprio_rows.append(start + layout.proprio_offset)
        embeds[to_device(torch.cat(action_rows), self.device)] = 0.0
        if proprio is not None:
            embeds[to_device(torch.tensor(proprio_rows), self.device)] = proprio
        seq_lens = batch.seq_lens.tolist()
        if self.oft_graphs is None:
            passes = [OFTPass(0, batch.batch_size, 0, batch.num_tokens, size=None)]
        else:
            passes = self.oft_graphs.plan(seq_lens)
        head_offsets = [layout.head_offset for layout in layouts]
        outputs = [
            self._run_pass(p, batch, embeds, seq_lens=seq_lens, head_offsets=head_offsets)
            for p in passes
        ]
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    def _run_pass(
        self,
        p: OFTPass,
        batch: ForwardBatch,
        embeds: torch.Tensor,
        *,
        seq_lens: list[int],
        head_offsets: list[int],
    ) -> torch.Tensor:
        """The head's output for pass ``p`` of the batch: at its prepared size on the padded
        path, else (no size) the plain eager pass over its whole sequences."""
        if p.size is not None:
            return self.oft_graphs.run_pass(
                p,
                embeds=embeds,
                seq_lens=seq_lens,
                out_cache_loc=batch.out_cache_loc,
                req_pool_indices=batch.req_pool_indices,
                head_offsets=head_offsets,
            )
        self._padding['oft'].add_eager(p.num_tokens)
        lens = torch.tensor(seq_lens[p.requests], dtype=torch.int64)
        meta = self._metadata(
            batch.req_pool_indices[p.requests], lens, batch.out_cache_loc[p.tokens]
        )
        hidden = self.model.vla.decoder(
            embeds[p.tokens], meta, self.kv_caches, rope=self._rope.at(meta.positions)
        )
        first_rows = torch.cumsum(lens, 0) - lens + torch.tensor(head_offsets[p.requests])
        rows = first_rows[:, None] + torch.arange(self.model.spec.settings.num_action_tokens)
        return self.model.action_head(hidden[to_device(rows, self.device)])  # [B, A*K] rows

    def _proprio_tokens(
        self, batch: ForwardBatch, states: Sequence[np.ndarray | None]
    ) -> torch.Tensor | None:
        """``[B, D]`` projected states (None without proprio), states checked per request."""
        spec = self.model.spec
        if len(states) != batch.batch_size:
            raise ValueError(f'states needs one entry per request, got {len(states)}')
        bounds = spec.selected_proprio_bounds
        if bounds is None:
            given = [rid for rid, s in zip(batch.rids, states, strict=True) if s is not None]
            if given:
                raise ValueError(f'request {given[0]}: a state was given, the settings use none')
            return None
        normalized = []
        for rid, state in zip(batch.rids, states, strict=True):
            values = None if state is None else np.asarray(state, dtype=np.float64)
            if values is None or values.shape != (bounds.dim,) or not np.isfinite(values).all():
                raise ValueError(
                    f'request {rid}: the settings need a finite state of {bounds.dim} values, '
                    f'got {None if values is None else values.shape}'
                )
            normalized.append(bounds.normalize(values))
        # float64 -> float32 -> model dtype, as upstream's torch.Tensor(proprio).to(dtype)
        tensor = torch.from_numpy(np.stack(normalized).astype(np.float32)).to(self.model.dtype)
        return self.model.proprio_projector(to_device(tensor, self.device))

    def _place_images(self, batch: ForwardBatch, embeds: torch.Tensor, starts: list[int]) -> None:
        """Write every image's projected patches over its placeholder rows."""
        features = self.feature_cache.features_of(
            (
                (rid, image.content_hash, image.pixels)
                for rid, images in zip(batch.rids, batch.images, strict=True)
                for image in images
            ),
            preprocessing=self.model.vla.spec.preprocessing,
            device=self.device,
            encode=self._encode,
        )
        for start, images in zip(starts, batch.images, strict=True):
            for image in images:
                row = start + image.token_offset
                embeds[row : row + image.num_tokens] = features[image.content_hash]

    def _encode(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.vision_graphs is not None:
            return self.vision_graphs.encode(pixels)
        self._padding['vision'].add_eager(int(pixels.shape[0]))
        return self.model.vla.encode_images(pixels)

    def _metadata(
        self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, out_cache_loc: torch.Tensor
    ) -> AttentionMetadata:
        """Extend metadata of whole sequences, each request's span over all of it."""
        if self._reads_engine_table:
            table = self.req_to_token
        else:
            snapshot = self.req_to_token.index_select(0, req_pool_indices).to(torch.int32)
            rows = to_device(req_pool_indices, self.device)
            self._req_to_token_dev[rows] = to_device(snapshot, self.device)
            table = self._req_to_token_dev
        prefix_lens = torch.zeros_like(seq_lens)
        return AttentionMetadata.build(
            is_decode=False,
            req_to_token=table,
            req_pool_indices=req_pool_indices,
            prefix_lens=prefix_lens,
            extend_lens=seq_lens,
            out_cache_loc=out_cache_loc,
            device=self.device,
            backend=self.backend,
            image_spans=torch.stack([prefix_lens, seq_lens], dim=1),
            check_values=False,  # check_batch checked every slot, row and length
        )
