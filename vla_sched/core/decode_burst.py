"""A decode burst (``k`` decode steps in one ``ForwardBatch``) as its single steps.

Runners execute a burst step by step: step ``j`` decodes position ``prefix_lens + j``
into the ``j``-th of each request's slots; its input ids are the burst's first ids, then
``FUTURE_TOKEN_ID`` (the token the step before sampled). See ``forward_batch``.
"""

from __future__ import annotations

import torch

from vla_sched.core.forward_batch import ForwardBatch, ForwardMode


def burst_steps(batch: ForwardBatch) -> list[ForwardBatch]:
    """A decode burst of ``k`` steps as its ``k`` single decode steps, in order."""
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
                noise=batch.noise,
                guidance=batch.guidance,
                denoise_passes=tuple(None if k is None else k + j for k in batch.denoise_passes),
            )
        )
    return steps
