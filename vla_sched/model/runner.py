"""The model runner: executes the scheduler's ``ForwardBatch`` on paged KV and samples.

The runner owns the per-layer KV buffers (``[num_kv_slots, num_kv_heads, head_dim]``) and a
device copy of the engine's slot table; it copies the batch's rows of ``req_to_token`` at
each launch. Images are encoded once per content hash (a small LRU) and the rows a chunk
covers replace its image placeholder tokens.

For the overlap loop, ``launch`` returns at once on a GPU (results are copied back on the
side and ``result()`` waits for them), and an input id of ``-1`` stands for the token the
runner last sampled for that request row, so decode step k+1 can launch before the host has
seen step k's tokens. A decode burst runs its ``k`` steps back to back the same way, each
step's input the token the step before sampled on the device, and copies all ``k x B``
tokens back once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from vla_sched.engine.forward_batch import (
    FUTURE_TOKEN_ID,
    ForwardBatch,
    ForwardMode,
    ForwardOutput,
)
from vla_sched.model.attention import AttentionMetadata
from vla_sched.model.decode_graphs import DecodeGraphs
from vla_sched.model.prefill_graphs import PrefillGraphs, max_padding
from vla_sched.model.sampling import check_sampling_params, sample_next_tokens
from vla_sched.model.step_inputs import (
    ImageRows,
    check_batch,
    image_rows,
    image_spans,
    logit_rows,
)
from vla_sched.model.transfer import to_device
from vla_sched.model.vision import FeatureCache, preprocess_image
from vla_sched.model.vision_graphs import VisionGraphs
from vla_sched.model.vla_model import VLAModel

logger = logging.getLogger(__name__)
_Padded = TypeVar('_Padded', PrefillGraphs, VisionGraphs)


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    """How the runner executes steps.

    Attributes:
        backend: Kernel backend: ``auto`` (Triton on CUDA, torch references elsewhere),
            ``triton`` or ``torch``.
        feature_cache_size: Images whose projected features are kept (by content hash).
        bidirectional_image_spans: Let image tokens see each other (prefix-LM models); LLaVA
            checkpoints are causal, so off by default.
        cuda_graphs: Capture decode steps, prefills and the vision encoder as CUDA graphs
            (GPU only).
        decode_batch_sizes: Padded decode batch sizes for the persistent-buffer path.
        padded_decode: Run decode through the padded persistent-buffer path even without
            graphs (on by itself whenever ``cuda_graphs`` is).
        vision_batch_sizes: Padded image counts of the vision encoder's persistent-buffer
            path; more new images in one step run eagerly.
        padded_vision: Run the vision encoder through that path even without graphs (on by
            itself whenever ``cuda_graphs`` is).
        prefill_token_counts: Padded token counts of the prefill persistent-buffer path;
            longer prefills (and prefills of more than ``prefill_max_requests`` requests, or
            with bidirectional image spans) run eagerly.
        prefill_max_requests: Most requests of a prefill on that path.
        padded_prefill: Run prefills through that path even without graphs (on by itself
            whenever ``cuda_graphs`` is).
        max_kv_splits: Split bound of the Triton decode kernel.
    """

    backend: str = 'auto'
    feature_cache_size: int = 64
    bidirectional_image_spans: bool = False
    cuda_graphs: bool = False
    decode_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    padded_decode: bool = False
    vision_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    padded_vision: bool = False
    prefill_token_counts: tuple[int, ...] = (
        *range(64, 513, 64),
        *range(640, 1025, 128),
        *range(1280, 2049, 256),
    )
    prefill_max_requests: int = 16
    padded_prefill: bool = False
    max_kv_splits: int = 8

    def __post_init__(self) -> None:
        if self.backend not in ('auto', 'triton', 'torch'):
            raise ValueError(f'unknown backend {self.backend!r}')
        if self.feature_cache_size < 1:
            raise ValueError('feature_cache_size must be >= 1')
        if not self.decode_batch_sizes or min(self.decode_batch_sizes) < 1:
            raise ValueError(f'bad decode_batch_sizes {self.decode_batch_sizes}')
        if not self.vision_batch_sizes or min(self.vision_batch_sizes) < 1:
            raise ValueError(f'bad vision_batch_sizes {self.vision_batch_sizes}')
        if not self.prefill_token_counts or min(self.prefill_token_counts) < 1:
            raise ValueError(f'bad prefill_token_counts {self.prefill_token_counts}')
        if self.prefill_max_requests < 1:
            raise ValueError('prefill_max_requests must be >= 1')
        if self.max_kv_splits < 1:
            raise ValueError('max_kv_splits must be >= 1')


class LaunchedStep:
    """A launched step's sampled tokens (``[B]``, or ``[B, k]`` for a decode burst);
    ``result()`` waits for the device if needed."""

    def __init__(
        self,
        tokens: torch.Tensor,
        sample: Sequence[bool],
        event: torch.cuda.Event | None = None,
    ) -> None:
        self._tokens = tokens
        self._sample = tuple(sample)
        self._event = event
        self._output: ForwardOutput | None = None

    def result(self) -> ForwardOutput:
        if self._output is None:
            if self._event is not None:
                self._event.synchronize()
            if self._tokens.dim() == 2:
                rows = tuple(tuple(row) for row in self._tokens.tolist())
                last = tuple(row[-1] for row in rows)
                self._output = ForwardOutput(next_token_ids=last, burst_token_ids=rows)
                return self._output
            values = iter(self._tokens.tolist())
            ids = tuple(next(values) if s else -1 for s in self._sample)
            self._output = ForwardOutput(next_token_ids=ids)
        return self._output


class ModelRunner:
    """Runs ``ForwardBatch`` steps of one model on the runner's paged KV cache.

    Args:
        model: The loaded model.
        req_to_token: The engine's slot table ``int32 [num_req_slots, max_context_len]``
            (the scheduler fills a request's row before launching it).
        num_kv_slots: KV capacity in tokens (slot ids the engine may hand out).
        config: Execution options.
    """

    def __init__(
        self,
        model: VLAModel,
        *,
        req_to_token: torch.Tensor,
        num_kv_slots: int,
        config: RunnerConfig | None = None,
    ) -> None:
        config = config if config is not None else RunnerConfig()
        if req_to_token.dim() != 2 or req_to_token.dtype not in (torch.int32, torch.int64):
            raise ValueError('req_to_token must be an int32 [num_req_slots, max_context_len]')
        if num_kv_slots < 1:
            raise ValueError(f'num_kv_slots must be >= 1, got {num_kv_slots}')
        if config.cuda_graphs and model.device.type != 'cuda':
            raise ValueError('CUDA graphs need the model on a CUDA device')
        self.model = model
        self.config = config
        self.device = model.device
        self.req_to_token = req_to_token
        self.num_kv_slots = num_kv_slots
        num_rows, max_context_len = req_to_token.shape
        padded = config.cuda_graphs or config.padded_decode
        prefill_padded = config.cuda_graphs or config.padded_prefill
        # Reserved KV slots past the engine's: one per decode padding row, then one per
        # prefill padding token.
        num_decode_pad = max(config.decode_batch_sizes) if padded or prefill_padded else 0
        num_prefill_pad = max_padding(config.prefill_token_counts) if prefill_padded else 0
        num_pad_slots = num_decode_pad + num_prefill_pad
        self.kv_caches = model.decoder.allocate_kv_cache(num_kv_slots + num_pad_slots)
        self._req_to_token_dev = torch.zeros(
            num_rows + 1, max_context_len, dtype=torch.int32, device=self.device
        )
        self._last_tokens = torch.zeros(num_rows, dtype=torch.int64, device=self.device)
        self.feature_cache = FeatureCache(config.feature_cache_size)
        self.decode_graphs = None
        if padded:
            self.decode_graphs = DecodeGraphs(
                model,
                self.kv_caches,
                self._req_to_token_dev,
                batch_sizes=config.decode_batch_sizes,
                dummy_row=num_rows,
                dummy_slots=num_kv_slots,
                capture=config.cuda_graphs,
                use_triton=config.cuda_graphs or config.backend == 'triton',
                max_kv_splits=config.max_kv_splits,
                backend=config.backend,
            )
        self.prefill_graphs = None
        if prefill_padded:
            self.prefill_graphs = self._prepare_prefill_graphs(
                dummy_row=num_rows, first_pad_slot=num_kv_slots + num_decode_pad
            )
        self.vision_graphs = self._prepare_vision_graphs()

    def _prepare_prefill_graphs(
        self, *, dummy_row: int, first_pad_slot: int
    ) -> PrefillGraphs | None:
        config = self.config

        def build(capture: bool) -> PrefillGraphs:
            return PrefillGraphs(
                self.model.decoder,
                self.kv_caches,
                self._req_to_token_dev,
                token_counts=config.prefill_token_counts,
                max_requests=config.prefill_max_requests,
                dummy_row=dummy_row,
                first_pad_slot=first_pad_slot,
                capture=capture,
                backend=config.backend,
            )

        return self._captured_or_eager(build, 'prefill')

    def _prepare_vision_graphs(self) -> VisionGraphs | None:
        config = self.config
        vision = self.model.vision
        if vision is None or not (config.cuda_graphs or config.padded_vision):
            return None
        prep = self.model.spec.preprocessing
        shape = (len(prep.mean), prep.image_size, prep.image_size)

        def build(capture: bool) -> VisionGraphs:
            return VisionGraphs(
                vision,
                pixel_shape=shape,
                batch_sizes=config.vision_batch_sizes,
                device=self.device,
                output_dtype=self.model.dtype,
                capture=capture,
            )

        return self._captured_or_eager(build, 'vision encoder')

    def _captured_or_eager(self, build: Callable[[bool], _Padded], what: str) -> _Padded | None:
        """The padded path, captured when ``cuda_graphs`` is on; None (eager) when an op of
        ``what`` cannot be captured."""
        if not self.config.cuda_graphs:
            return build(False)
        try:
            return build(True)
        except RuntimeError as exc:
            logger.warning('%s not captured, it runs eagerly: %s', what, exc)
            return None

    @property
    def vocab_size(self) -> int:
        return self.model.spec.decoder.vocab_size

    def launch(self, batch: ForwardBatch) -> LaunchedStep:
        """Run one step and sample each request's next token (``-1`` where not sampling)."""
        if batch.forward_mode is ForwardMode.IDLE or batch.batch_size == 0:
            return LaunchedStep(torch.empty(0, dtype=torch.int64), [False] * batch.batch_size)
        check_sampling_params(batch.sampling, batch.rids, self.vocab_size)
        with torch.inference_mode():
            if batch.num_decode_steps > 1:
                # The burst's slots and rows are checked and copied once, for all its steps.
                self._check_and_copy_rows(batch)
                steps = [self._sample_step(s, prepared=True) for s in burst_steps(batch)]
                return self._handle(torch.stack(steps, dim=1), batch.sample)
            return self._handle(self._sample_step(batch), batch.sample)

    def _sample_step(self, batch: ForwardBatch, *, prepared: bool = False) -> torch.Tensor:
        """Run one step and sample; the tokens stay on the device (``[num sampled]``)."""
        rows, positions = logit_rows(batch)
        logits = self._forward(batch, rows=rows, prepared=prepared)
        params = [p for p, s in zip(batch.sampling, batch.sample, strict=True) if s]
        tokens = sample_next_tokens(logits, params, positions)
        sampled = [i for i in range(batch.batch_size) if batch.sample[i]]
        if sampled:
            pool_rows = to_device(batch.req_pool_indices[sampled], self.device)
            self._last_tokens[pool_rows] = tokens
        return tokens

    def forward_logits(self, batch: ForwardBatch) -> torch.Tensor:
        """Float32 logits of every new token ``[num_tokens, vocab]`` (tests, scoring).

        Writes the batch's KV exactly as ``launch`` does, but samples nothing.
        """
        with torch.inference_mode():
            return self._forward(batch, rows=None)

    def _handle(self, tokens: torch.Tensor, sample: Sequence[bool]) -> LaunchedStep:
        if self.device.type != 'cuda':
            return LaunchedStep(tokens, sample)
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return LaunchedStep(host, sample, event)

    def _check_and_copy_rows(self, batch: ForwardBatch) -> torch.Tensor:
        """Check the batch against the slot table and copy its rows to the device; returns
        the rows' device indices."""
        check_batch(
            batch,
            req_to_token=self.req_to_token,
            num_kv_slots=self.num_kv_slots,
            vocab_size=self.vocab_size,
        )
        pool_rows = batch.req_pool_indices
        snapshot = self.req_to_token.index_select(0, pool_rows).to(torch.int32)
        pool_rows_dev = to_device(pool_rows, self.device)
        self._req_to_token_dev[pool_rows_dev] = to_device(snapshot, self.device)
        return pool_rows_dev

    def _forward(
        self, batch: ForwardBatch, *, rows: torch.Tensor | None, prepared: bool = False
    ) -> torch.Tensor:
        """Logits of ``rows`` (all new tokens for None); ``prepared``: the batch's rows were
        checked and copied already (a burst's later steps)."""
        if prepared:
            pool_rows_dev = to_device(batch.req_pool_indices, self.device)
        else:
            pool_rows_dev = self._check_and_copy_rows(batch)
        spec = self.model.spec
        images = image_rows(
            batch, image_token_id=spec.image_token_id, num_image_tokens=spec.num_image_tokens
        )
        input_ids = self._resolve_input_ids(batch, pool_rows_dev)
        graphs = self.decode_graphs
        use_graphs = (
            rows is not None
            and batch.forward_mode is ForwardMode.DECODE
            and graphs is not None
            and graphs.padded_size(batch.batch_size) is not None
        )
        if use_graphs:
            logits = graphs.run(
                input_ids=input_ids,
                req_pool_indices=pool_rows_dev,
                seq_lens=to_device(batch.seq_lens, self.device),
                out_cache_loc=to_device(batch.out_cache_loc, self.device),
            )
            sample_rows = torch.tensor(
                [i for i in range(batch.batch_size) if batch.sample[i]], dtype=torch.int64
            )
            return logits[to_device(sample_rows, self.device)]
        embeds = self._embed(input_ids, images)
        prefill = self.prefill_graphs
        use_prefill_graphs = (
            batch.forward_mode is ForwardMode.EXTEND
            and prefill is not None
            and not self.config.bidirectional_image_spans
            and prefill.padded_size(batch.num_tokens, batch.batch_size) is not None
        )
        if use_prefill_graphs:
            hidden = prefill.run(
                embeds=embeds,
                out_cache_loc=batch.out_cache_loc,
                req_pool_indices=batch.req_pool_indices,
                prefix_lens=batch.prefix_lens,
                extend_lens=batch.extend_lens,
            )
        else:
            hidden = self.model.decoder(embeds, self._metadata(batch), self.kv_caches)
        if rows is not None:
            hidden = hidden[to_device(rows, self.device)]
        return self.model.decoder.logits(hidden)

    def _resolve_input_ids(self, batch: ForwardBatch, pool_rows_dev: torch.Tensor) -> torch.Tensor:
        ids = to_device(batch.input_ids, self.device)
        if not bool((batch.input_ids == FUTURE_TOKEN_ID).any()):
            return ids
        token_rows = torch.repeat_interleave(
            pool_rows_dev, to_device(batch.extend_lens, self.device), output_size=batch.num_tokens
        )
        return torch.where(ids == FUTURE_TOKEN_ID, self._last_tokens[token_rows], ids)

    def _metadata(self, batch: ForwardBatch) -> AttentionMetadata:
        spans = None
        if self.config.bidirectional_image_spans:
            spans = image_spans(batch)
        return AttentionMetadata.build(
            is_decode=batch.forward_mode is ForwardMode.DECODE,
            req_to_token=self._req_to_token_dev,
            req_pool_indices=batch.req_pool_indices,
            prefix_lens=batch.prefix_lens,
            extend_lens=batch.extend_lens,
            out_cache_loc=batch.out_cache_loc,
            device=self.device,
            backend=self.config.backend,
            image_spans=spans,
            check_values=False,  # check_batch checked every slot, row and length
        )

    def _embed(self, input_ids: torch.Tensor, images: list[ImageRows]) -> torch.Tensor:
        embeds = self.model.decoder.embed(input_ids)
        if not images:
            return embeds
        features = self._image_features(images)
        for r in images:
            count = r.feature_end - r.feature_start
            rows = features[r.image.content_hash][r.feature_start : r.feature_end]
            embeds[r.token_row : r.token_row + count] = rows
        return embeds

    def _image_features(self, images: Sequence[ImageRows]) -> dict[int, torch.Tensor]:
        """Projected features per content hash, encoding the images not yet cached."""
        features: dict[int, torch.Tensor] = {}
        pending: dict[int, torch.Tensor] = {}
        prep = self.model.spec.preprocessing
        for r in images:
            content_hash = r.image.content_hash
            if content_hash in features or content_hash in pending:
                continue
            cached = self.feature_cache.get(content_hash)
            if cached is not None:
                features[content_hash] = cached
                continue
            try:
                pending[content_hash] = preprocess_image(r.image.pixels, prep, device=self.device)
            except ValueError as exc:
                raise ValueError(f'request {r.rid}, image {content_hash}: {exc}') from None
        if pending:
            pixels = torch.stack(list(pending.values()))
            encoded = self._encode(pixels)
            for content_hash, rows in zip(pending, encoded, strict=True):
                features[content_hash] = rows
                self.feature_cache.put(content_hash, rows)
        return features

    def _encode(self, pixels: torch.Tensor) -> torch.Tensor:
        graphs = self.vision_graphs
        if graphs is not None and graphs.padded_size(pixels.shape[0]) is not None:
            return graphs.encode(pixels)
        return self.model.encode_images(pixels)


def burst_steps(batch: ForwardBatch) -> list[ForwardBatch]:
    """A decode burst of ``k`` steps as its ``k`` single decode steps, in order.

    Step ``j`` decodes position ``prefix_lens + j`` into the ``j``-th of each request's
    slots; its input ids are the burst's first ids, then ``FUTURE_TOKEN_ID`` (the token the
    step before sampled).
    """
    num_steps, size = batch.num_decode_steps, batch.batch_size
    ids = batch.input_ids.view(size, num_steps)
    slots = batch.out_cache_loc.view(size, num_steps)
    ones = torch.ones(size, dtype=torch.int64)
    steps = []
    for j in range(num_steps):
        prefix = batch.prefix_lens + j
        steps.append(
            ForwardBatch(
                forward_mode=ForwardMode.DECODE,
                rids=batch.rids,
                req_pool_indices=batch.req_pool_indices,
                prefix_lens=prefix,
                extend_lens=ones,
                seq_lens=prefix + 1,
                input_ids=ids[:, j].contiguous(),
                out_cache_loc=slots[:, j].contiguous(),
                sample=batch.sample,
                sampling=batch.sampling,
                images=batch.images,
            )
        )
    return steps
