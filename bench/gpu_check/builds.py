"""The decode kernel's builds on the device, before any timing (the environment part runs
this first): each stage-1 variant the run launches (the rule at the kernels part's and at
openvla-7b's shapes in bf16, the kernels part's fp16, the sweep's alternatives) compiled
once for this device, with its registers, spills, shared memory and the programs an SM
holds, against what the split rule plans with (``decode_attention.device_decode_config``)
and the table's fallback. ``ok``: every variant compiled without spills and the plan is its
build's. The dry run compiles nothing (the interpreter) and lists the fallbacks.

``launched_rows`` turns what a part's process launched (``residency.launched_builds``) into
the report's rows."""

from __future__ import annotations

from typing import Any

# (label, query heads, KV heads, head dim, dtype name): the shapes the run decodes.
DECODE_SHAPES = (
    ('kernels part', 32, 8, 128, 'bfloat16'),
    ('kernels part', 32, 8, 128, 'float16'),
    ('openvla-7b', 32, 32, 128, 'bfloat16'),
)
MAX_KV_SPLITS = 8


def _variants():
    from vla_sched.kernels.attention_configs import decode_alternatives, decode_config

    for label, num_q_heads, num_kv_heads, head_dim, dtype in DECODE_SHAPES:
        group = num_q_heads // num_kv_heads
        rule = decode_config(head_dim=head_dim, group=group, itemsize=2, on_gpu=True)
        yield f'{label} rule', (num_q_heads, num_kv_heads, head_dim, dtype), rule
        if label == 'kernels part' and dtype == 'bfloat16':
            for name, config in decode_alternatives(rule).items():
                yield f'{label} {name}', (num_q_heads, num_kv_heads, head_dim, dtype), config


def check_decode_builds(*, dry_run: bool, progress=print) -> dict[str, Any]:
    """Compiles every decode variant of the run (not on a dry run) and says whether each
    compiled without spills and fits as the split rule plans."""
    import torch

    from vla_sched.kernels import decode_attention as decode
    from vla_sched.kernels.residency import device_limits, resident_programs

    rows = []
    for label, (num_q_heads, num_kv_heads, head_dim, dtype_name), config in _variants():
        row: dict[str, Any] = dict(
            variant=label,
            shape=f'{num_q_heads}/{num_kv_heads} heads, d={head_dim}, {dtype_name}',
            tiles=f'h{config.block_h} n{config.block_n} w{config.num_warps} s{config.num_stages}',
            fallback=config.programs_per_sm,
        )
        if not dry_run:
            dtype = getattr(torch, dtype_name)
            shape = (dtype, num_q_heads, num_kv_heads, head_dim, head_dim, MAX_KV_SPLITS)
            device = torch.device('cuda', torch.cuda.current_device())
            try:
                build = decode.decode_build(config, shape=shape)
            except Exception as error:  # reported; the timing parts go on
                row.update(error=repr(error)[:300], ok=False)
                rows.append(row)
                progress(f'{_line(row)}: NOT BUILT: {row["error"]}')
                continue
            planned = decode.device_decode_config(
                config, dtype=dtype, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                head_dim=head_dim, v_head_dim=head_dim, max_kv_splits=MAX_KV_SPLITS,
                device=device,
            ).programs_per_sm  # fmt: skip
            resident = resident_programs(build, device_limits(device))
            row.update(
                registers=build.registers,
                spills=build.spills,
                shared=build.shared_bytes,
                resident=resident,
                planned=planned,
                ok=build.spills == 0 and planned == resident,
            )
        rows.append(row)
        progress(_line(row))
    compiled = not dry_run
    ok = compiled and all(row['ok'] for row in rows)
    if compiled:
        verdict = 'yes' if ok else 'NO'
        progress(f'kernel builds: every decode variant compiled without spills and fits as '
                 f'planned: {verdict}')  # fmt: skip
    else:
        progress('kernel builds: not compiled (interpreter); the split rule uses the fallbacks')
    return {'compiled': compiled, 'ok': ok, 'rows': rows}


def _line(row: dict[str, Any]) -> str:
    head = f'build {row["variant"]} ({row["shape"]}, {row["tiles"]})'
    if 'registers' not in row:
        return f'{head}: fallback {row["fallback"]} programs/SM'
    return (
        f'{head}: {row["registers"]} registers, {row["spills"]} B spilled, '
        f'{row["shared"]} B shared, {row["resident"]} programs/SM resident, planned '
        f'{row["planned"]} (fallback {row["fallback"]}){"" if row["ok"] else "  <-- NOT OK"}'
    )


def markdown_lines(builds: dict[str, Any], launched: dict[str, list]) -> list[str]:
    """The report's section: the decode builds checked first, then every variant each part
    launched on the GPU."""
    from bench.lib.tables import markdown_table

    lines = ['## Kernel builds', '']
    if builds:
        if builds['compiled']:
            verdict = 'yes' if builds['ok'] else '**no**'
            lines.append(
                f'Every decode variant compiled without spills and fits as planned: {verdict}.'
            )
        else:
            lines.append('Not compiled (the interpreter): the split rule used the fallbacks.')
        keys = ['variant', 'shape', 'tiles', 'registers', 'spills', 'shared', 'resident',
                'planned', 'fallback']  # fmt: skip
        rows = [[row.get(key, '-') for key in keys] for row in builds['rows']]
        lines += ['', markdown_table(keys, rows)]
    rows = [
        [part, entry['kernel'], _variant_text(entry['variant']), entry['registers'],
         entry['spills'], entry['shared_bytes'], entry['num_warps'], entry['resident']]
        for part, entries in launched.items()
        for entry in entries
    ]  # fmt: skip
    if rows:
        keys = ['part', 'kernel', 'variant', 'registers', 'spills', 'shared', 'warps', 'resident']
        lines += ['', 'Launched on the GPU, per part:', '', markdown_table(keys, rows)]
    return lines


def _variant_text(variant: dict[str, Any]) -> str:
    return ' '.join(f'{key}={value}' for key, value in sorted(variant.items()))
