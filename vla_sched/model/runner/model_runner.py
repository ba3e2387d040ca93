"""The model runner: executes the scheduler's ``ForwardBatch`` on paged KV and samples.

The runner owns the per-layer KV buffers (``[num_kv_slots, num_kv_heads, head_dim]``) and a
device copy of the engine's slot table; it copies the batch's rows of ``req_to_token`` at
each launch (on the CPU without padded paths a step ends inside ``launch``, so it reads
the engine's table in place). Images are encoded once per content hash (a small LRU) and
the rows a chunk covers replace its image placeholder tokens. ``RunnerConfig`` lives in
``config`` and the padded paths in ``padded_paths`` (on the ``graph_runner`` base; their
real and padding work is counted in ``padding_stats``).

For the overlap loop, ``launch`` returns at once on a GPU (results are copied back on the
side and ``result()`` waits for them), and an input id of ``-1`` stands for the token the
runner last sampled for that request row, so decode step k+1 can launch before the host has
seen step k's tokens. A decode burst runs its ``k`` steps back to back the same way, each
step's input the token the step before sampled on the device, and copies all ``k x B``
tokens back once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vla_sched.core.decode_burst import burst_steps
from vla_sched.core.forward_batch import (
    FUTURE_TOKEN_ID,
    ForwardBatch,
    ForwardMode,
    ForwardOutput,
)
from vla_sched.model.layers.attention import AttentionMetadata
from vla_sched.model.layers.sampling import check_sampling_params, sample_next_tokens
from vla_sched.model.layers.transfer import to_device
from vla_sched.model.layers.vision import FeatureCache
from vla_sched.model.loading.vla_model import VLAModel
from vla_sched.model.runner.config import RunnerConfig
from vla_sched.model.runner.padded_paths import PaddingSlots, build_padded_paths
from vla_sched.model.runner.padding_stats import PATH_UNITS, PaddingCounter, PaddingStats
from vla_sched.model.runner.step_inputs import (
    ImageRows,
    check_batch,
    image_rows,
    image_spans,
    logit_rows,
)


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
        slots = PaddingSlots.for_config(config, num_kv_slots=num_kv_slots)
        self.kv_caches = model.decoder.allocate_kv_cache(num_kv_slots + slots.num_slots)
        self._req_to_token_dev = torch.zeros(
            num_rows + 1, max_context_len, dtype=torch.int32, device=self.device
        )
        self._last_tokens = torch.zeros(num_rows, dtype=torch.int64, device=self.device)
        self.feature_cache = FeatureCache(config.feature_cache_size)
        self._padding = {path: PaddingCounter() for path in PATH_UNITS}
        paths = build_padded_paths(
            model,
            config,
            self.kv_caches,
            self._req_to_token_dev,
            dummy_row=num_rows,
            slots=slots,
            counters=self._padding,
        )
        self.decode_graphs = paths.decode
        self.prefill_graphs = paths.prefill
        self.vision_graphs = paths.vision
        self._rope = model.decoder.rope_tables(max_context_len)  # looked up by the eager path
        # On the CPU, without padded paths, a step runs to its end inside ``launch``: the
        # engine's slot table cannot change under it, so the eager path reads it in place.
        self._reads_engine_table = (
            self.device.type == 'cpu'
            and self.decode_graphs is None
            and self.prefill_graphs is None
            and req_to_token.dtype == torch.int32
            and req_to_token.is_contiguous()
        )

    @property
    def vocab_size(self) -> int:
        return self.model.spec.decoder.vocab_size

    def padding_stats(self) -> dict[str, PaddingStats]:
        """What each path ran since the runner was built: ``'decode'`` (in request rows),
        ``'prefill'`` (tokens) and ``'vision'`` (images), as ``PaddingStats`` (module
        ``padding_stats``). A decode step too large for the decode path runs on the prefill
        path and counts there."""
        return {path: counter.snapshot() for path, counter in self._padding.items()}

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
        if all(batch.sample):
            params, pool_rows = batch.sampling, batch.req_pool_indices
        else:
            params = [p for p, s in zip(batch.sampling, batch.sample, strict=True) if s]
            sampled = [i for i in range(batch.batch_size) if batch.sample[i]]
            pool_rows = batch.req_pool_indices[sampled]
        tokens = sample_next_tokens(logits, params, positions)
        if positions:
            self._last_tokens.index_copy_(0, to_device(pool_rows, self.device), tokens)
        return tokens

    def forward_logits(self, batch: ForwardBatch) -> torch.Tensor:
        """Float32 logits of every new token ``[num_tokens, vocab]`` (tests, scoring).

        Writes the batch's KV exactly as ``launch`` does, but samples nothing.

        Raises:
            ValueError: for a decode burst, whose later inputs are tokens it samples.
        """
        if batch.num_decode_steps > 1:
            raise ValueError(
                f'forward_logits runs single steps; this is a decode burst of '
                f'{batch.num_decode_steps} steps, whose later inputs are sampled tokens'
            )
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
        pool_rows_dev = to_device(pool_rows, self.device)
        if self._reads_engine_table:
            return pool_rows_dev
        snapshot = self.req_to_token.index_select(0, pool_rows).to(torch.int32)
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
        is_decode = batch.forward_mode is ForwardMode.DECODE
        graphs = self.decode_graphs
        use_graphs = (
            rows is not None
            and is_decode
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
        # Every other step runs on the padded prefill path, in pieces when it is large: a
        # prefill, a mixed pass (its running requests' rows extend by one token each) and a
        # decode step the decode path does not take, whose rows are one-token extends too.
        prefill = self.prefill_graphs
        if prefill is not None and not self.config.bidirectional_image_spans:
            hidden = prefill.run(
                embeds=embeds,
                out_cache_loc=batch.out_cache_loc,
                req_pool_indices=batch.req_pool_indices,
                prefix_lens=batch.prefix_lens,
                extend_lens=batch.extend_lens,
            )
        else:
            self._padding['decode' if is_decode else 'prefill'].add_eager(
                batch.batch_size if is_decode else batch.num_tokens
            )
            meta = self._metadata(batch)
            rope = self._rope.at(meta.positions)
            hidden = self.model.decoder(embeds, meta, self.kv_caches, rope=rope)
        if rows is not None and rows.shape[0] != hidden.shape[0]:
            # (as many rows as tokens: every token's row, in order; nothing to select)
            hidden = hidden[to_device(rows, self.device)]
        return self.model.decoder.logits(hidden)

    def _resolve_input_ids(self, batch: ForwardBatch, pool_rows_dev: torch.Tensor) -> torch.Tensor:
        ids = to_device(batch.input_ids, self.device)
        low, high = (int(x) for x in batch.input_ids.aminmax())
        if low != FUTURE_TOKEN_ID:  # no id stands for a sampled token
            return ids
        if batch.num_tokens == batch.batch_size:  # one token per request
            token_rows = pool_rows_dev
        else:
            token_rows = torch.repeat_interleave(
                pool_rows_dev,
                to_device(batch.extend_lens, self.device),
                output_size=batch.num_tokens,
            )
        if high == FUTURE_TOKEN_ID:  # every id does
            return self._last_tokens[token_rows]
        return torch.where(ids == FUTURE_TOKEN_ID, self._last_tokens[token_rows], ids)

    def _metadata(self, batch: ForwardBatch) -> AttentionMetadata:
        spans = None
        if self.config.bidirectional_image_spans:
            spans = image_spans(batch)
        table = self.req_to_token if self._reads_engine_table else self._req_to_token_dev
        return AttentionMetadata.build(
            is_decode=batch.forward_mode is ForwardMode.DECODE,
            req_to_token=table,
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
        return self.feature_cache.features_of(
            ((r.rid, r.image.content_hash, r.image.pixels) for r in images),
            preprocessing=self.model.spec.preprocessing,
            device=self.device,
            encode=self._encode,
        )

    def _encode(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.vision_graphs is not None:
            return self.vision_graphs.encode(pixels)
        self._padding['vision'].add_eager(int(pixels.shape[0]))
        return self.model.encode_images(pixels)
