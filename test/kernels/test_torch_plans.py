"""The 'torch' backend's per-step plans: which slots every layer reads, worked out once.

A step's decode reads and extend runs are shared by all layers of the model's CPU path;
the backend's own entry points run plan and arithmetic back to back.
"""

from __future__ import annotations

import torch
from paged_kv_cases import build_paged_kv, max_rel_error

from vla_sched.kernels.decode_attention import decode_attention_torch
from vla_sched.kernels.decode_reads import decode_attention_over_reads, decode_reads
from vla_sched.kernels.extend_attention import extend_attention_torch
from vla_sched.kernels.extend_runs import extend_runs
from vla_sched.kernels.store_kv import store_kv_torch, write_kv

TOLERANCE = 1e-5


def test_decode_reads_pad_only_when_lengths_differ_and_zero_the_padding_slots():
    paged = build_paged_kv(
        seq_lens=[3, 3, 5],
        num_kv_heads=1,
        head_dim=8,
        v_head_dim=8,
        page_size=2,
        dtype=torch.float32,
        generator=torch.Generator().manual_seed(1),
    )
    rows = paged.req_pool_indices
    even = decode_reads(
        req_to_token=paged.req_to_token, req_pool_indices=rows[:2], seq_lens=torch.tensor([3, 3])
    )
    assert even.padding is None and even.max_len == 3
    assert even.slots.tolist() == torch.cat(paged.slots[:2]).tolist()
    mixed = decode_reads(
        req_to_token=paged.req_to_token, req_pool_indices=rows, seq_lens=torch.tensor([3, 3, 5])
    )
    assert mixed.max_len == 5
    assert mixed.padding.tolist()[0] == [False, False, False, True, True]
    slots = mixed.slots.view(3, 5)
    assert slots[0, 3:].tolist() == [0, 0]  # the table's garbage past the length is not read
    assert slots[2].tolist() == paged.slots[2].tolist()


def test_decode_over_shared_reads_equals_decode_attention_torch_for_every_layer():
    generator = torch.Generator().manual_seed(2)
    seq_lens = [4, 9, 9]
    layers = [
        build_paged_kv(
            seq_lens=seq_lens,
            num_kv_heads=2,
            head_dim=16,
            v_head_dim=16,
            page_size=4,
            dtype=torch.float32,
            generator=torch.Generator().manual_seed(seed),
        )
        for seed in (3, 3)  # two layers' caches on one slot table
    ]
    table, rows = layers[0].req_to_token, layers[0].req_pool_indices
    lengths = torch.tensor(seq_lens)
    reads = decode_reads(req_to_token=table, req_pool_indices=rows, seq_lens=lengths)
    for paged in layers:
        paged.k_cache.mul_(torch.rand(1, generator=generator) + 0.5)
        q = torch.randn((3, 4, 16), generator=generator)
        caches = dict(k_cache=paged.k_cache, v_cache=paged.v_cache)
        expected = decode_attention_torch(
            q=q, **caches, req_to_token=table, req_pool_indices=rows, seq_lens=lengths,
            sm_scale=0.25,
        )  # fmt: skip
        out = decode_attention_over_reads(q=q, **caches, reads=reads, sm_scale=0.25)
        assert torch.equal(out, expected)


def _runs_of(prefix_lens, extend_lens, spans=None):
    starts = [0]
    for length in extend_lens[:-1]:
        starts.append(starts[-1] + length)
    num_reqs = len(prefix_lens)
    table = torch.arange(num_reqs * 32, dtype=torch.int32).view(num_reqs, 32)
    return extend_runs(
        req_to_token=table,
        req_pool_indices=torch.arange(num_reqs),
        prefix_lens=torch.tensor(prefix_lens),
        extend_lens=torch.tensor(extend_lens),
        extend_start_loc=torch.tensor(starts),
        image_spans=None if spans is None else torch.tensor(spans),
    )


def test_extend_runs_group_neighbours_of_one_shape_and_skip_empty_requests():
    runs = _runs_of([5, 5, 5, 0, 5, 5], [4, 4, 4, 3, 0, 4])
    shapes = [(r.first_row, r.num_requests, r.prefix_len, r.extend_len) for r in runs]
    assert shapes == [(0, 3, 5, 4), (12, 1, 0, 3), (15, 1, 5, 4)]
    assert runs[0].prefix_slots.tolist() == [list(range(r * 32, r * 32 + 5)) for r in range(3)]
    assert runs[0].hidden.shape == (4, 9)
    assert runs[0].hidden[0].tolist() == [False] * 6 + [True] * 3  # causal over new tokens


def test_extend_runs_split_where_the_image_spans_differ():
    spans = [[1, 3], [1, 3], [2, 3], [0, 0], [5, 5]]  # the last two: no span either way
    runs = _runs_of([0] * 5, [4] * 5, spans)
    assert [r.num_requests for r in runs] == [2, 1, 2]
    assert runs[0].hidden[0, 2]  # position 0 is outside the span: causal
    assert not runs[0].hidden[1, 2]  # position 1 sees position 2 inside the span


