"""Tile, warp and pipeline choices of the attention kernels, and the decode split rule.

Pure Python (no Triton import): the launchers and ``choose_num_kv_splits`` read it, and so
do the benchmark's sweep and the sm_90 compile check.

Decode (``DecodeConfig``), keyed by head dim, GQA group and dtype; the batch and the
context length choose the split count (``decode_attention.choose_num_kv_splits``), a device
tensor
so a captured graph follows the lengths it replays:

- one program per (request, KV head, split) loads its whole GQA group's queries
  (``block_h`` = the group rounded up to a power of two, 16 to 64 rows: 16 is the smallest
  M of an MMA), so each KV head's K/V is read once per request, as SGLang's grouped decode
  kernel does;
- ``block_n`` 64 K/V rows per tile for head dims up to 128 (32 above), 4 warps;
- ``num_stages`` 3: the K/V tile addresses come from the slot table, and Triton's pipeliner
  puts a load and the load it depends on in different stages only from 3 stages on (with 2,
  the sm_90 TTGIR shows the slot ids loaded synchronously inside the loop, a full memory
  latency per tile); at 3 the slot ids run two tiles ahead and K/V one;
- ``programs_per_sm``: stage-1 programs one SM holds at once, from the registers and shared
  memory of the sm_90 build (test/kernels/sm90_compile.py checks it): with 16 query heads,
  80 registers x 128 threads and about 39 KB of shared memory leave room for 5.

Extend (``ExtendConfig``), keyed by head dim, GQA group and dtype: 128 query rows by 64
keys per tile, 8 warps (4 for head dims up to 64), after SGLang's sm_90 extend tiles;
``num_stages`` 3 for the same slot-table indirection in the prefix loop; and the rows of a
program are the whole GQA group of ``128 / group`` tokens when that is at least
``MIN_PACKED_TOKENS`` tokens, so the prefix K/V of a KV head is streamed once for its group.

Off CUDA (the Triton interpreter) the tiles are small so that the tests' short sequences
cross several tiles and splits; fp32 (exact fp32 dots) gets narrower tiles and more warps so
that it does not spill registers on sm_90.
"""

from __future__ import annotations

from dataclasses import dataclass

# A request gets at most one KV split per this many tokens, so short ones are not split.
MIN_TOKENS_PER_SPLIT = 256
# Query rows of a decode program: at least one MMA's M, at most one GQA group this large.
MIN_HEADS_PER_PROGRAM = 16
MAX_HEADS_PER_PROGRAM = 64
# Packed extend programs hold at least this many tokens of each of their group's heads.
MIN_PACKED_TOKENS = 4
# Stage-1 programs an sm_90 SM holds with the rule's bf16 tiles (64 rows, 4 warps, 3 stages,
# head dim up to 128), by query heads per program: 80, 128 and 210 registers per thread and
# 39, 46 and 82 KB of shared memory in the sm_90 build (test/kernels/sm90_compile.py).
RESIDENT_DECODE_PROGRAMS = {16: 5, 32: 4, 64: 2}


def _next_power_of_2(value: int) -> int:
    return 1 << max(value - 1, 0).bit_length()


@dataclass(frozen=True, slots=True)
class DecodeConfig:
    """Stage-1 launch of the decode kernel.

    ``block_h`` query heads of one KV head per program, ``block_n`` K/V rows per tile,
    splits aligned to ``split_align`` positions, ``programs_per_sm`` resident programs.
    """

    block_h: int
    block_n: int
    split_align: int
    num_warps: int
    num_stages: int
    programs_per_sm: int

    def __post_init__(self) -> None:
        for name in ('block_h', 'block_n', 'split_align', 'num_warps'):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f'{name} must be a power of two, got {value}')
        if self.split_align % self.block_n:
            raise ValueError(
                f'split_align {self.split_align} must be a multiple of block_n {self.block_n}'
            )
        if self.num_stages < 1 or self.programs_per_sm < 1:
            raise ValueError('num_stages and programs_per_sm must be >= 1')

    def with_tiles(self, *, block_n: int, num_warps: int, num_stages: int, programs_per_sm: int):
        """The same head blocking with other tiles (``split_align`` follows ``block_n``)."""
        return DecodeConfig(self.block_h, block_n, block_n, num_warps, num_stages, programs_per_sm)


def decode_heads_per_program(group: int) -> int:
    """Query heads a decode program holds: its GQA group as a power of two, 16 to 64."""
    return min(max(_next_power_of_2(group), MIN_HEADS_PER_PROGRAM), MAX_HEADS_PER_PROGRAM)


