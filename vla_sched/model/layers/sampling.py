"""Next-token choice constrained to each request's allowed token range.

Greedy (``temperature == 0``) is an argmax over ``[allowed_token_start, allowed_token_end)``.
Otherwise a token is drawn from the tempered softmax over that range with the Gumbel-max
trick, using a generator seeded from the request's seed and the position being sampled, so
a request draws the same tokens on every run and every device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vla_sched.core.forward_batch import SamplingParams
from vla_sched.model.layers.transfer import to_device

_SEED_STRIDE = 1_000_003  # mixes (seed, position) into one generator seed


def allowed_token_mask(
    params: Sequence[SamplingParams], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """``[N, vocab_size]`` bool: which tokens each row may produce."""
    starts = to_device(torch.tensor([p.allowed_token_start for p in params]), device)
    ends = to_device(torch.tensor([p.allowed_token_end for p in params]), device)
    token = torch.arange(vocab_size, device=device)
    return (token[None, :] >= starts[:, None]) & (token[None, :] < ends[:, None])


def check_sampling_params(
    params: Sequence[SamplingParams], rids: Sequence[str], vocab_size: int
) -> None:
    """Raise ValueError naming the request whose allowed range exceeds the vocabulary."""
    for rid, p in zip(rids, params, strict=True):
        if p.allowed_token_end > vocab_size:
            raise ValueError(
                f'request {rid}: allowed tokens [{p.allowed_token_start}, '
                f'{p.allowed_token_end}) exceed the model vocabulary of {vocab_size}'
            )


def sample_next_tokens(
    logits: torch.Tensor, params: Sequence[SamplingParams], positions: Sequence[int]
) -> torch.Tensor:
    """Pick one token per row of ``logits [N, V]`` (float32), on the logits' device.

    Args:
        logits: Scores of the rows that sample.
        params: Sampling parameters per row.
        positions: Position of the token being sampled per row (seeds the generator).

    Returns:
        int64 ``[N]`` token ids, each inside its row's allowed range.
    """
    num_rows, vocab_size = logits.shape
    if len(params) != num_rows or len(positions) != num_rows:
        raise ValueError('one sampling entry and one position per logits row are needed')
    if num_rows == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    start, end = params[0].allowed_token_start, params[0].allowed_token_end
    if all(
        p.temperature == 0.0 and p.allowed_token_start == start and p.allowed_token_end == end
        for p in params
    ):
        # All greedy over one range (the usual VLA step): an argmax over that slice.
        return torch.argmax(logits[:, start:end], dim=-1) + start
    allowed = allowed_token_mask(params, vocab_size, logits.device)
    masked = logits.float().masked_fill(~allowed, float('-inf'))
    tokens = torch.argmax(masked, dim=-1)
    for row, p in enumerate(params):
        if p.temperature > 0.0:
            tokens[row] = _gumbel_sample(masked[row], p, positions[row])
    return tokens


def _gumbel_sample(scores: torch.Tensor, params: SamplingParams, position: int) -> torch.Tensor:
    generator = torch.Generator(device=scores.device)
    generator.manual_seed((params.seed * _SEED_STRIDE + position) % (2**63))
    uniform = torch.rand(scores.shape, generator=generator, device=scores.device)
    gumbel = -torch.log(-torch.log(uniform.clamp_(1e-20, 1.0 - 1e-7)))
    return torch.argmax(scores / params.temperature + gumbel)
