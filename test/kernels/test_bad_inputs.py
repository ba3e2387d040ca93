"""Bad input gets a clear exception naming the offending tensor, request or slot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paged_kv_cases import build_paged_kv

from vla_sched.kernels.attention_configs import DecodeConfig, ExtendConfig
from vla_sched.kernels.decode_attention import decode_attention, decode_attention_torch
from vla_sched.kernels.extend_attention import extend_attention, extend_attention_torch
from vla_sched.kernels.store_kv import store_kv, store_kv_torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def _decode_inputs(seq_lens=(5, 9)):
    paged = build_paged_kv(
        seq_lens=list(seq_lens),
        num_kv_heads=2,
        head_dim=64,
        v_head_dim=64,
        page_size=4,
        dtype=torch.float32,
        generator=torch.Generator().manual_seed(0),
    )
    batch_size = len(seq_lens)
    return dict(
        q=torch.randn((batch_size, 4, 64)),
        k_cache=paged.k_cache,
        v_cache=paged.v_cache,
        req_to_token=paged.req_to_token,
        req_pool_indices=paged.req_pool_indices,
        seq_lens=torch.tensor(seq_lens),
        sm_scale=0.125,
    )


def _decode_buffers(batch_size=2, max_kv_splits=2):
    return dict(
        out=torch.empty((batch_size, 4, 64)),
        attn_logits=torch.empty((batch_size, 4, max_kv_splits, 64)),
        attn_lse=torch.empty((batch_size, 4, max_kv_splits)),
        num_kv_splits=torch.ones(batch_size, dtype=torch.int32),
    )


def test_decode_rejects_query_dtype_that_differs_from_the_cache():
    inputs = _decode_inputs()
    inputs['q'] = inputs['q'].half()
    with pytest.raises(TypeError, match=r'q has dtype torch\.float16 but k_cache'):
        decode_attention_torch(**inputs)


def test_decode_rejects_tensors_on_different_devices():
    inputs = _decode_inputs()
    inputs['seq_lens'] = inputs['seq_lens'].to('meta')
    with pytest.raises(ValueError, match='seq_lens is on meta'):
        decode_attention(**inputs, **_decode_buffers())


def test_decode_rejects_layouts_the_kernel_cannot_take():
    inputs = _decode_inputs()
    inputs['k_cache'] = inputs['k_cache'].transpose(0, 1).contiguous().transpose(0, 1)
    with pytest.raises(ValueError, match='k_cache must be contiguous'):
        decode_attention(**inputs, **_decode_buffers())
    inputs = _decode_inputs()
    inputs['q'] = torch.randn((2, 64, 4)).transpose(1, 2)
    with pytest.raises(ValueError, match='q must have stride 1'):
        decode_attention(**inputs, **_decode_buffers())


def test_decode_rejects_query_heads_that_are_not_a_multiple_of_kv_heads():
    inputs = _decode_inputs()
    inputs['q'] = torch.randn((2, 3, 64))
    with pytest.raises(ValueError, match=r'query heads \(3\) must be a positive multiple'):
        decode_attention_torch(**inputs)


def test_decode_rejects_wrong_scratch_buffers():
    buffers = _decode_buffers()
    buffers['attn_lse'] = torch.empty((2, 4, 2), dtype=torch.float16)
    with pytest.raises(TypeError, match='attn_lse must have dtype'):
        decode_attention(**_decode_inputs(), **buffers)
    buffers = _decode_buffers()
    buffers['num_kv_splits'] = torch.ones(2, dtype=torch.int64)
    with pytest.raises(TypeError, match='num_kv_splits must have dtype'):
        decode_attention(**_decode_inputs(), **buffers)
    buffers = _decode_buffers()
    buffers['attn_lse'] = torch.empty((2, 4, 3))
    with pytest.raises(ValueError, match='attn_lse must have shape'):
        decode_attention(**_decode_inputs(), **buffers)


def test_decode_debug_mode_names_the_request_reading_a_slot_out_of_range():
    inputs = _decode_inputs()
    row = int(inputs['req_pool_indices'][1])
    inputs['req_to_token'][row, 3] = inputs['k_cache'].shape[0]
    with pytest.raises(IndexError, match=rf'request 1: req_to_token\[{row}, 3\]'):
        decode_attention(**inputs, **_decode_buffers(), debug=True)
    with pytest.raises(IndexError, match='request 1'):
        decode_attention_torch(**inputs)


def test_decode_debug_mode_follows_the_environment_variable_at_call_time(monkeypatch):
    inputs = _decode_inputs()
    inputs['seq_lens'][0] = inputs['req_to_token'].shape[1] + 1
    monkeypatch.setenv('VLA_SCHED_KERNEL_DEBUG', '1')
    with pytest.raises(IndexError, match='seq_lens'):
        decode_attention(**inputs, **_decode_buffers())


def test_decode_debug_mode_rejects_split_counts_out_of_range():
    buffers = _decode_buffers(max_kv_splits=2)
    buffers['num_kv_splits'][1] = 3
    with pytest.raises(IndexError, match=r'num_kv_splits\[1\] = 3'):
        decode_attention(**_decode_inputs(), **buffers, debug=True)


def _extend_inputs():
    paged = build_paged_kv(
        seq_lens=[6, 4],
        num_kv_heads=1,
        head_dim=64,
        v_head_dim=64,
        page_size=2,
        dtype=torch.float32,
        generator=torch.Generator().manual_seed(1),
    )
    return dict(
        q=torch.randn((5, 2, 64)),
        k=torch.randn((5, 1, 64)),
        v=torch.randn((5, 1, 64)),
        k_cache=paged.k_cache,
        v_cache=paged.v_cache,
        req_to_token=paged.req_to_token,
        req_pool_indices=paged.req_pool_indices,
        prefix_lens=torch.tensor([3, 2]),
        extend_lens=torch.tensor([3, 2]),
        extend_start_loc=torch.tensor([0, 3]),
        sm_scale=0.125,
    )


def test_extend_debug_mode_rejects_offsets_that_are_not_the_cumsum():
    inputs = _extend_inputs()
    inputs['extend_start_loc'] = torch.tensor([0, 2])
    out = torch.empty((5, 2, 64))
    with pytest.raises(ValueError, match='extend_start_loc'):
        extend_attention(**inputs, max_extend_len=3, out=out, debug=True)
    with pytest.raises(ValueError, match='extend_start_loc'):
        extend_attention_torch(**inputs)


def test_extend_debug_mode_rejects_lengths_past_max_extend_len_and_bad_spans():
    out = torch.empty((5, 2, 64))
    with pytest.raises(IndexError, match=r'extend_lens\[0\] = 3'):
        extend_attention(**_extend_inputs(), max_extend_len=2, out=out, debug=True)
    with pytest.raises(ValueError, match='request 1: image span'):
        extend_attention_torch(**_extend_inputs(), image_spans=torch.tensor([[0, 0], [4, 3]]))


def test_extend_rejects_a_negative_prefix_slot():
    inputs = _extend_inputs()
    inputs['req_to_token'][int(inputs['req_pool_indices'][0]), 1] = -1
    with pytest.raises(IndexError, match='request 0'):
        extend_attention_torch(**inputs)


def test_extend_rejects_new_kv_shapes_that_do_not_match_the_queries():
    inputs = _extend_inputs()
    inputs['k'] = torch.randn((4, 1, 64))
    with pytest.raises(ValueError, match=r'k must have shape \(5, 1, 64\)'):
        extend_attention(**inputs, max_extend_len=3, out=torch.empty((5, 2, 64)))


def test_extend_rejects_heads_per_program_other_than_one_or_the_group():
    out = torch.empty((5, 2, 64))
    config = ExtendConfig(16, 8, 3, 4, 1)  # the group here is 2
    with pytest.raises(ValueError, match='1 or the GQA group 2, got 3'):
        extend_attention(**_extend_inputs(), max_extend_len=3, out=out, config=config)


def test_launch_configs_reject_tiles_the_kernels_cannot_take():
    with pytest.raises(ValueError, match='block_n must be a power of two, got 48'):
        DecodeConfig(16, 48, 48, 4, 3, 5)
    with pytest.raises(ValueError, match='split_align 32 must be a multiple of block_n 64'):
        DecodeConfig(16, 64, 32, 4, 3, 5)
    with pytest.raises(ValueError, match='num_stages and programs_per_sm'):
        DecodeConfig(16, 64, 64, 4, 3, 0)
    with pytest.raises(ValueError, match=r'heads_per_program must be in 1..block_m, got 32'):
        ExtendConfig(16, 8, 32, 4, 1)


def test_store_kv_rejects_out_of_range_and_duplicate_slots():
    k_cache = torch.zeros((4, 1, 64))
    v_cache = torch.zeros((4, 1, 64))
    k = torch.randn((2, 1, 64))
    with pytest.raises(IndexError, match=r'out_cache_loc\[1\] = 4'):
        store_kv(
            k=k,
            v=k,
            k_cache=k_cache,
            v_cache=v_cache,
            out_cache_loc=torch.tensor([0, 4]),
            debug=True,
        )
    with pytest.raises(ValueError, match='slot 2 more than once'):
        store_kv_torch(
            k=k, v=k, k_cache=k_cache, v_cache=v_cache, out_cache_loc=torch.tensor([2, 2])
        )
    with pytest.raises(TypeError, match=r'k has dtype torch\.float16'):
        store_kv_torch(
            k=k.half(), v=k, k_cache=k_cache, v_cache=v_cache, out_cache_loc=torch.tensor([0, 1])
        )
    assert not k_cache.any()


@pytest.mark.slow
def test_torch_backend_imports_and_runs_without_triton():
    script = (
        'import sys, torch\n'
        "sys.modules['triton'] = None\n"
        'from vla_sched.kernels.decode_attention import run_decode_attention\n'
        'k = torch.randn(4, 1, 8)\n'
        'out = run_decode_attention(q=torch.randn(1, 2, 8), k_cache=k, v_cache=k,\n'
        '    req_to_token=torch.tensor([[3, 1, 0, 2]], dtype=torch.int32),\n'
        '    req_pool_indices=torch.tensor([0]), seq_lens=torch.tensor([3]), sm_scale=0.3)\n'
        'assert out.shape == (1, 2, 8)\n'
    )
    result = subprocess.run(
        [sys.executable, '-c', script],
        cwd=REPO_ROOT,
        env={'PYTHONPATH': str(REPO_ROOT), 'PATH': '/usr/bin:/bin'},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
