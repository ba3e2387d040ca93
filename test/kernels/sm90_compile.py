"""Compiles every Triton kernel ahead of time for sm_90 (H100/H200) without a GPU.

The interpreter accepts programs that the GPU compiler rejects (dot shapes below 16,
some type mixes), so the interpreter tests alone do not prove the kernels build for a GPU.
Triton's compiler and its bundled ptxas run without a driver: this script compiles each
kernel with the launch configs its rule picks on CUDA (``kernels/attention_configs.py``) and
the alternatives the benchmark times against them, and prints one JSON line per variant
with the Triton version, the registers, stack (spill) bytes and shared memory of the build,
the programs one sm_90 SM holds with them (``residency.resident_programs`` with
``residency.SM90``: the computation the launchers make on a device from the compiled
kernel), and for decode the ``programs_per_sm`` the split rule plans with on an sm_90 device
for this build (``decode_attention.config_for_build``) next to the table's fallback (what it
counts on off CUDA).

Run with ``TRITON_INTERPRET`` unset (the kernels must be real JIT functions):
``python test/kernels/sm90_compile.py``; with the GPU machine's Triton:
``bash test/kernels/gpu_triton_venv.sh`` then ``.venv-gpu-triton/bin/python
test/kernels/sm90_compile.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler import compile as triton_compile

ITEMSIZES = {'bf16': 2, 'fp16': 2, 'fp32': 4}
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
            signature[name] = 'fp32' if name.startswith(('sm_scale', 'eps')) else 'i32'
        if name.endswith('_ptr') or name.startswith('stride'):
            attrs[(index,)] = [['tt.divisibility', 16]]
    return signature, constants, attrs


def compile_sm90(
    label: str,
    fn,
    constexprs: dict,
    dtype: str,
    num_warps: int,
    num_stages: int,
    build_options: dict | None = None,
):
    """Compiles one variant (with the launcher's extra build options, if any) and returns
    its ptxas resource usage and the programs one sm_90 SM holds with it."""
    from vla_sched.kernels.residency import SM90, KernelBuild, resident_programs

    signature, constants, attrs = _signature(fn, constexprs, dtype)
    source = ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs)
    options = dict(num_warps=num_warps, num_stages=num_stages, **(build_options or {}))
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
    build = KernelBuild(
        registers=int(found[1]),
        spills=int(found[2]),
        shared_bytes=int(kernel.metadata.shared),
        num_warps=num_warps,
    )
    return build, dict(
        label=label,
        dtype=dtype,
        triton=triton.__version__,
        registers=build.registers,
        stack=build.spills,
        shared=build.shared_bytes,
        resident=resident_programs(build, SM90),
    )


def _decode_variants():
    from vla_sched.kernels import _decode_attention_jit as jit
    from vla_sched.kernels.attention_configs import decode_alternatives, decode_config

    # openvla-7b's decoder is d=128 group=1 (32 query and 32 KV heads).
    variants = [(64, 4, 'bf16'), (80, 1, 'bf16'), (96, 2, 'bf16'), (128, 1, 'bf16')]
    variants += [(128, 64, 'bf16')]
    variants += [(128, 32, 'fp16'), (128, 4, 'fp32')]
    configs = [
        (
            f'd={d} group={group}',
            d,
            group,
            dtype,
            decode_config(head_dim=d, group=group, itemsize=ITEMSIZES[dtype], on_gpu=True),
        )
        for d, group, dtype in variants
    ]
    rule = decode_config(head_dim=128, group=4, itemsize=2, on_gpu=True)
    configs += [
        (f'd=128 group=4 {name}', 128, 4, 'bf16', config)
        for name, config in decode_alternatives(rule).items()
    ]
    for label, head_dim, group, dtype, config in configs:
        constexprs = jit.stage1_constexprs(
            num_q_heads=8 * group,
            num_kv_heads=8,
            head_dim=head_dim,
            v_head_dim=head_dim,
            max_kv_splits=8,
            config=config,
            dot_fp32=dtype == 'fp32',
        )
        variant = (f'decode_stage1 {label}', jit._decode_stage1_kernel, constexprs, dtype)
        yield (*variant, config.num_warps, config.num_stages), config
    stage2 = dict(NUM_Q_HEADS=32, V_HEAD_DIM=80, MAX_KV_SPLITS=8, SPLIT_ALIGN=rule.split_align)
    variant = ('decode_stage2 d=80', jit._decode_stage2_kernel, dict(stage2, BLOCK_DV=128))
    yield (*variant, 'bf16', jit.STAGE2_WARPS, jit.STAGE2_STAGES), None


def _extend_variants():
    from vla_sched.kernels import _extend_attention_jit as jit
    from vla_sched.kernels.attention_configs import extend_alternatives, extend_config

    variants = [(64, 4, True, 'bf16'), (128, 1, False, 'bf16'), (128, 4, True, 'bf16')]
    # openvla-7b's OFT pass: one head per KV head, every request's span over its sequence.
    variants += [(128, 1, True, 'bf16'), (80, 4, True, 'fp16'), (128, 4, True, 'fp32')]
    # pi0 / pi0.5: Gemma's head_dim 256, 8 query heads on one KV head, the prefix's span and
    # the denoising suffix's actions both ways.
    variants += [(256, 8, True, 'bf16')]
    configs = [
        (
            f'd={d} group={group} spans={spans}',
            d,
            group,
            spans,
            dtype,
            extend_config(head_dim=d, group=group, itemsize=ITEMSIZES[dtype], on_gpu=True),
        )
        for d, group, spans, dtype in variants
    ]
    rule = extend_config(head_dim=128, group=4, itemsize=2, on_gpu=True)
    configs += [
        (f'd=128 group=4 {name}', 128, 4, False, 'bf16', config)
        for name, config in extend_alternatives(rule).items()
    ]
    for label, head_dim, group, spans, dtype, config in configs:
        block_d = triton.next_power_of_2(head_dim)
        constexprs = dict(
            NUM_KV_HEADS=8,
            GROUP=group,
            HEADS_PER_PROGRAM=config.heads_per_program,
            HEAD_DIM=head_dim,
            V_HEAD_DIM=head_dim,
            BLOCK_M=config.block_m,
            BLOCK_N=config.block_n,
            BLOCK_D=block_d,
            BLOCK_DV=block_d,
            HAS_IMAGE_SPANS=spans,
            DOT_FP32=dtype == 'fp32',
        )
        variant = (f'extend {label}', jit._extend_kernel, constexprs, dtype)
        yield (*variant, config.num_warps, config.num_stages), None


def _store_variants():
    from vla_sched.kernels import _store_kv_jit as jit

    constexprs = dict(
        NUM_KV_HEADS=8, HEAD_DIM=80, V_HEAD_DIM=80, BLOCK_H=8, BLOCK_D=128, BLOCK_DV=128
    )
    yield ('store_kv d=80', jit._store_kv_kernel, constexprs, 'bf16', 4, 1), None


def _decoder_variants():
    """The decoder's kernels at openvla-7b's sizes (hidden 4096, inner 11008, 32 + 32 heads
    of 128) with the blocks and warps their launchers pick, and one fp16/fp32 build each."""
    import triton

    from vla_sched.kernels import _activation_jit, _rms_norm_jit, _rotary_jit

    norms = [(4096, False, 'bf16'), (4096, True, 'bf16'), (4096, True, 'fp32'), (40, True, 'fp16')]
    for hidden, residual, dtype in norms:
        block = triton.next_power_of_2(hidden)
        constexprs = dict(HIDDEN=hidden, BLOCK=block, HAS_RESIDUAL=residual)
        label = f'rms_norm hidden={hidden} residual={residual}'
        warps = _rms_norm_jit.norm_num_warps(block)
        yield (label, _rms_norm_jit._rms_norm_kernel, constexprs, dtype, warps, 1), None
    for inner, dtype in [(11008, 'bf16'), (11008, 'fp32'), (37, 'fp16')]:
        block = _activation_jit.activation_block(inner)
        constexprs = dict(INNER=inner, BLOCK=block)
        warps = max(1, min(4, block // 256))
        kernel = _activation_jit._silu_and_mul_kernel
        yield (f'silu_and_mul inner={inner}', kernel, constexprs, dtype, warps, 1), None
    for num_heads, head_dim, dtype in [(64, 128, 'bf16'), (64, 128, 'fp32'), (6, 24, 'fp16')]:
        block_h, block_half = _rotary_jit.rotary_blocks(num_heads, head_dim)
        constexprs = dict(
            NUM_HEADS=num_heads, HALF_DIM=head_dim // 2, BLOCK_H=block_h, BLOCK_HALF=block_half
        )
        label = f'rotary heads={num_heads} d={head_dim}'
        kernel, options = _rotary_jit._rotary_kernel, _rotary_jit.ROTARY_BUILD_OPTIONS
        yield (label, kernel, constexprs, dtype, 4, 1, options), None


def main() -> int:
    if os.environ.get('TRITON_INTERPRET', '0') not in ('', '0'):
        print('unset TRITON_INTERPRET: the kernels must be JIT functions', file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    variants = (*_decode_variants(), *_extend_variants(), *_store_variants())
    from vla_sched.kernels.decode_attention import config_for_build
    from vla_sched.kernels.residency import SM90

    for variant, config in (*variants, *_decoder_variants()):
        build, result = compile_sm90(*variant)
        if config is not None:
            planned = config_for_build(config, build, SM90)
            result['planned_programs_per_sm'] = planned.programs_per_sm
            result['fallback_programs_per_sm'] = config.programs_per_sm
        print(json.dumps(result), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
