"""Throughput of the KV memory layer on the CPU: radix match/insert and page alloc/free.

For each page size and each tree size (tokens cached), the script builds a radix tree from
robot-like prompts (one of 8 shared 128-token system + instruction prefixes, then 384 tokens
of their own) and times:

* ``insert``: ``RadixCache.insert`` of every prompt while the tree grows (tokens/s of key);
* ``match hit``: ``match_prefix`` of every cached prompt (tokens/s matched);
* ``match miss``: ``match_prefix`` of a shared prefix followed by unseen tokens (tokens/s
  of key looked at; the match stops at the prefix);

(small trees are rebuilt and matched again until each figure covers at least 400 calls);
* ``page alloc+free``: ``allocate_pages(1)`` then ``free_pages`` (pairs/s);
* ``extend 8x128``: ``allocate_extend`` of 8 requests by 128 tokens each, then freeing
  them (calls/s);
* ``decode 64``: ``allocate_decode`` for 64 requests whose next token starts a new page
  in the worst case (calls/s).

A second table times the ``KVMemory`` calls a scheduler makes per step, for 64 robots
whose 512-token prompts share a 128-token prefix: ``match_prefix`` + ``admit`` of all
64, one ``allocate_extend`` for their prompts, ``cache_unfinished_req`` of each, one
``allocate_decode`` for all 64 (median of 50 steps), and ``release`` of each
(microseconds per call for the whole batch).

Prints a table; nothing is asserted.

Usage, from the repository root::

    python -m bench.bench_memory [--sizes 1000 10000 100000] [--page-sizes 1 16]
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.memory.radix_cache import RadixCache
from vla_sched.core.memory.radix_key import RadixKey
from vla_sched.core.memory.req_kv import ReqKV
from vla_sched.core.memory.token_allocator import PagedTokenAllocator

NUM_SHARED_PREFIXES = 8
PREFIX_LEN = 128
TAIL_LEN = 384
MIN_CALLS = 400


def make_prompts(num_tokens: int, generator: torch.Generator) -> list[RadixKey]:
    """Prompts whose insertion caches about ``num_tokens`` tokens."""
    prefixes = torch.randint(0, 32000, (NUM_SHARED_PREFIXES, PREFIX_LEN), generator=generator)
    shared = min(NUM_SHARED_PREFIXES, max(1, num_tokens // (PREFIX_LEN + TAIL_LEN)))
    num_prompts = max(1, (num_tokens - shared * PREFIX_LEN) // TAIL_LEN)
    prompts = []
    for i in range(num_prompts):
        tail = torch.randint(0, 32000, (TAIL_LEN,), generator=generator)
        prompts.append(RadixKey(torch.cat([prefixes[i % shared], tail])))
    return prompts


def slots_of(pages: torch.Tensor, page_size: int) -> torch.Tensor:
    return (pages[:, None] * page_size + torch.arange(page_size)).reshape(-1)


def build_tree(prompts: list[RadixKey], page_size: int) -> tuple[RadixCache, float]:
    """A tree holding ``prompts``, and the seconds spent inside ``insert``."""
    total_key = sum(len(p) for p in prompts)
    allocator = PagedTokenAllocator(num_pages=total_key // page_size + 8, page_size=page_size)
    tree = RadixCache(allocator)
    insert_s = 0.0
    for key in prompts:
        slots = slots_of(allocator.allocate_pages(len(key) // page_size), page_size)
        start = time.perf_counter()
        result = tree.insert(key, slots)
        insert_s += time.perf_counter() - start
        allocator.free(slots[: result.prefix_len])
    return tree, insert_s


def time_matches(tree: RadixCache, keys: list[RadixKey], reps: int) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        for key in keys:
            tree.match_prefix(key)
    return time.perf_counter() - start


def bench_tree(num_tokens: int, page_size: int, generator: torch.Generator) -> dict[str, float]:
    prompts = make_prompts(num_tokens, generator)
    total_key = sum(len(p) for p in prompts)
    reps = -(-MIN_CALLS // len(prompts))  # small trees: repeat until MIN_CALLS calls
    insert_s = 0.0
    for _ in range(reps):
        tree, seconds = build_tree(prompts, page_size)
        insert_s += seconds
    misses = [
        RadixKey(torch.cat([p.token_ids[:PREFIX_LEN], p.token_ids[PREFIX_LEN:] + 32000]))
        for p in prompts
    ]
    return {
        'cached': tree.total_size(),
        'nodes': sum(1 for _ in tree.iter_nodes()),
        'insert': reps * total_key / insert_s,
        'match hit': reps * total_key / time_matches(tree, prompts, reps),
        'match miss': reps * total_key / time_matches(tree, misses, reps),
    }


def bench_allocator(page_size: int, num_pages: int, reps: int) -> dict[str, float]:
    allocator = PagedTokenAllocator(num_pages=num_pages, page_size=page_size)
    start = time.perf_counter()
    for _ in range(reps):
        allocator.free_pages(allocator.allocate_pages(1))
    pair = reps / (time.perf_counter() - start)

    zeros8 = torch.zeros(8, dtype=torch.int64)
    start = time.perf_counter()
    for _ in range(reps):
        slots = allocator.allocate_extend(
            prefix_lens=zeros8, seq_lens=zeros8 + 128, last_slots=zeros8
        )
        allocator.free(slots)
    extend = reps / (time.perf_counter() - start)

    seq_lens = torch.full((64,), 4 * page_size, dtype=torch.int64)  # next token: new page
    last_slots = torch.full((64,), page_size - 1, dtype=torch.int64)
    start = time.perf_counter()
    for _ in range(reps):
        slots = allocator.allocate_decode(seq_lens=seq_lens, last_slots=last_slots)
        allocator.free(slots)
    decode = reps / (time.perf_counter() - start)
    return {'page alloc+free': pair, 'extend 8x128': extend, 'decode 64': decode}


def bench_memory_step(page_size: int, generator: torch.Generator) -> dict[str, float]:
    memory = KVMemory(
        KVMemoryConfig(
            num_pages=64 * 640 // page_size, page_size=page_size, num_req_slots=64,
            max_context_len=1024,
        )
    )  # fmt: skip
    prompts = make_prompts(64 * TAIL_LEN + PREFIX_LEN, generator)[:64]
    reqs = [ReqKV(f'robot{i}', key) for i, key in enumerate(prompts)]
    timings = {}
    start = time.perf_counter()
    for req in reqs:
        memory.match_prefix(req)
        memory.admit(req)
    timings['match+admit x64'] = time.perf_counter() - start
    start = time.perf_counter()
    memory.allocate_extend(reqs, [r.num_tokens - r.kv_allocated_len for r in reqs])
    timings['extend 64 prompts'] = time.perf_counter() - start
    start = time.perf_counter()
    for req in reqs:
        memory.cache_unfinished_req(req)
    timings['cache_unfinished x64'] = time.perf_counter() - start
    steps = []
    for _ in range(50):
        start = time.perf_counter()
        memory.allocate_decode(reqs)
        steps.append(time.perf_counter() - start)
        for req in reqs:
            req.append_tokens([7])
    timings['decode 64'] = sorted(steps)[len(steps) // 2]
    start = time.perf_counter()
    for req in reqs:
        memory.release(req, insert=True)
    timings['release x64'] = time.perf_counter() - start
    memory.check_integrity([])
    return {name: seconds * 1e6 for name, seconds in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--sizes', type=int, nargs='+', default=[1000, 10000, 100000])
    parser.add_argument('--page-sizes', type=int, nargs='+', default=[1, 16])
    parser.add_argument('--reps', type=int, default=2000, help='allocator repetitions')
    parser.add_argument('--threads', type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f'# {platform.machine()} CPU, {torch.get_num_threads()} torch thread(s), '
        f'Python {platform.python_version()}, torch {torch.__version__}'
    )
    header = (
        '| page | tree tokens | nodes | insert tok/s | match hit tok/s | match miss tok/s '
        '| page alloc+free /s | extend 8x128 /s | decode 64 /s |'
    )
    print(header)
    print('|---' * 9 + '|')
    for page_size in args.page_sizes:
        for size in args.sizes:
            tree = bench_tree(size, page_size, torch.Generator().manual_seed(size))
            num_pages = max(size // page_size, 8 * 128 // page_size + 64)
            alloc = bench_allocator(page_size, num_pages, args.reps)
            print(
                f'| {page_size} | {tree["cached"]:,} | {tree["nodes"]:,} '
                f'| {tree["insert"]:,.0f} | {tree["match hit"]:,.0f} '
                f'| {tree["match miss"]:,.0f} | {alloc["page alloc+free"]:,.0f} '
                f'| {alloc["extend 8x128"]:,.0f} | {alloc["decode 64"]:,.0f} |',
                flush=True,
            )
    print()
    names = ['match+admit x64', 'extend 64 prompts', 'cache_unfinished x64', 'decode 64',
             'release x64']  # fmt: skip
    print('| page | ' + ' | '.join(f'{n} (us)' for n in names) + ' |')
    print('|---' * (len(names) + 1) + '|')
    for page_size in args.page_sizes:
        step = bench_memory_step(page_size, torch.Generator().manual_seed(page_size))
        print(f'| {page_size} | ' + ' | '.join(f'{step[n]:,.0f}' for n in names) + ' |')


if __name__ == '__main__':
    main()
