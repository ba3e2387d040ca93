"""A checkpoint's action space: where its action tokens sit, and its datasets' statistics.

``ActionTokenizerConfig`` says where the action tokens sit in the vocabulary and how finely
they quantize; ``ActionStatistics`` holds one dataset's 1st/99th percentiles and un-norm
mask, read from ``dataset_statistics.json`` (or ``norm_stats`` in ``config.json``) by
``load_action_statistics``; ``select_statistics`` picks one dataset by its ``unnorm_key``.
The behaviour built on them (token ids <-> actions) is the decoded-token family's
``action_tokenizer.py``.

This module depends on numpy only, so the engine can import it cheaply.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
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
