"""The two event loops: normal (launch, wait, process) and overlap (process one step late).

Overlap, per iteration ``k`` (SGLang's ``event_loop_overlap``)::

    batch_k = get_next_batch_to_run()      # state without batch k-1's tokens
    if overlap is off for (batch_k, batch_k-1): process batch k-1 now
    launch batch_k                          # returns a handle at once on a GPU
    process every older result              # batch k-1, while batch k runs
    last_batch = batch_k

Decode inputs whose token is still unknown go to the runner as ``FUTURE_TOKEN_ID``.
Overlap falls back to synchronous processing where SGLang does without speculative
decoding: two prefills in a row when ``disable_consecutive_prefill_overlap`` is set.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from vla_sched.core.forward_batch import BatchRunner, ResultHandle
    from vla_sched.core.scheduling.batch_results import ResultProcessor
    from vla_sched.core.scheduling.schedule_batch import ScheduleBatch


class LoopHost(Protocol):
    """The scheduler as seen by a loop."""

    last_batch: ScheduleBatch | None

    def get_next_batch_to_run(self) -> ScheduleBatch | None: ...

    def on_idle(self) -> None: ...


class NormalLoop:
    """Launch the step, wait for its tokens, process them, repeat."""

    def __init__(self, host: LoopHost, runner: BatchRunner, results: ResultProcessor) -> None:
        self.host = host
        self.runner = runner
        self.results = results

    def has_pending_results(self) -> bool:
        return False

    def run_once(self) -> None:
        batch = self.host.get_next_batch_to_run()
        if batch is not None:
            launched_ns = self.results.clock()
            output = self.runner.launch(batch.forward_batch).result()
            self.results.process(batch, output, launched_ns=launched_ns)
        else:
            self.host.on_idle()
        self.host.last_batch = batch


class OverlapLoop:
    """Launch step N, then process step N-1's results while step N runs.

    Args:
        disable_consecutive_prefill_overlap: process a prefill's results before
            launching the next prefill.
    """

    def __init__(
        self,
        host: LoopHost,
        runner: BatchRunner,
        results: ResultProcessor,
        *,
        disable_consecutive_prefill_overlap: bool = False,
    ) -> None:
        self.host = host
        self.runner = runner
        self.results = results
        self.disable_consecutive_prefill_overlap = disable_consecutive_prefill_overlap
        self.result_queue: deque[tuple[ScheduleBatch, ResultHandle, int]] = deque()

    def has_pending_results(self) -> bool:
        return bool(self.result_queue)

    def run_once(self) -> None:
        batch = self.host.get_next_batch_to_run()
        if self._overlap_disabled(batch, self.host.last_batch):
            self._drain(keep=0)
        if batch is not None:
            launched_ns = self.results.clock()
            handle = self.runner.launch(batch.forward_batch)
            self.result_queue.append((batch.copy(), handle, launched_ns))
        had_results = bool(self.result_queue)
        self._drain(keep=1 if batch is not None else 0)
        if batch is None and not had_results:
            self.host.on_idle()
        self.host.last_batch = batch

    def _overlap_disabled(self, batch: ScheduleBatch | None, last: ScheduleBatch | None) -> bool:
        return (
            self.disable_consecutive_prefill_overlap
            and batch is not None
            and last is not None
            and batch.is_extend
            and last.is_extend
        )

    def _drain(self, *, keep: int) -> None:
        """Process queued results, oldest first, leaving the newest ``keep`` in flight."""
        while len(self.result_queue) > keep:
            batch, handle, launched_ns = self.result_queue.popleft()
            self.results.process(batch, handle.result(), launched_ns=launched_ns)
