"""Every kernel compiles for sm_90 (H100/H200) with Triton's bundled ptxas, no GPU needed,
with the launch configs its rule picks on CUDA and the benchmark's alternatives, keeps
everything in registers (no spills), and the decode split rule plans with the programs an
SM holds with the build (the computation the launchers make on a device).

It compiles with the Triton of the GPU benchmark machine (3.6.0, through
``gpu_triton_venv.sh``) whenever pip can install it here, else with the local Triton."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / 'sm90_compile.py'
GPU_TRITON = '3.6.0'


def _gpu_triton_python() -> str | None:
    """The venv with the GPU machine's Triton (made if missing), or None where pip cannot
    install it."""
    made = subprocess.run(
        ['bash', str(HERE / 'gpu_triton_venv.sh')],
        env={**os.environ, 'GPU_TRITON': GPU_TRITON},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return made.stdout.strip().splitlines()[-1] if made.returncode == 0 else None


def test_kernels_compile_for_sm90_without_spilling_and_decode_plans_with_its_build():
    python = _gpu_triton_python() or sys.executable
    env = {key: value for key, value in os.environ.items() if key != 'TRITON_INTERPRET'}
    result = subprocess.run(
        [python, str(SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    variants = [json.loads(line) for line in result.stdout.splitlines()]
    if python != sys.executable:
        assert {variant['triton'] for variant in variants} == {GPU_TRITON}
    labels = {variant['label'].split()[0] for variant in variants}
    attention = {'decode_stage1', 'decode_stage2', 'extend', 'store_kv'}
    assert labels == attention | {'rms_norm', 'silu_and_mul', 'rotary'}
    assert {variant['dtype'] for variant in variants} == {'bf16', 'fp16', 'fp32'}
    for variant in variants:
        assert variant['stack'] == 0, variant
        assert variant['resident'] >= 1, variant
        if variant['label'].startswith('decode_stage1'):
            assert variant['planned_programs_per_sm'] == variant['resident'], variant
    labels = [variant['label'] for variant in variants]
    assert any('(SGLang)' in label for label in labels if label.startswith('decode_stage1'))
    assert any('(before)' in label for label in labels if label.startswith('extend'))
