"""Sizes and policies of the KV memory layer."""

from __future__ import annotations

from dataclasses import dataclass

SESSION_STEP_KV_CHOICES = ('free', 'insert')


@dataclass(frozen=True, slots=True)
class KVMemoryConfig:
    """How big the KV pools are and what happens to a session step's KV.

    Attributes:
        num_pages: KV pages handed out by the allocator (page 0 is reserved on top of
            these, so the KV buffers need ``(num_pages + 1) * page_size`` slots).
        page_size: tokens per page; radix keys are page-aligned.
        num_req_slots: rows of ``ReqToTokenPool.req_to_token`` (requests holding KV at
            once).
        max_context_len: columns of ``req_to_token`` (longest sequence, in tokens).
        session_step_kv: what a finished session step does with its own KV beyond the
            session prefix: ``'free'`` (never enters the tree, the default: a frame's image
            KV is not reused) or ``'insert'`` (inserted like any finished request).
        session_idle_timeout_s: a session with no step in flight for this long is closed
            by ``SessionManager.reap_idle`` (the scheduler reaps in its loop); ``0``
            disables the timeout.
    """

    num_pages: int
    page_size: int = 1
    num_req_slots: int = 64
    max_context_len: int = 4096
    session_step_kv: str = 'free'
    session_idle_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ('num_pages', 'page_size', 'num_req_slots', 'max_context_len'):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f'{name} must be a positive int, got {value!r}')
        if self.session_step_kv not in SESSION_STEP_KV_CHOICES:
            raise ValueError(
                f'session_step_kv must be one of {SESSION_STEP_KV_CHOICES}, '
                f'got {self.session_step_kv!r}'
            )
        if not self.session_idle_timeout_s >= 0.0:
            raise ValueError(
                f'session_idle_timeout_s must be >= 0, got {self.session_idle_timeout_s}'
            )

    @property
    def num_tokens(self) -> int:
        """Token capacity of the pool (``num_pages * page_size``)."""
        return self.num_pages * self.page_size
