"""The setup command stops with one line naming what to install when a prerequisite is missing,
and says which stage it is in as each starts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

ROOT = Path(__file__).resolve().parents[2]


def _bin_without(tmp_path: Path, missing: set[str]) -> Path:
    """A PATH folder that offers every command of this PATH except ``missing``."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    for folder in os.environ['PATH'].split(os.pathsep):
        if not os.path.isdir(folder) or '.venv' in folder:
            continue
        for name in os.listdir(folder):
            target = Path(folder) / name
            if name in missing or (bin_dir / name).exists() or not os.access(target, os.X_OK):
                continue
            (bin_dir / name).symlink_to(target)
    return bin_dir


def _run_setup(tmp_path: Path, bin_dir: Path, **env) -> subprocess.CompletedProcess:
    # A copy of the script in an empty checkout: it can never touch this checkout's venv.
    (tmp_path / 'repo' / 'scripts').mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / 'scripts' / 'setup.sh', tmp_path / 'repo' / 'scripts' / 'setup.sh')
    return subprocess.run(
        ['bash', str(tmp_path / 'repo' / 'scripts' / 'setup.sh')],
        env={'PATH': str(bin_dir), 'HOME': str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ('missing', 'named'),
    [({'cmake'}, 'cmake'), ({'cc', 'gcc', 'clang'}, 'C compiler'), ({'c++', 'g++'}, 'g++')],
)
def test_setup_names_the_missing_tool_in_one_line(tmp_path, missing, named):
    proc = _run_setup(tmp_path, _bin_without(tmp_path, missing))
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert named in lines[0] and 'install' in lines[0]
    assert not (tmp_path / 'repo' / '.venv').exists()


def test_setup_names_python_headers_when_python_h_is_missing(tmp_path):
    bin_dir = _bin_without(tmp_path, {'python3'})
    fake = bin_dir / 'python3'
    # A Python 3.11 whose include folder has no Python.h.
    fake.write_text(
        '#!/bin/bash\n'
        'if [[ "$*" == *sysconfig* ]]; then echo "$HOME/no-include"; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    proc = _run_setup(tmp_path, bin_dir)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and 'Python.h' in lines[0] and 'python3-dev' in lines[0]


def _python_312(bin_dir: Path) -> None:
    """A python3 that reports 3.12, imports rclpy and has no torch (Ubuntu 24.04's, with a
    ROS 2 from apt); every other command is this interpreter's."""
    fake = bin_dir / 'python3'
    fake.unlink()
    fake.write_text(
        '#!/bin/bash\n'
        'case "$*" in\n'
        '  *version_info*) echo 3.12; exit 0 ;;\n'
        '  *"import rclpy"*) exit 0 ;;\n'
        '  *"import torch"*) exit 1 ;;\n'
        'esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)


def test_setup_asks_for_python_3_11_or_a_sourced_ros_on_another_python(tmp_path):
    bin_dir = _bin_without(tmp_path, set())
    _python_312(bin_dir)
    proc = _run_setup(tmp_path, bin_dir)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert 'Python 3.11 is required without a sourced ROS 2' in lines[0]
    assert 'found Python 3.12' in lines[0] and 'source /opt/ros/' in lines[0]
    assert not (tmp_path / 'repo' / '.venv').exists()


def test_setup_on_a_sourced_ros_python_asks_which_torch_to_install(tmp_path):
    bin_dir = _bin_without(tmp_path, set())
    _python_312(bin_dir)
    proc = _run_setup(tmp_path, bin_dir, ROS_DISTRO='jazzy')
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert 'no torch for Python 3.12: set TORCH_INDEX_URL' in lines[0]
    assert 'https://download.pytorch.org/whl/cu128' in lines[0]
    assert not (tmp_path / 'repo' / '.venv').exists()


def test_a_fresh_run_says_which_stage_it_is_in_before_the_stages_work(tmp_path):
    """On a fresh machine the first stage (the venv) is announced before its work starts: a
    venv creation that fails is reported after the stage's line, not after minutes of
    silence."""
    bin_dir = _bin_without(tmp_path, set())
    fake = bin_dir / 'python3'
    fake.unlink()
    fake.write_text(
        '#!/bin/bash\n'
        'if [ "$1 $2" = "-m venv" ]; then echo "venv: cannot create" >&2; exit 1; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    repo = tmp_path / 'repo'
    for name in ('requirements', 'msg'):  # what the setup's stamp reads
        shutil.copytree(ROOT / name, repo / name)
    for name in ('CMakeLists.txt', 'package.xml', 'vla_sched/__init__.py'):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, repo / name)
    proc = _run_setup(tmp_path, bin_dir)
    assert proc.returncode != 0
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    assert re.fullmatch(
        r'setup: \[\d+ s\] venv: creating .*\.venv with python3 \(Python 3\.11\)', lines[0]
    )
    assert 'venv: cannot create' in proc.stderr
