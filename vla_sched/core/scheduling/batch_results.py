"""Turning a step's sampled tokens into request progress (SGLang's result processors).

Prefill rows: a middle chunk only decrements the request's in-flight chunk counter; a
final row appends the first token, then either finishes the request (its KV enters the
tree) or caches its prompt (``cache_unfinished_req``: the prompt is shareable at once and
a robot's session lock moves down to it). Decode rows, also the running requests that
decoded in a mixed pass (the batch's last ``num_decoding_rows``), append one token (``k``
for a decode burst) and finish the request when it has ``max_new_tokens`` or an abort was
requested.
A burst's tokens arrive together; their times are spread evenly since the request's last
token, so the inter-token latency window holds the burst's mean, not ``k - 1`` zeros.

A prefill-only batch's rows take their action chunks and finish; their KV is freed, never
cached (it was computed attending both ways, so no other sequence may reuse it). A
flow-matching request's rows append one marker per pass, its prompt is never cached, and
its last denoising pass brings its action chunk.

Each pass's cost is measured here for ``metrics.pass_cost``: from the later of its launch and
the previous pass's results to its own results (under the overlap loop a pass starts when the
one before it ends), with its tokens (prefill) or decode steps.

A row is skipped when its request finished meanwhile, or was retracted or preempted after
the step was launched (its generation changed): under the overlap loop, results arrive one
step late.

Difference from SGLang, on purpose: the prompt is cached before the first token is appended
to the radix key, so exactly the prefilled tokens enter the tree even when the overlap loop
has already allocated the next decode slot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from vla_sched.core.forward_batch import ForwardMode
from vla_sched.core.scheduling.request import FinishReason

if TYPE_CHECKING:
    from vla_sched.core.forward_batch import ForwardBatch, ForwardOutput
    from vla_sched.core.memory.kv_memory import KVMemory
    from vla_sched.core.scheduling.metrics import SchedulerMetrics
    from vla_sched.core.scheduling.request import Req
    from vla_sched.core.scheduling.schedule_batch import ScheduleBatch


class FinishFn(Protocol):
    """The scheduler's finish path."""

    def __call__(self, req: Req, reason: FinishReason, *, insert: bool = True) -> None: ...


class ResultProcessor:
    """Applies one step's output to its batch's requests.

    Args:
        memory: KV memory (prompt caching).
        metrics: latency windows.
        clock: integer-nanosecond clock; tokens are stamped when processed.
        finish: the scheduler's finish path, called with the request and its reason.
    """

    def __init__(
        self,
        *,
        memory: KVMemory,
        metrics: SchedulerMetrics,
        clock: Callable[[], int],
        finish: FinishFn,
    ) -> None:
        self.memory = memory
        self.metrics = metrics
        self.clock = clock
        self.finish = finish
        self._last_result_ns: int | None = None

    def process(
        self, batch: ScheduleBatch, output: ForwardOutput, *, launched_ns: int | None = None
    ) -> None:
        """Apply ``output`` to ``batch`` (a snapshot taken when the step was launched at
        ``launched_ns``, when known: then the pass's cost is measured).

        Raises:
            RuntimeError: the output does not match the batch, or a sampled token is < 0.
        """
        fb = batch.forward_batch
        if fb is None or len(output.next_token_ids) != len(batch.reqs):
            raise RuntimeError(
                f'step output has {len(output.next_token_ids)} tokens for a batch of '
                f'{len(batch.reqs)} requests'
            )
        now = self.clock()
        if launched_ns is not None:
            self._measure(fb, launched_ns, now)
        if fb.prefill_only:
            self._process_prefill_only(batch, output, now)
            return
        num_prefill_rows = len(batch.reqs) - batch.num_decoding_rows if batch.is_extend else 0
        expected = 1 if batch.is_extend else fb.num_decode_steps
        for i, req in enumerate(batch.reqs):
            if self._is_stale(batch, i):
                continue
            if not fb.sample[i]:
                req.inflight_middle_chunks -= 1
                continue
            tokens = output.tokens_of(i)
            if len(tokens) != expected or min(tokens) < 0:
                raise RuntimeError(
                    f'{req.describe()}: the runner returned tokens {list(tokens)} for a step '
                    f'of {expected}'
                )
            if i < num_prefill_rows:
                self._process_prefill_row(req, tokens[0], now)
                continue
            last = req.times.last_token_ns
            for j, token in enumerate(tokens, start=1):
                stamp = now if last is None else last + (now - last) * j // len(tokens)
                self._append(req, token, stamp)
            if req.denoise_steps and output.action_chunks is not None:
                chunk = output.action_chunks[i]
                if chunk is not None:
                    req.action_chunk = chunk
            if req.update_finish_state():
                self.finish(req, req.finished_reason)

    def _measure(self, fb: ForwardBatch, launched_ns: int, now: int) -> None:
        last, self._last_result_ns = self._last_result_ns, now
        start = launched_ns if last is None else max(launched_ns, last)
        if fb.forward_mode is ForwardMode.EXTEND:
            self.metrics.pass_cost.record_prefill(fb.num_tokens, now - start)
        else:
            self.metrics.pass_cost.record_decode(fb.num_decode_steps, now - start)

    def _process_prefill_only(self, batch: ScheduleBatch, output: ForwardOutput, now: int) -> None:
        chunks = output.action_chunks
        if chunks is None or len(chunks) != len(batch.reqs):
            have = 'none' if chunks is None else len(chunks)
            raise RuntimeError(
                f'a prefill-only step of {len(batch.reqs)} requests returned {have} action chunks'
            )
        for i, req in enumerate(batch.reqs):
            if self._is_stale(batch, i):
                continue
            req.action_chunk = chunks[i]
            req.times.first_token_ns = req.times.last_token_ns = now
            arrival = req.times.arrival_ns if req.times.arrival_ns is not None else now
            self.metrics.record_first_token(req.robot_id, now - arrival)
            if req.update_finish_state():
                self.finish(req, req.finished_reason, insert=False)

    @staticmethod
    def _is_stale(batch: ScheduleBatch, i: int) -> bool:
        req = batch.reqs[i]
        return req.finished or req.is_retracted or req.retraction_count != batch.row_generations[i]

    def _process_prefill_row(self, req: Req, token: int, now: int) -> None:
        will_finish = req.to_finish is not None or len(req.output_ids) + 1 >= req.max_new_tokens
        if not will_finish and not req.whole_prompt:
            self.memory.cache_unfinished_req(req.kv)
        self._append(req, token, now)
        if req.update_finish_state():
            self.finish(req, req.finished_reason)

    def _append(self, req: Req, token: int, now: int) -> None:
        req.append_output([token])
        times = req.times
        if times.first_token_ns is None:
            times.first_token_ns = now
            arrival = times.arrival_ns if times.arrival_ns is not None else now
            self.metrics.record_first_token(req.robot_id, now - arrival)
        elif times.last_token_ns is not None:
            self.metrics.record_itl(req.robot_id, now - times.last_token_ns)
        times.last_token_ns = now
        times.token_ns.append(now)
