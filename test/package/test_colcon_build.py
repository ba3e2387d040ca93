"""colcon builds the package the way a robot with ROS 2 does, and the install space works."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _tracked_files() -> list[str]:
    out = subprocess.run(
        ['git', 'ls-files', '--cached', '--others', '--exclude-standard'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if line]


@pytest.fixture(scope='module')
def install_space(tmp_path_factory) -> Path:
    """A clean checkout built with `colcon build` from its root; returns its install space.

    The checkout is a copy so that the ROS installation (this machine's venv) lies outside
    the package's source tree, as /opt/ros does on a robot.
    """
    src = tmp_path_factory.mktemp('checkout')
    for rel in _tracked_files():
        path = ROOT / rel
        dest = src / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            dest.symlink_to(os.readlink(path))
        elif path.is_file():
            shutil.copy2(path, dest)
    env = dict(os.environ)
    env.setdefault('AMENT_PREFIX_PATH', sys.prefix)
    env.setdefault('CMAKE_PREFIX_PATH', sys.prefix)
    env['PATH'] = f'{Path(sys.executable).parent}{os.pathsep}{env["PATH"]}'
    proc = subprocess.run(
        [
            'colcon',
            'build',
            '--cmake-args',
            '-DBUILD_TESTING=OFF',
            f'-DPython3_EXECUTABLE={sys.executable}',
        ],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    logs = src / 'log' / 'latest_build' / 'vla_sched' / 'stderr.log'
    assert proc.returncode == 0, proc.stdout[-3000:] + (logs.read_text() if logs.exists() else '')
    return src / 'install'


def test_colcon_installs_messages_sources_kernels_and_executables(install_space):
    pkg = install_space / 'vla_sched'
    site = (
        pkg / 'lib' / f'python{sys.version_info.major}.{sys.version_info.minor}' / 'site-packages'
    )
    assert (site / 'vla_sched' / 'msg' / '_action_chunk.py').is_file()
    assert (site / 'vla_sched' / 'core' / 'forward_batch.py').is_file()
    assert (site / 'vla_sched' / 'kernels' / '__init__.py').is_file()
    assert not (site / 'vla_sched' / 'kernels').is_symlink()
    executables = sorted(p.name for p in (pkg / 'lib' / 'vla_sched').iterdir())
    assert {'vla_roundtrip', 'vla_sched_node', 'vla_chunk_executor'} <= set(executables)
    assert all(os.access(pkg / 'lib' / 'vla_sched' / name, os.X_OK) for name in executables)
    assert (pkg / 'share' / 'vla_sched' / 'package.xml').is_file()
    for share_dir in ('launch', 'config'):
        if (install_space.parent / share_dir).is_dir():
            assert (pkg / 'share' / 'vla_sched' / share_dir).is_dir()
    assert (pkg / 'share' / 'vla_sched' / 'launch' / 'chunk_executor.launch.py').is_file()
    assert (pkg / 'share' / 'vla_sched' / 'config' / 'chunk_executor.yaml').is_file()


def test_sourced_install_space_imports_its_own_messages_and_sources(install_space, tmp_path):
    code = (
        'import vla_sched.core, vla_sched.kernels\n'
        'from vla_sched.msg import ActionChunk, StepRejected\n'
        'print(vla_sched.core.__file__)\n'
        'print(ActionChunk.ACTION_SPACE_EE_DELTA, StepRejected.REASON_SUPERSEDED)'
    )
    script = f'. {install_space}/setup.bash && {sys.executable} -c "$CODE"'
    proc = subprocess.run(
        ['bash', '-c', script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, CODE=code),
    )
    assert proc.returncode == 0, proc.stderr
    engine_file, constants = proc.stdout.splitlines()
    assert Path(engine_file).is_relative_to(install_space)
    assert constants == 'ee_delta 6'
