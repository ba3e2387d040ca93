"""Prefix sharing: same prompt shares pages across robots; different images never do."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from kv_testing import make_memory, prefill

from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.memory.radix_key import RadixKey, build_key_tokens
from vla_sched.core.memory.req_kv import ReqKV

IMAGE_TOKEN = 32000
SYSTEM_AND_INSTRUCTION = list(range(1000, 1037))  # 37 tokens
NUM_IMAGE_TOKENS = 24
SUFFIX = [5, 6, 7]


@dataclass(frozen=True)
class Image:
    content_hash: int
    token_offset: int = len(SYSTEM_AND_INSTRUCTION)
    num_tokens: int = NUM_IMAGE_TOKENS


def _prompt() -> list[int]:
    return SYSTEM_AND_INSTRUCTION + [IMAGE_TOKEN] * NUM_IMAGE_TOKENS + SUFFIX


def _prefix_key(extra_key: object = None) -> RadixKey:
    return RadixKey(torch.tensor(SYSTEM_AND_INSTRUCTION, dtype=torch.int64), extra_key)


def _step(memory: KVMemory, robot: str, rid: str, image_hash: int) -> ReqKV:
    req = ReqKV.from_prompt(rid, _prompt(), images=[Image(image_hash)])
    memory.sessions.begin_step(robot, req, now_ns=0)
    return req


@pytest.mark.parametrize('page_size', [1, 16])
def test_robots_with_the_same_prompt_prefix_share_its_pages(page_size: int) -> None:
    memory = make_memory(page_size=page_size, num_pages=256 // page_size + 4)
    aligned = len(SYSTEM_AND_INSTRUCTION) // page_size * page_size
    memory.sessions.open('r1', _prefix_key(), now_ns=0)
    memory.sessions.open('r2', _prefix_key(), now_ns=0)
    first = _step(memory, 'r1', 'a', image_hash=0xA)
    prefill(memory, first)
    second = _step(memory, 'r2', 'b', image_hash=0xB)
    match = memory.match_prefix(second)
    assert match.device_indices.tolist() == first.prefix_indices[:aligned].tolist()
    memory.admit(second)
    memory.allocate_extend([second], [second.num_tokens - second.kv_allocated_len])
    memory.cache_unfinished_req(second)
    prefix_node = memory.sessions.get('r1').locked_node
    assert memory.sessions.get('r2').locked_node is prefix_node
    assert prefix_node.lock_ref == 2 + 2  # two sessions and two steps hold it or below
    for req in (first, second):
        memory.release(req, insert=True)
    assert memory.tree.total_size() == aligned  # one copy of the prefix, nothing else
    assert prefix_node.lock_ref == 2
    memory.check_integrity([])


@pytest.mark.parametrize('page_size', [1, 16])
def test_two_different_images_with_the_same_placeholders_never_share(page_size: int) -> None:
    memory = make_memory(page_size=page_size, num_pages=256 // page_size + 4)
    memory.sessions.open('r1', _prefix_key(), now_ns=0)
    memory.sessions.open('r2', _prefix_key(), now_ns=0)
    first = _step(memory, 'r1', 'a', image_hash=0x1111)
    prefill(memory, first)
    memory.release(first, insert=True)
    # same token ids, another frame: nothing at or after the image start may match
    second = ReqKV.from_prompt('b', _prompt(), images=[Image(0x2222)])
    matched = memory.match_prefix(second).device_indices.numel()
    assert matched == len(SYSTEM_AND_INSTRUCTION) // page_size * page_size
    assert matched <= Image(0).token_offset
    memory.check_integrity([second])


@pytest.mark.parametrize('page_size', [1, 16])
def test_the_same_image_does_share_its_pages_when_steps_are_inserted(page_size: int) -> None:
    memory = make_memory(
        page_size=page_size, num_pages=256 // page_size + 4, session_step_kv='insert'
    )
    memory.sessions.open('r1', _prefix_key(), now_ns=0)
    first = _step(memory, 'r1', 'a', image_hash=0x1111)
    prefill(memory, first)
    memory.release(first, insert=True)
    again = ReqKV.from_prompt('b', _prompt(), images=[Image(0x1111)])
    other = ReqKV.from_prompt('c', _prompt(), images=[Image(0x2222)])
    full = (len(_prompt()) - 1) // page_size * page_size
    assert memory.match_prefix(again).device_indices.numel() == full
    assert memory.match_prefix(other).device_indices.numel() < Image(0).token_offset + 1
    memory.check_integrity([again, other])


def test_another_embodiment_namespace_shares_nothing() -> None:
    memory = make_memory(num_pages=256)
    memory.sessions.open('widowx', _prefix_key('widowx'), now_ns=0)
    step = ReqKV('a', RadixKey(build_key_tokens(_prompt(), [Image(1)]), 'widowx'))
    memory.sessions.begin_step('widowx', step, now_ns=0)
    prefill(memory, step)
    other = ReqKV('b', RadixKey(build_key_tokens(_prompt(), [Image(1)]), 'franka'))
    assert memory.match_prefix(other).device_indices.numel() == 0
    memory.check_integrity([step, other])
