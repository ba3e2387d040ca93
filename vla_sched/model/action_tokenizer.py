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

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ACTION_STATISTICS_FILE = 'dataset_statistics.json'


class ActionStatisticsError(ValueError):
    """Action statistics are missing, ambiguous or malformed."""


@dataclass(frozen=True, slots=True)
class ActionTokenizerConfig:
    """Where the action tokens sit in the vocabulary and how finely they quantize.

    Attributes:
        vocab_end: Exclusive end of the action token range: OpenVLA's unpadded tokenizer
            vocabulary size. Token ids count down from it.
        num_bins: Number of uniform bin edges (and of action token ids).
        min_action: Lower end of the normalized action range.
        max_action: Upper end of the normalized action range.
    """

    vocab_end: int
    num_bins: int = 256
    min_action: float = -1.0
    max_action: float = 1.0

    def __post_init__(self) -> None:
        if self.num_bins < 2:
            raise ValueError(f'num_bins must be >= 2, got {self.num_bins}')
        if self.vocab_end < self.num_bins:
            raise ValueError(
                f'vocab_end {self.vocab_end} leaves no room for {self.num_bins} action tokens'
            )
        if not (math.isfinite(self.min_action) and math.isfinite(self.max_action)):
            raise ValueError('min_action and max_action must be finite')
        if not self.min_action < self.max_action:
            raise ValueError(
                f'min_action {self.min_action} must be < max_action {self.max_action}'
            )

    @property
    def token_start(self) -> int:
        """First action token id (inclusive)."""
        return self.vocab_end - self.num_bins

    @property
    def token_end(self) -> int:
        """End of the action token ids (exclusive)."""
        return self.vocab_end


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
class ActionStatistics:
    """Per-dimension 1st/99th percentiles of one dataset's actions, and the un-norm mask."""

    q01: np.ndarray
    q99: np.ndarray
    mask: np.ndarray

    def __post_init__(self) -> None:
        for name in ('q01', 'q99', 'mask'):
            value = getattr(self, name)
            if value.ndim != 1 or value.shape != self.q01.shape:
                raise ActionStatisticsError(
                    f'{name} must be a vector of {self.q01.shape} values, got {value.shape}'
                )
        if self.q01.size == 0:
            raise ActionStatisticsError('action statistics have zero dimensions')
        if not (np.isfinite(self.q01).all() and np.isfinite(self.q99).all()):
            raise ActionStatisticsError('q01 and q99 must be finite')

    @property
    def action_dim(self) -> int:
        return int(self.q01.shape[0])

    @classmethod
    def from_mapping(cls, action: Mapping[str, object], *, where: str) -> ActionStatistics:
        """Build from an OpenVLA ``{"q01": [...], "q99": [...], "mask": [...]}`` mapping."""
        missing = [k for k in ('q01', 'q99') if k not in action]
        if missing:
            raise ActionStatisticsError(f'{where}: action statistics lack {missing}')
        q01 = np.asarray(action['q01'], dtype=np.float64)
        q99 = np.asarray(action['q99'], dtype=np.float64)
        mask_value = action.get('mask')
        mask = np.ones_like(q01, dtype=bool) if mask_value is None else np.asarray(mask_value)
        if mask.dtype != np.bool_:
            raise ActionStatisticsError(f'{where}: mask must hold booleans, got {mask.dtype}')
        try:
            return cls(q01=q01, q99=q99, mask=mask)
        except ActionStatisticsError as exc:
            raise ActionStatisticsError(f'{where}: {exc}') from None

    def unnormalize(self, normalized: np.ndarray) -> np.ndarray:
        """Map normalized actions ``[..., action_dim]`` to robot units (OpenVLA BOUNDS_Q99)."""
        values = np.asarray(normalized, dtype=np.float64)
        if values.shape[-1:] != (self.action_dim,):
            raise ValueError(
                f'actions have last dimension {values.shape[-1:]}, statistics have '
                f'{self.action_dim}'
            )
        scaled = 0.5 * (values + 1.0) * (self.q99 - self.q01) + self.q01
        return np.where(self.mask, scaled, values)

    def normalize(self, values: np.ndarray) -> np.ndarray:
        """Inverse of ``unnormalize`` on masked dimensions, clipped to [-1, 1]."""
        values = np.asarray(values, dtype=np.float64)
        span = np.where(self.q99 > self.q01, self.q99 - self.q01, 1.0)
        scaled = np.clip(2.0 * (values - self.q01) / span - 1.0, -1.0, 1.0)
        return np.where(self.mask, scaled, values)


def load_action_statistics(
    source: Path | Mapping[str, object], *, unnorm_key: str | None = None
) -> dict[str, ActionStatistics]:
    """Read every dataset's action statistics, OpenVLA's ``dataset_statistics.json`` layout.

    Args:
        source: A JSON file path, or the already parsed mapping
            ``{dataset: {"action": {"q01": ..., "q99": ..., "mask": ...}, ...}}``.
        unnorm_key: If given, only that dataset is required and returned.

    Returns:
        Statistics per dataset name.

    Raises:
        ActionStatisticsError: If the file is missing or malformed, or ``unnorm_key`` is absent.
    """
    if isinstance(source, Path):
        if not source.is_file():
            raise ActionStatisticsError(f'missing action statistics file {source.name}')
        try:
            data = json.loads(source.read_text())
        except json.JSONDecodeError as exc:
            raise ActionStatisticsError(f'{source.name} is not valid JSON: {exc}') from None
        where = source.name
    else:
        data, where = source, 'action statistics'
    if not isinstance(data, Mapping) or not data:
        raise ActionStatisticsError(f'{where} holds no datasets')
    if unnorm_key is not None and unnorm_key not in data:
        raise ActionStatisticsError(
            f'{where} has no dataset {unnorm_key!r}; it has {sorted(data)}'
        )
    names = [unnorm_key] if unnorm_key is not None else list(data)
    stats = {}
    for name in names:
        entry = data[name]
        if not isinstance(entry, Mapping) or not isinstance(entry.get('action'), Mapping):
            raise ActionStatisticsError(f'{where}: dataset {name!r} has no "action" entry')
        stats[name] = ActionStatistics.from_mapping(entry['action'], where=f'{where}[{name!r}]')
    return stats


def select_statistics(
    stats: Mapping[str, ActionStatistics], unnorm_key: str | None
) -> ActionStatistics:
    """Pick one dataset's statistics; the key may be omitted only if there is one dataset."""
    if unnorm_key is None:
        if len(stats) != 1:
            raise ActionStatisticsError(
                f'several datasets have action statistics ({sorted(stats)}): pass an unnorm_key'
            )
        return next(iter(stats.values()))
    if unnorm_key not in stats:
        raise ActionStatisticsError(
            f'no action statistics for {unnorm_key!r}; have {sorted(stats)}'
        )
    return stats[unnorm_key]


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
