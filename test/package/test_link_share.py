"""After scripts/setup.sh the venv is an install prefix that ``ros2 launch`` and ``ros2 run``
can use: its share/vla_sched holds the launch files and parameters, its lib/vla_sched the
executables, found through the ament index as after colcon (linked to the checkout)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / 'scripts' / 'link_share.sh'


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
