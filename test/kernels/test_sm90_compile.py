"""Every kernel compiles for sm_90 (H100/H200) with Triton's bundled ptxas, no GPU needed,
with the launch configs its rule picks on CUDA and the benchmark's alternatives, keeps
everything in registers (no spills), and fits on an SM as many decode programs at once as
its config's split rule counts on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / 'sm90_compile.py'


def test_kernels_compile_for_sm90_without_spilling_and_decode_fits_its_resident_count():
    env = {key: value for key, value in os.environ.items() if key != 'TRITON_INTERPRET'}
    result = subprocess.run(
        [sys.executable, str(SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    variants = [json.loads(line) for line in result.stdout.splitlines()]
    labels = {variant['label'].split()[0] for variant in variants}
    attention = {'decode_stage1', 'decode_stage2', 'extend', 'store_kv'}
    assert labels == attention | {'rms_norm', 'silu_and_mul', 'rotary'}
    assert {variant['dtype'] for variant in variants} == {'bf16', 'fp16', 'fp32'}
    for variant in variants:
        assert variant['stack'] == 0, variant
        assert variant['resident'] >= variant.get('claimed_programs_per_sm', 1), variant
    labels = [variant['label'] for variant in variants]
    assert any('(SGLang)' in label for label in labels if label.startswith('decode_stage1'))
    assert any('(before)' in label for label in labels if label.startswith('extend'))
