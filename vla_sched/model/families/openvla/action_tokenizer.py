"""Discrete action tokens: continuous actions <-> token ids, and un-normalization.

OpenVLA's scheme is the default. ``num_bins`` (256) bin edges are spread uniformly over
``[min_action, max_action]`` (``[-1, 1]``); an action is clipped to that range and
``np.digitize`` gives its bin index ``b`` in ``[1, num_bins]``; the token id is
``vocab_end - b``, so the action tokens are ``[vocab_end - num_bins, vocab_end)``. ``vocab_end``
is the tokenizer's unpadded vocabulary size (32000 for Llama 2), never the padded embedding
size. Decoding maps a token back to ``b``, clips ``b - 1`` to ``[0, num_bins - 2]`` and returns
that bin's centre, so there are ``num_bins - 1`` output levels::

    action  -1.0 -> b = 1        -> token vocab_end - 1        -> centre 0   (-1 + 1/255)
    action  +1.0 -> b = num_bins -> token vocab_end - num_bins -> centre 254 (clipped from 255)

Normalized actions are mapped back to robot units with per-dataset 1st/99th percentiles
(``q01``, ``q99``): ``a = 0.5 * (a_norm + 1) * (q99 - q01) + q01`` on the dimensions where
``mask`` is true; masked-off dimensions (a gripper) pass through still normalized.

This module depends on numpy only, so the engine can import it cheaply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vla_sched.model.config.action_space import (
    ActionStatistics,
    ActionTokenizerConfig,
    select_statistics,
)

if TYPE_CHECKING:
    from vla_sched.model.config.checkpoint_spec import CheckpointSpec


class ActionTokenizer:
    """Maps normalized actions to token ids and back, exactly as OpenVLA does."""

    def __init__(self, config: ActionTokenizerConfig) -> None:
        self.config = config
        self.bins = np.linspace(config.min_action, config.max_action, config.num_bins)
        self.bin_centers = (self.bins[:-1] + self.bins[1:]) / 2.0

    @property
    def token_start(self) -> int:
        return self.config.token_start

    @property
    def token_end(self) -> int:
        return self.config.token_end

    def encode(self, actions: np.ndarray | Sequence[float]) -> np.ndarray:
        """Quantize normalized actions to token ids (any shape; int64, same shape).

        Raises:
            ValueError: If an action is NaN.
        """
        values = np.asarray(actions, dtype=np.float64)
        if np.isnan(values).any():
            raise ValueError('cannot tokenize NaN actions')
        clipped = np.clip(values, self.config.min_action, self.config.max_action)
        bin_index = np.digitize(clipped, self.bins)
        return (self.config.vocab_end - bin_index).astype(np.int64)

    def decode(self, token_ids: np.ndarray | Sequence[int]) -> np.ndarray:
        """Map token ids back to normalized actions (bin centres; float64, same shape).

        Raises:
            ValueError: If a token id lies outside ``[token_start, token_end)``.
        """
        ids = np.asarray(token_ids, dtype=np.int64)
        outside = (ids < self.token_start) | (ids >= self.token_end)
        if outside.any():
            bad = int(ids[outside].flat[0])
            raise ValueError(
                f'token id {bad} is not an action token [{self.token_start}, {self.token_end})'
            )
        return self.decode_clipped(ids)

    def decode_clipped(self, token_ids: np.ndarray | Sequence[int]) -> np.ndarray:
        """Map any token ids to bin centres as OpenVLA's ``predict_action`` does.

        The centre index is ``clip(vocab_end - id - 1, 0, num_bins - 2)`` for every id, so an
        id above the action range (``>= vocab_end``) lands on the first centre (-1 + half a
        bin) and one below it on the last (+1 - half a bin), silently. Inside the range this
        equals ``decode``.
        """
        ids = np.asarray(token_ids, dtype=np.int64)
        center_index = np.clip(self.config.vocab_end - ids - 1, 0, self.bin_centers.shape[0] - 1)
        return self.bin_centers[center_index]


@dataclass(frozen=True, slots=True, eq=False)
class ActionChunkDecoder:
    """Turns a request's ``horizon * action_dim`` action tokens into an action chunk.

    Tokens come time-major: the first ``action_dim`` tokens are step 0, and so on.
    """

    tokenizer: ActionTokenizer
    statistics: ActionStatistics
    horizon: int

    def __post_init__(self) -> None:
        if self.horizon < 1:
            raise ValueError(f'horizon must be >= 1, got {self.horizon}')

    @classmethod
    def for_checkpoint(
        cls, spec: CheckpointSpec, unnorm_key: str | None = None
    ) -> ActionChunkDecoder:
        """Token ids -> ``[H, D]`` actions in robot units, for one dataset's statistics
        (``unnorm_key``, else the checkpoint's own)."""
        key = unnorm_key if unnorm_key is not None else spec.unnorm_key
        return cls(
            tokenizer=ActionTokenizer(spec.action_tokens),
            statistics=select_statistics(spec.action_statistics, key),
            horizon=spec.action_horizon,
        )

    @property
    def action_dim(self) -> int:
        return self.statistics.action_dim

    @property
    def num_tokens(self) -> int:
        """How many action tokens one chunk takes."""
        return self.horizon * self.action_dim

    def decode_normalized(
        self, token_ids: Sequence[int] | np.ndarray, *, clip_to_bins: bool = False
    ) -> np.ndarray:
        """Token ids -> normalized actions ``[horizon, action_dim]`` in [-1, 1].

        ``clip_to_bins`` False refuses an id outside the action token range (ids sampled
        inside it); True clips any id into the bins as OpenVLA does
        (``ActionTokenizer.decode_clipped``), for ids chosen over the whole vocabulary.
        """
        ids = np.asarray(token_ids, dtype=np.int64)
        if ids.shape != (self.num_tokens,):
            raise ValueError(
                f'an action chunk needs {self.num_tokens} tokens '
                f'({self.horizon} x {self.action_dim}), got shape {ids.shape}'
            )
        values = self.tokenizer.decode_clipped(ids) if clip_to_bins else self.tokenizer.decode(ids)
        return values.reshape(self.horizon, self.action_dim)

    def decode(
        self, token_ids: Sequence[int] | np.ndarray, *, clip_to_bins: bool = False
    ) -> np.ndarray:
        """Token ids -> un-normalized actions ``[horizon, action_dim]`` (float64); see
        ``decode_normalized`` for ``clip_to_bins``."""
        return self.statistics.unnormalize(
            self.decode_normalized(token_ids, clip_to_bins=clip_to_bins)
        )

    def encode(self, actions: np.ndarray) -> np.ndarray:
        """Un-normalized actions ``[horizon, action_dim]`` -> token ids (tests, replay)."""
        actions = np.asarray(actions, dtype=np.float64)
        if actions.shape != (self.horizon, self.action_dim):
            raise ValueError(
                f'expected actions of shape {(self.horizon, self.action_dim)}, got {actions.shape}'
            )
        return self.tokenizer.encode(self.statistics.normalize(actions)).reshape(-1)
