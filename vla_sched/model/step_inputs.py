"""Checks a ``ForwardBatch`` and works out, on the host, what its forward pass needs.

All index tensors of a batch are CPU tensors, so every check here is cheap and runs before
anything is launched: a bad slot, row, length or token fails with the request's id instead
of corrupting another request's KV.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vla_sched.engine.forward_batch import FUTURE_TOKEN_ID, ForwardBatch, ImageInput


@dataclass(frozen=True, slots=True)
class ImageRows:
    """Rows of one image's features that a step's chunk covers.

    ``feature_start:feature_end`` of the image's features go to rows
    ``token_row:token_row + (feature_end - feature_start)`` of the step's packed tokens.
    """

    rid: str
    image: ImageInput
    feature_start: int
    feature_end: int
    token_row: int


def check_batch(
    batch: ForwardBatch,
    *,
    req_to_token: torch.Tensor,
    num_kv_slots: int,
    vocab_size: int,
) -> None:
    """Raise ValueError/IndexError naming the request if the batch is inconsistent.

    Checks rows, lengths and slots against the slot table and the KV capacity, that the
    new tokens' slots are the ones the slot table lists for their positions, and that token
    ids are in the vocabulary (or ``FUTURE_TOKEN_ID``). Vectorized: a handful of tensor ops
    whatever the batch size.
    """
    batch.check()
    num_rows, max_context_len = req_to_token.shape
    rows, prefix, seq = batch.req_pool_indices, batch.prefix_lens, batch.seq_lens
    bad_row = (rows < 0) | (rows >= num_rows)
    if bool(bad_row.any()):
        i = int(bad_row.nonzero()[0, 0])
        raise IndexError(
            f'request {batch.rids[i]}: req_pool_index {int(rows[i])} outside [0, {num_rows})'
        )
    bad_len = (prefix < 0) | (batch.extend_lens < 1) | (seq > max_context_len)
    if bool(bad_len.any()):
        i = int(bad_len.nonzero()[0, 0])
        raise ValueError(
            f'request {batch.rids[i]}: prefix_len {int(prefix[i])}, seq_len {int(seq[i])} are '
            f'not a non-empty extend inside the slot table of {max_context_len} positions'
        )
    table = req_to_token[rows, : int(seq.max())].to(torch.int64)
    in_use = torch.arange(table.shape[1])[None, :] < seq[:, None]
    bad_slot = in_use & ((table < 0) | (table >= num_kv_slots))
    if bool(bad_slot.any()):
        i, pos = (int(x) for x in bad_slot.nonzero()[0])
        raise IndexError(
            f'request {batch.rids[i]}: req_to_token[{int(rows[i])}, {pos}] = '
            f'{int(table[i, pos])} is outside the KV cache [0, {num_kv_slots})'
        )
    token_req = torch.repeat_interleave(torch.arange(batch.batch_size), batch.extend_lens)
    starts = torch.cumsum(batch.extend_lens, 0) - batch.extend_lens
    positions = torch.arange(batch.num_tokens) - starts[token_req] + prefix[token_req]
    mismatch = table[token_req, positions] != batch.out_cache_loc
    if bool(mismatch.any()):
        i = int(token_req[mismatch.nonzero()[0, 0]])
        raise ValueError(
            f'request {batch.rids[i]}: out_cache_loc does not match '
            f'req_to_token[{int(rows[i])}, {int(prefix[i])}:{int(seq[i])}]'
        )
    loc = batch.out_cache_loc
    if loc.numel() and torch.unique(loc).numel() != loc.numel():
        raise ValueError('out_cache_loc writes one KV slot twice in this batch')
    ids = batch.input_ids
    bad_ids = (ids < FUTURE_TOKEN_ID) | (ids >= vocab_size)
    if bool(bad_ids.any()):
        t = int(bad_ids.nonzero()[0, 0])
        raise ValueError(
            f'request {batch.rids[int(token_req[t])]}: input id {int(ids[t])} outside '
            f'[0, {vocab_size})'
        )


def image_rows(
    batch: ForwardBatch, *, image_token_id: int | None, num_image_tokens: int = 0
) -> list[ImageRows]:
    """Which image feature rows each request's chunk needs, with placeholder checks.

    Args:
        batch: The step.
        image_token_id: The placeholder token (None: the model has no vision tower).
        num_image_tokens: Feature rows the vision encoder makes per image; every image span
            must have exactly that many tokens.

    Raises:
        ValueError: for an image span outside the request's prompt or of another length
            than the image's features, or a chunk position inside an image span whose
            token is not the image placeholder token.
    """
    found = []
    token_start = 0
    for i, rid in enumerate(batch.rids):
        prefix_len, seq_len = int(batch.prefix_lens[i]), int(batch.seq_lens[i])
        for image in batch.images[i]:
            if image.num_tokens < 1 or image.token_offset < 0:
                raise ValueError(f'request {rid}: empty or negative image span of {image}')
            if image_token_id is not None and image.num_tokens != num_image_tokens:
                raise ValueError(
                    f'request {rid}: the span of image {image.content_hash} at tokens '
                    f'{image.token_offset}..{image.token_end - 1} holds {image.num_tokens} '
                    f'tokens, but the model makes {num_image_tokens} image features per image'
                )
            low, high = max(image.token_offset, prefix_len), min(image.token_end, seq_len)
            if low >= high:
                continue
            if image_token_id is None:
                raise ValueError(f'request {rid} has an image but the model has no vision tower')
            row = token_start + low - prefix_len
            ids = batch.input_ids[row : row + high - low]
            if bool((ids != image_token_id).any()):
                raise ValueError(
                    f'request {rid}: positions {low}..{high - 1} lie in the image span of '
                    f'image {image.content_hash} but do not hold the image token {image_token_id}'
                )
            found.append(
                ImageRows(
                    rid=rid,
                    image=image,
                    feature_start=low - image.token_offset,
                    feature_end=high - image.token_offset,
                    token_row=row,
                )
            )
        token_start += seq_len - prefix_len
    return found


def image_spans(batch: ForwardBatch) -> torch.Tensor:
    """``[B, 2]`` absolute ``[start, end)`` of each request's (first) image span."""
    spans = torch.zeros(batch.batch_size, 2, dtype=torch.int64)
    for i, images in enumerate(batch.images):
        if len(images) > 1:
            raise ValueError(
                f'request {batch.rids[i]}: bidirectional image spans support one image per '
                f'request, got {len(images)}'
            )
        if images:
            spans[i, 0], spans[i, 1] = images[0].token_offset, images[0].token_end
    return spans


def logit_rows(batch: ForwardBatch) -> tuple[torch.Tensor, list[int]]:
    """Packed rows of the last new token of each sampling request, and their positions."""
    ends = torch.cumsum(batch.extend_lens, 0) - 1
    rows = [int(ends[i]) for i in range(batch.batch_size) if batch.sample[i]]
    positions = [int(batch.seq_lens[i]) for i in range(batch.batch_size) if batch.sample[i]]
    return torch.tensor(rows, dtype=torch.int64), positions