def test_extend_torch_over_runs_matches_each_request_alone():
    generator = torch.Generator().manual_seed(4)
    prefix_lens, extend_lens = [6, 6, 6, 0, 6], [5, 5, 5, 7, 5]
    spans = [[7, 10], [7, 10], [7, 10], [0, 0], [0, 0]]
    totals = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    paged = build_paged_kv(
        seq_lens=totals,
        num_kv_heads=2,
        head_dim=16,
        v_head_dim=16,
        page_size=4,
        dtype=torch.float32,
        generator=generator,
    )
    q = torch.randn((sum(extend_lens), 4, 16), generator=generator)
    k = torch.cat([dk[p:] for dk, p in zip(paged.dense_k, prefix_lens, strict=True)])
    v = torch.cat([dv[p:] for dv, p in zip(paged.dense_v, prefix_lens, strict=True)])
    starts = [sum(extend_lens[:i]) for i in range(len(extend_lens))]
    caches = dict(k_cache=paged.k_cache, v_cache=paged.v_cache, req_to_token=paged.req_to_token)
    out = extend_attention_torch(
        q=q, k=k, v=v, **caches, req_pool_indices=paged.req_pool_indices,
        prefix_lens=torch.tensor(prefix_lens), extend_lens=torch.tensor(extend_lens),
        extend_start_loc=torch.tensor(starts), sm_scale=0.25, image_spans=torch.tensor(spans),
    )  # fmt: skip
    for i, start in enumerate(starts):
        rows = slice(start, start + extend_lens[i])
        alone = extend_attention_torch(
            q=q[rows], k=k[rows], v=v[rows], **caches,
            req_pool_indices=paged.req_pool_indices[i : i + 1],
            prefix_lens=torch.tensor(prefix_lens[i : i + 1]),
            extend_lens=torch.tensor(extend_lens[i : i + 1]), extend_start_loc=torch.tensor([0]),
            sm_scale=0.25, image_spans=torch.tensor(spans[i : i + 1]),
        )  # fmt: skip
        assert max_rel_error(out[rows], alone) <= TOLERANCE


def test_write_kv_stores_what_store_kv_torch_stores():
    generator = torch.Generator().manual_seed(5)
    k = torch.randn((3, 2, 8), generator=generator)
    v = torch.randn((3, 2, 8), generator=generator)
    locations = torch.tensor([7, 1, 4])
    caches = [(torch.zeros(9, 2, 8), torch.zeros(9, 2, 8)) for _ in range(2)]
    store_kv_torch(k=k, v=v, k_cache=caches[0][0], v_cache=caches[0][1], out_cache_loc=locations)
    write_kv(k=k, v=v, k_cache=caches[1][0], v_cache=caches[1][1], locations=locations)
    assert torch.equal(caches[0][0], caches[1][0])
    assert torch.equal(caches[0][1], caches[1][1])


def test_an_extend_step_runs_its_one_token_requests_as_one_decode_and_equals_the_checked_path():
    from vla_sched.model.layers.attention import AttentionMetadata, paged_attention

    generator = torch.Generator().manual_seed(7)
    seq_lens, extend = [12, 7, 30, 30, 9], [5, 1, 1, 4, 1]  # a prefill among running decodes
    paged = build_paged_kv(
        seq_lens=seq_lens,
        num_kv_heads=2,
        head_dim=16,
        v_head_dim=16,
        page_size=4,
        dtype=torch.float32,
        generator=generator,
    )
    new = [slice(s - e, s) for s, e in zip(seq_lens, extend, strict=True)]
    k = torch.cat([dense[rows] for dense, rows in zip(paged.dense_k, new, strict=True)])
    v = torch.cat([dense[rows] for dense, rows in zip(paged.dense_v, new, strict=True)])
    q = torch.randn((k.shape[0], 4, 16), generator=generator)
    outputs = {}
    for checked in (True, False):  # the checked per-call path, then the runner's plan
        meta = AttentionMetadata.build(
            is_decode=False,
            req_to_token=paged.req_to_token,
            req_pool_indices=paged.req_pool_indices,
            prefix_lens=torch.tensor([s - e for s, e in zip(seq_lens, extend, strict=True)]),
            extend_lens=torch.tensor(extend),
            out_cache_loc=torch.cat([s[rows] for s, rows in zip(paged.slots, new, strict=True)]),
            device=torch.device('cpu'),
            backend='torch',
            check_values=checked,
        )
        assert (meta.torch_plan is None) == checked
        outputs[checked] = paged_attention(
            q=q,
            k=k,
            v=v,
            k_cache=paged.k_cache.clone(),
            v_cache=paged.v_cache.clone(),
            meta=meta,
            sm_scale=0.25,
        )
    plan = meta.torch_plan
    assert plan.decode_rows.tolist() == [5, 6, 11]  # the token rows of the one-token requests
    assert [(run.num_requests, run.extend_len) for run in plan.extend] == [(1, 5), (1, 4)]
    assert max_rel_error(outputs[False], outputs[True]) < TOLERANCE
