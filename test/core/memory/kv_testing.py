"""Helpers shared by the KV memory tests (not a test module)."""

from __future__ import annotations

import torch

from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.memory.req_kv import ReqKV


def make_memory(
    *,
    page_size: int = 1,
    num_pages: int = 32,
    num_req_slots: int = 4,
    max_context_len: int = 128,
    session_step_kv: str = 'free',
    session_idle_timeout_s: float = 10.0,
) -> KVMemory:
    return KVMemory(
        KVMemoryConfig(
            num_pages=num_pages,
            page_size=page_size,
            num_req_slots=num_req_slots,
            max_context_len=max_context_len,
            session_step_kv=session_step_kv,
            session_idle_timeout_s=session_idle_timeout_s,
        )
    )


def prefill(memory: KVMemory, req: ReqKV) -> torch.Tensor:
    """Match, admit and prefill the rest of ``req``'s tokens; returns its new slots."""
    memory.match_prefix(req)
    memory.admit(req)
    slots = memory.allocate_extend([req], [req.num_tokens - req.kv_allocated_len])
    memory.cache_unfinished_req(req)
    return slots


def decode(memory: KVMemory, req: ReqKV, num_steps: int, token_id: int = 1) -> None:
    """Sample a token after the prefill, then run ``num_steps`` decode steps."""
    req.append_tokens([token_id])
    for _ in range(num_steps):
        memory.allocate_decode([req])
        req.append_tokens([token_id])
