"""Compiles every Triton kernel ahead of time for sm_90 (H100/H200) without a GPU.

The interpreter accepts programs that the GPU compiler rejects (dot shapes below 16,
some type mixes), so the interpreter tests alone do not prove the kernels build for a GPU.
Triton's compiler and its bundled ptxas run without a driver: this script compiles each
kernel with the tile sizes its launcher picks on CUDA and prints one JSON line per variant
with the registers and stack (spill) bytes ptxas reports.

Run with ``TRITON_INTERPRET`` unset (the kernels must be real JIT functions):
``python test/kernels/sm90_compile.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler import compile as triton_compile

CUDA = torch.device('cuda')
TORCH_DTYPES = {'bf16': torch.bfloat16, 'fp16': torch.float16, 'fp32': torch.float32}
POINTER_TYPES = {
    'req_to_token_ptr': '*i32',
    'num_kv_splits_ptr': '*i32',
    'attn_logits_ptr': '*fp32',
    'attn_lse_ptr': '*fp32',
}
INDEX_POINTERS = (
    'req_pool_indices_ptr',
    'seq_lens_ptr',
    'prefix_lens_ptr',
    'extend_lens_ptr',
    'extend_start_loc_ptr',
    'image_spans_ptr',
    'loc_ptr',
)


def _signature(fn, constexprs: dict, dtype: str):
    signature, constants, attrs = {}, {}, {}
    for index, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = 'constexpr'
            constants[(index,)] = constexprs[name]
            continue
        if name in POINTER_TYPES:
            signature[name] = POINTER_TYPES[name]
        elif name in INDEX_POINTERS:
            signature[name] = '*i64'
        elif name.endswith('_ptr'):
            signature[name] = f'*{dtype}'
        else:
            signature[name] = 'fp32' if name.startswith('sm_scale') else 'i32'
        if name.endswith('_ptr') or name.startswith('stride'):
            attrs[(index,)] = [['tt.divisibility', 16]]
    return signature, constants, attrs


def compile_sm90(label: str, fn, constexprs: dict, dtype: str, num_warps: int, num_stages: int):
    """Compiles one variant and returns its ptxas resource usage."""
    signature, constants, attrs = _signature(fn, constexprs, dtype)
    source = ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs)
    options = dict(num_warps=num_warps, num_stages=num_stages)
    kernel = triton_compile(source, target=GPUTarget('cuda', 90, 32), options=options)
    tool = Path(triton.__file__).parent / 'backends' / 'nvidia' / 'bin' / 'cuobjdump'
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / 'kernel.cubin'
        cubin.write_bytes(kernel.asm['cubin'])
        usage = subprocess.run(
            [str(tool), '--dump-resource-usage', str(cubin)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    found = re.search(r'REG:(\d+) STACK:(\d+)', usage)
    return dict(label=label, dtype=dtype, registers=int(found[1]), stack=int(found[2]))


def _decode_variants():
    from vla_sched.kernels import _decode_attention_jit as jit
    from vla_sched.kernels.decode_attention import HEADS_PER_PROGRAM

    variants = [(64, 4, 'bf16'), (80, 4, 'bf16'), (96, 2, 'bf16'), (128, 1, 'bf16')]
    variants += [(128, 32, 'fp16'), (128, 4, 'fp32')]
    for head_dim, group, dtype in variants:
        block_n, split_align, num_warps = jit._tile_sizes(CUDA, TORCH_DTYPES[dtype])
        block_d = triton.next_power_of_2(head_dim)
        constexprs = dict(
            NUM_Q_HEADS=8 * group,
            NUM_KV_HEADS=8,
            GROUP=group,
            NUM_HEAD_BLOCKS=triton.cdiv(group, HEADS_PER_PROGRAM),
            HEAD_DIM=head_dim,
            V_HEAD_DIM=head_dim,
            MAX_KV_SPLITS=8,
            SPLIT_ALIGN=split_align,
            BLOCK_H=HEADS_PER_PROGRAM,
            BLOCK_N=block_n,
            BLOCK_D=block_d,
            BLOCK_DV=block_d,
            DOT_FP32=dtype == 'fp32',
        )
        label = f'decode_stage1 d={head_dim} group={group}'
        yield label, jit._decode_stage1_kernel, constexprs, dtype, num_warps, 2
    split_align = jit._tile_sizes(CUDA, torch.bfloat16)[1]
    stage2 = dict(NUM_Q_HEADS=32, V_HEAD_DIM=80, MAX_KV_SPLITS=8, SPLIT_ALIGN=split_align)
    yield 'decode_stage2 d=80', jit._decode_stage2_kernel, dict(stage2, BLOCK_DV=128), 'bf16', 4, 2


def _extend_variants():
    from vla_sched.kernels import _extend_attention_jit as jit

    variants = [(64, True, 'bf16'), (128, False, 'bf16'), (128, True, 'bf16')]
    variants += [(80, True, 'fp16'), (128, True, 'fp32')]
    for head_dim, spans, dtype in variants:
        block_m, block_n, num_warps = jit._block_sizes(CUDA, TORCH_DTYPES[dtype], head_dim)
        block_d = triton.next_power_of_2(head_dim)
        constexprs = dict(
            NUM_KV_HEADS=8,
            GROUP=4,
            HEAD_DIM=head_dim,
            V_HEAD_DIM=head_dim,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_D=block_d,
            BLOCK_DV=block_d,
            HAS_IMAGE_SPANS=spans,
            DOT_FP32=dtype == 'fp32',
        )
        label = f'extend d={head_dim} spans={spans}'
        yield label, jit._extend_kernel, constexprs, dtype, num_warps, 1


def _store_variants():
    from vla_sched.kernels import _store_kv_jit as jit

    constexprs = dict(
        NUM_KV_HEADS=8, HEAD_DIM=80, V_HEAD_DIM=80, BLOCK_H=8, BLOCK_D=128, BLOCK_DV=128
    )
    yield 'store_kv d=80', jit._store_kv_kernel, constexprs, 'bf16', 4, 1


def main() -> int:
    if os.environ.get('TRITON_INTERPRET', '0') not in ('', '0'):
        print('unset TRITON_INTERPRET: the kernels must be JIT functions', file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    for variant in (*_decode_variants(), *_extend_variants(), *_store_variants()):
        print(json.dumps(compile_sm90(*variant)), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