def decode_config(*, head_dim: int, group: int, itemsize: int, on_gpu: bool) -> DecodeConfig:
    """The decode rule (module docstring); ``itemsize`` 4 is fp32 with exact dots."""
    block_h = decode_heads_per_program(group)
    if not on_gpu:
        return DecodeConfig(block_h, 8, 8, 4, 1, 1)
    if itemsize == 4:
        return DecodeConfig(block_h, 32, 64, 8, 2, 2)
    if head_dim > 128:
        return DecodeConfig(block_h, 32, 32, 4, 3, 2)
    return DecodeConfig(block_h, 64, 64, 4, 3, RESIDENT_DECODE_PROGRAMS[block_h])


def decode_alternatives(config: DecodeConfig) -> dict[str, DecodeConfig]:
    """Tiles the benchmark times against the rule's on bf16/fp16: the previous launch (64
    rows, 2 stages), SGLang's grouped decode tiles (32 rows, 2 stages), a deeper pipeline
    and wider tiles. Resident programs come from their sm_90 builds at 16 query heads."""
    return {
        'n64 w4 s2 (before)': config.with_tiles(
            block_n=64, num_warps=4, num_stages=2, programs_per_sm=5
        ),
        'n32 w4 s2 (SGLang)': config.with_tiles(
            block_n=32, num_warps=4, num_stages=2, programs_per_sm=8
        ),
        'n64 w4 s4': config.with_tiles(block_n=64, num_warps=4, num_stages=4, programs_per_sm=5),
        'n128 w8 s3': config.with_tiles(block_n=128, num_warps=8, num_stages=3, programs_per_sm=3),
    }


@dataclass(frozen=True, slots=True)
class ExtendConfig:
    """Launch of the extend kernel: ``block_m`` query rows (``heads_per_program`` heads of
    one KV group times ``block_m // heads_per_program`` tokens) by ``block_n`` keys."""

    block_m: int
    block_n: int
    heads_per_program: int
    num_warps: int
    num_stages: int

    def __post_init__(self) -> None:
        for name in ('block_m', 'block_n', 'num_warps'):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f'{name} must be a power of two, got {value}')
        if not 1 <= self.heads_per_program <= self.block_m:
            raise ValueError(
                f'heads_per_program must be in 1..block_m, got {self.heads_per_program}'
            )
        if self.num_stages < 1:
            raise ValueError('num_stages must be >= 1')

    @property
    def tokens_per_program(self) -> int:
        return self.block_m // self.heads_per_program


def extend_heads_per_program(group: int, block_m: int) -> int:
    """The whole GQA group when ``block_m`` rows still hold ``MIN_PACKED_TOKENS`` tokens of
    each of its heads, else one head per program."""
    return group if group > 1 and block_m // group >= MIN_PACKED_TOKENS else 1


def extend_config(*, head_dim: int, group: int, itemsize: int, on_gpu: bool) -> ExtendConfig:
    """The extend rule (module docstring); ``itemsize`` 4 is fp32 with exact dots."""
    if not on_gpu:
        block_m, block_n, num_warps, num_stages = 16, 8, 4, 1
    elif itemsize == 4:
        block_m, block_n, num_warps, num_stages = 32, 16, 8, 1
    elif head_dim <= 128:
        block_m, block_n, num_warps, num_stages = 128, 64, 4 if head_dim <= 64 else 8, 3
    else:
        block_m, block_n, num_warps, num_stages = 64, 64, 8, 2
    heads = extend_heads_per_program(group, block_m)
    return ExtendConfig(block_m, block_n, heads, num_warps, num_stages)


def extend_alternatives(config: ExtendConfig) -> dict[str, ExtendConfig]:
    """Launches the benchmark times against the rule's on bf16/fp16: the previous one (64x64,
    one head, 1 stage), the rule's tiles with one head per program, SGLang's sm_90 extend
    launch (128x64, 8 warps, 1 stage) and the rule with 2 stages."""
    return {
        'm64 n64 h1 s1 (before)': ExtendConfig(64, 64, 1, config.num_warps, 1),
        'm128 n64 h1 s1 (SGLang)': ExtendConfig(128, 64, 1, 8, 1),
        'rule, one head': ExtendConfig(
            config.block_m, config.block_n, 1, config.num_warps, config.num_stages
        ),
        'rule, 2 stages': ExtendConfig(
            config.block_m, config.block_n, config.heads_per_program, config.num_warps, 2
        ),
    }
