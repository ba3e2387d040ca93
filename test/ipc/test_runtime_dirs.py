"""Runtime folders record their owner, and only folders of ours whose owner is gone are
removed (what a frontend killed with SIGKILL leaves behind)."""

from __future__ import annotations

import os
import subprocess
import sys

from vla_sched.ipc.channel import (
    OWNER_FILE,
    private_runtime_dir,
    remove_runtime_dir,
    remove_stale_runtime_dirs,
)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, '-c', 'pass'])
    proc.wait()  # reaped: the pid names no process now
    return proc.pid


def test_a_new_runtime_folder_is_private_and_names_its_owner(tmp_path, monkeypatch):
    monkeypatch.setenv('XDG_RUNTIME_DIR', str(tmp_path))
    path = private_runtime_dir()
    assert path.parent == tmp_path and path.name.startswith('vla_sched-')
    assert path.stat().st_mode & 0o777 == 0o700
    assert (path / OWNER_FILE).read_text() == f'{os.getpid()}\n'
    remove_runtime_dir(path)
    assert not path.exists()


def test_only_our_folders_whose_owner_is_gone_are_removed(tmp_path):
    def folder(name: str, owner: str | None):
        path = tmp_path / name
        path.mkdir()
        (path / 'to_engine.1').write_text('')
        if owner is not None:
            (path / OWNER_FILE).write_text(owner)
        return path

    dead = folder('vla_sched-dead', f'{_dead_pid()}\n')
    alive = folder('vla_sched-alive', f'{os.getpid()}\n')
    unknown = folder('vla_sched-unknown', None)  # no owner recorded: cannot tell
    garbled = folder('vla_sched-garbled', 'not a pid')
    other = folder('other-dead', f'{_dead_pid()}\n')  # not one of ours
    assert remove_stale_runtime_dirs(tmp_path) == [dead]
    assert not dead.exists()
    assert all(p.exists() for p in (alive, unknown, garbled, other))
    assert remove_stale_runtime_dirs(tmp_path) == []
