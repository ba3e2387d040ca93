"""Each part in its own process, under its own time limit, on a bare machine's imports.

``run_child`` starts a part's process in a process group of its own and kills the group at
the limit, so a hang or a CUDA error in one part cannot take the others down.
``hide_modules`` makes the optional modules the GPU machine lacks (rclpy, ZMQ, cv_bridge,
cv2, PIL) unimportable in a part's process, so the CPU dry run imports exactly what the
bare machine has.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HIDDEN_MODULES = ('rclpy', 'zmq', 'cv_bridge', 'cv2', 'PIL')
TAIL_LINES = 30
ROOT = Path(__file__).resolve().parents[2]


class _HideModules:
    """A meta-path finder wrapper under which the named top-level modules do not exist."""

    def __init__(self, inner, names: tuple[str, ...]) -> None:
        self.inner, self.names = inner, names

    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in self.names:
            return None
        find = getattr(self.inner, 'find_spec', None)
        return find(name, path, target) if find is not None else None

    def __getattr__(self, name: str):  # find_distributions, invalidate_caches, ...
        return getattr(self.inner, name)


def hide_modules(names: tuple[str, ...]) -> None:
    """Make ``import name`` fail (and ``find_spec`` return None) for each of ``names``."""
    loaded = [n for n in names if n in sys.modules]
    if loaded:
        raise RuntimeError(f'already imported: {loaded}')
    sys.meta_path[:] = [_HideModules(finder, names) for finder in sys.meta_path]


class Progress:
    """Progress lines with the wall-clock time and seconds since the start."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        stamp = datetime.datetime.now().strftime('%H:%M:%S')
        print(f'[{stamp} +{self.elapsed_s():6.1f}s] {text}', flush=True)


def run_child(
    name: str, argv: list[str], limit_s: float, log, *, dry_run: bool
) -> tuple[str, float, list[str]]:
    """Run ``python -m bench.gpu_check ARGV`` (one part) under ``limit_s``, its output
    echoed and logged; (status, seconds, the tail of its output)."""
    env = dict(os.environ, PYTHONUNBUFFERED='1', HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1')
    if dry_run:
        env['TRITON_INTERPRET'] = '1'
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, '-m', 'bench.gpu_check', *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors='replace',
        start_new_session=True,  # its own process group: a timeout kills all it started
    )
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)

    def pump() -> None:
        for line in proc.stdout:
            tail.append(line.rstrip('\n'))
            log.write(f'[{name}] {line}')
            log.flush()
            print(f'    {name} | {line}', end='', flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    status = 'timed out'
    try:
        rc = proc.wait(timeout=limit_s)
        status = 'ok' if rc == 0 else 'failed'
    except subprocess.TimeoutExpired:
        pass
    finally:  # on a timeout, and when this process is stopped (SIGTERM) while waiting
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=5)
    seconds = time.monotonic() - started
    if status == 'failed':
        tail.append(f'exit status {proc.returncode}')
    return status, seconds, list(tail)
