"""After scripts/setup.sh the venv is an install prefix that ``ros2 launch`` and ``ros2 run``
can use: its share/vla_sched holds the launch files and parameters, its lib/vla_sched the
executables, found through the ament index as after colcon (linked to the checkout, one link
per file as colcon's --symlink-install makes them).

``ros2 launch`` itself (ros2launch, launch_ros) is not on PyPI, so ``FIND_LAUNCH_FILE`` asks
for a file as ``ros2launch.api.get_share_file_path_from_package`` does: the package's share
folder from the ament index (``get_package_share_directory``), then ``os.walk`` over it,
which does not enter linked folders, taking the one file of that name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / 'scripts' / 'link_share.sh'


# ros2launch's lookup of `ros2 launch PACKAGE FILE`, run in a process of its own.
FIND_LAUNCH_FILE = """
import os, sys
from ament_index_python.packages import get_package_share_directory
package, file_name = sys.argv[1:]
share = get_package_share_directory(package)
found = [os.path.join(root, name) for root, _, files in os.walk(share) for name in files
         if name == file_name]
if len(found) != 1:
    sys.exit(f"file {file_name!r} found {len(found)} times in the share directory {share}")
print(found[0])
"""
LAUNCH_FILES = sorted(p.name for p in (ROOT / 'launch').iterdir())


def _find(file_name: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, '-c', FIND_LAUNCH_FILE, 'vla_sched', file_name],
        env=env,
        capture_output=True,
        text=True,
    )


def _prefix_with_index_entry(tmp_path: Path) -> Path:
    """A prefix holding what the CMake install of the messages leaves: the package's ament
    index entry."""
    prefix = tmp_path / 'venv'
    index = prefix / 'share' / 'ament_index' / 'resource_index' / 'packages'
    index.mkdir(parents=True)
    (index / 'vla_sched').touch()
    return prefix


def _link(prefix: Path) -> None:
    subprocess.run(['bash', str(SCRIPT), str(prefix)], check=True, capture_output=True)


def test_setup_links_the_share_folders_and_executables_in_both_of_its_paths():
    setup = (ROOT / 'scripts' / 'setup.sh').read_text()
    # once on the up-to-date path, once after a full setup
    assert setup.count('bash "$root/scripts/link_share.sh" "$venv"') == 2


def test_the_ament_index_finds_the_launch_files_parameters_and_executables(tmp_path):
    prefix = tmp_path / 'venv'
    # what the CMake install of the messages leaves: the package's ament index entry
    index = prefix / 'share' / 'ament_index' / 'resource_index' / 'packages'
    index.mkdir(parents=True)
    (index / 'vla_sched').touch()
    (prefix / 'lib' / 'vla_sched').mkdir(parents=True)  # an earlier copy is replaced
    _link(prefix)
    _link(prefix)  # idempotent
    code = (
        'from ament_index_python.packages import get_package_prefix, get_package_share_directory\n'
        "print(get_package_share_directory('vla_sched'))\n"
        "print(get_package_prefix('vla_sched'))"
    )
    env = {**os.environ, 'AMENT_PREFIX_PATH': str(prefix)}
    out = subprocess.run(
        [sys.executable, '-c', code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    share, found_prefix = Path(out[0]), Path(out[1])
    assert found_prefix == prefix
    for name in ('vla_sched.launch.py', 'vla_sched.launch.xml', 'chunk_executor.launch.py'):
        assert (share / 'launch' / name).read_text() == (ROOT / 'launch' / name).read_text()
    assert (share / 'config' / 'vla_sched.yaml').resolve() == ROOT / 'config' / 'vla_sched.yaml'
    executables = {p.name for p in (prefix / 'lib' / 'vla_sched').iterdir()}
    assert executables == {p.name for p in (ROOT / 'nodes').iterdir()}
    assert {'vla_sched_node', 'vla_chunk_executor'} <= executables
    assert all(os.access(prefix / 'lib' / 'vla_sched' / name, os.X_OK) for name in executables)


def test_ros2_launch_finds_every_launch_file_and_parameter_file_of_the_package(tmp_path):
    prefix = _prefix_with_index_entry(tmp_path)
    (prefix / 'share' / 'vla_sched').mkdir(parents=True)
    (prefix / 'share' / 'vla_sched' / 'launch').symlink_to(ROOT / 'launch')  # the old layout
    _link(prefix)
    env = {**os.environ, 'AMENT_PREFIX_PATH': str(prefix)}
    assert {'vla_sched.launch.py', 'vla_sched.launch.xml', 'chunk_executor.launch.py'} <= set(
        LAUNCH_FILES
    )
    for name in [*LAUNCH_FILES, 'vla_sched.yaml', 'fastdds_large_frames.xml']:
        found = _find(name, env)
        assert found.returncode == 0, found.stderr
        assert Path(found.stdout.strip()).resolve().parent.parent == ROOT, found.stdout


def test_a_file_gone_from_the_checkout_is_gone_from_the_prefix(tmp_path):
    prefix = _prefix_with_index_entry(tmp_path)
    _link(prefix)
    stale = prefix / 'share' / 'vla_sched' / 'launch' / 'removed.launch.py'
    stale.symlink_to(tmp_path / 'removed.launch.py')
    _link(prefix)
    assert not stale.is_symlink()


def test_the_readme_bringup_finds_the_launch_file_in_the_set_up_venv():
    """The README's two bringup lines verbatim, up to ``ros2 launch``, whose lookup follows."""
    venv = ROOT / '.venv'
    if not (venv / 'share' / 'vla_sched' / 'local_setup.bash').is_file():
        pytest.skip('no .venv set up by scripts/setup.sh')
    lines = (ROOT / 'README.md').read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith('source .venv/bin/activate'))
    source_line, launch_line = lines[at], lines[at + 1]
    assert launch_line.startswith('ros2 launch '), launch_line
    _, _, package, file_name, *_ = launch_line.split()
    script = f'{source_line}\npython -c "$FIND" {package} {file_name}\n'
    env = {k: v for k, v in os.environ.items() if k not in ('AMENT_PREFIX_PATH', 'VIRTUAL_ENV')}
    done = subprocess.run(
        ['bash', '-c', script],
        cwd=ROOT,
        env={**env, 'FIND': FIND_LAUNCH_FILE},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert Path(done.stdout.strip()).resolve() == ROOT / 'launch' / file_name
