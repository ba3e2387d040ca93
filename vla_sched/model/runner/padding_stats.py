"""What the runner's padded paths ran: real and padding work, and the steps that ran eagerly.

Each path counts in its own unit: decode in request rows, prefill in tokens, the vision
encoder in images; an OpenVLA-OFT pass (``ParallelActionRunner``: the decoder and head
over whole sequences) in tokens, as ``oft``. A padded run computes its prepared size; the
units past the real ones are padding, computed and thrown away. ``ModelRunner.padding_stats()``
and ``ParallelActionRunner.padding_stats()`` give one ``PaddingStats`` per path; a benchmark
takes one before and one after its measured part and reads ``after.since(before)``.
"""

from __future__ import annotations

from dataclasses import dataclass

PATH_UNITS = {'decode': 'request rows', 'prefill': 'tokens', 'vision': 'images'}
OFT_PATH_UNITS = {'oft': 'tokens', 'vision': 'images'}


@dataclass(frozen=True, slots=True)
class PaddingStats:
    """One path's counts since the runner was built.

    Attributes:
        num_padded_runs: Runs at a prepared size (a graph replay, or the same padded forward
            run eagerly without graphs); a prefill cut into pieces counts one per piece.
        num_real: Real units in those runs.
        num_padding: Padding units in those runs.
        num_eager_runs: Steps of this kind that ran the plain eager forward instead (the
            path is off, or cannot take them: a decode step on no padded path, a prefill
            with bidirectional image spans, ``forward_logits`` of a decode step, an OFT
            pass without the padded path).
        num_eager: Units in those steps.
    """

    num_padded_runs: int = 0
    num_real: int = 0
    num_padding: int = 0
    num_eager_runs: int = 0
    num_eager: int = 0

    @property
    def padding_share(self) -> float:
        """Padding's share of what the padded runs computed (0.0 before any run)."""
        computed = self.num_real + self.num_padding
        return self.num_padding / computed if computed else 0.0

    def since(self, earlier: PaddingStats) -> PaddingStats:
        """The counts added after ``earlier`` (an earlier snapshot of the same path)."""
        return PaddingStats(
            num_padded_runs=self.num_padded_runs - earlier.num_padded_runs,
            num_real=self.num_real - earlier.num_real,
            num_padding=self.num_padding - earlier.num_padding,
            num_eager_runs=self.num_eager_runs - earlier.num_eager_runs,
            num_eager=self.num_eager - earlier.num_eager,
        )


class PaddingCounter:
    """Running counts of one path (plain ints: it is updated on every step)."""

    def __init__(self) -> None:
        self.num_padded_runs = 0
        self.num_real = 0
        self.num_padding = 0
        self.num_eager_runs = 0
        self.num_eager = 0

    def add_padded(self, *, num_real: int, size: int) -> None:
        """One run of ``num_real`` units at prepared size ``size``."""
        self.num_padded_runs += 1
        self.num_real += num_real
        self.num_padding += size - num_real

    def add_eager(self, num: int) -> None:
        """One step of ``num`` units on the plain eager forward."""
        self.num_eager_runs += 1
        self.num_eager += num

    def snapshot(self) -> PaddingStats:
        return PaddingStats(
            num_padded_runs=self.num_padded_runs,
            num_real=self.num_real,
            num_padding=self.num_padding,
            num_eager_runs=self.num_eager_runs,
            num_eager=self.num_eager,
        )
