"""Checks a ``ForwardBatch`` and works out, on the host, what its forward pass needs.

All index tensors of a batch are CPU tensors, so every check here is cheap and runs before
anything is launched: a bad slot, row, length or token fails with the request's id instead
of corrupting another request's KV.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch

from vla_sched.core.forward_batch import FUTURE_TOKEN_ID, ForwardBatch, ImageInput


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
    ids are in the vocabulary (or ``FUTURE_TOKEN_ID``). The slot table and the batch are
    host tensors, read here as numpy arrays (the same memory): per-request lengths as
    lists, slots and ids by a handful of array ops whatever the batch size, each a range
    test first, the offending entry looked up only when it fails.
    """
    batch.check()
    if not batch.batch_size:
        return
    num_rows, max_context_len = req_to_token.shape
    row_list, prefix_list = batch.req_pool_indices.tolist(), batch.prefix_lens.tolist()
    extend_list, seq_list = batch.extend_lens.tolist(), batch.seq_lens.tolist()
    if min(row_list) < 0 or max(row_list) >= num_rows:
        i = next(i for i, row in enumerate(row_list) if not 0 <= row < num_rows)
        raise IndexError(
            f'request {batch.rids[i]}: req_pool_index {row_list[i]} outside [0, {num_rows})'
        )
    max_seq = max(seq_list)
    if min(prefix_list) < 0 or min(extend_list) < 1 or max_seq > max_context_len:
        i = next(
            i
            for i, (p, e, s) in enumerate(zip(prefix_list, extend_list, seq_list, strict=True))
            if p < 0 or e < 1 or s > max_context_len
        )
        raise ValueError(
            f'request {batch.rids[i]}: prefix_len {prefix_list[i]}, seq_len {seq_list[i]} are '
            f'not a non-empty extend inside the slot table of {max_context_len} positions'
        )
    rows = batch.req_pool_indices.numpy()
    table = req_to_token.cpu().numpy()[rows, :max_seq]  # the engine's table: on the host
    unused = None  # positions past a request's length: they may hold anything
    used = table
    if min(seq_list) != max_seq:
        unused = np.arange(max_seq)[None, :] >= batch.seq_lens.numpy()[:, None]
        used = np.where(unused, 0, table)
    if used.min() < 0 or used.max() >= num_kv_slots:
        _raise_bad_slot(batch, table, unused, num_kv_slots)
    loc = batch.out_cache_loc.numpy()
    num_tokens = batch.num_tokens
    prefix = batch.prefix_lens.numpy()
    if num_tokens == batch.batch_size:  # one token per request, at its prefix length
        listed = table[np.arange(num_tokens), prefix]
    else:
        extend = batch.extend_lens.numpy()
        token_req = np.repeat(np.arange(batch.batch_size), extend)
        starts = np.cumsum(extend) - extend
        positions = np.arange(num_tokens) - starts[token_req] + prefix[token_req]
        listed = table[token_req, positions]
    mismatch = listed != loc
    if mismatch.any():
        i = _request_of_token(extend_list, int(np.flatnonzero(mismatch)[0]))
        raise ValueError(
            f'request {batch.rids[i]}: out_cache_loc does not match '
            f'req_to_token[{row_list[i]}, {prefix_list[i]}:{seq_list[i]}]'
        )
    if num_tokens > 1 and np.unique(loc).size != num_tokens:
        raise ValueError('out_cache_loc writes one KV slot twice in this batch')
    ids = batch.input_ids.numpy()
    if ids.min() < FUTURE_TOKEN_ID or ids.max() >= vocab_size:
        t = int(np.flatnonzero((ids < FUTURE_TOKEN_ID) | (ids >= vocab_size))[0])
        raise ValueError(
            f'request {batch.rids[_request_of_token(extend_list, t)]}: input id '
            f'{int(ids[t])} outside [0, {vocab_size})'
        )


def _raise_bad_slot(
    batch: ForwardBatch, table: np.ndarray, unused: np.ndarray | None, num_kv_slots: int
) -> None:
    bad_slot = (table < 0) | (table >= num_kv_slots)
    if unused is not None:
        bad_slot &= ~unused
    i, pos = (int(x) for x in np.argwhere(bad_slot)[0])
    raise IndexError(
        f'request {batch.rids[i]}: req_to_token[{int(batch.req_pool_indices[i])}, {pos}] = '
        f'{int(table[i, pos])} is outside the KV cache [0, {num_kv_slots})'
    )


def _request_of_token(extend_lens: list[int], token: int) -> int:
    """The request whose new tokens include packed row ``token``."""
    for i, end in enumerate(accumulate(extend_lens)):
        if token < end:
            return i
    raise IndexError(f'token {token} is past the batch')


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
    prefix_list, seq_list = batch.prefix_lens.tolist(), batch.seq_lens.tolist()
    for i, rid in enumerate(batch.rids):
        prefix_len, seq_len = prefix_list[i], seq_list[i]
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
    ends = accumulate(batch.extend_lens.tolist())
    seq_list = batch.seq_lens.tolist()
    rows = [end - 1 for end, sample in zip(ends, batch.sample, strict=True) if sample]
    positions = [seq for seq, sample in zip(seq_list, batch.sample, strict=True) if sample]
    return torch.tensor(rows, dtype=torch.int64), positions
