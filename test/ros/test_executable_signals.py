"""Every long-running executable of the package exits 0 however SIGINT and SIGTERM arrive:
while it starts (its imports, rclpy.init, the node's creation) and while it runs, one signal
or a stream of them at several gaps, as a terminal's Ctrl-C and ``ros2 launch`` send them.

Each executable runs as ``ros2 run`` and ``ros2 launch`` start it: the file in ``nodes/``
(installed to ``lib/vla_sched``). ``after_output`` waits for the executable's first line of
output (it is running); without it the first signal comes while it starts: as soon as the
process catches SIGTERM (``/proc/<pid>/status``), which it does from its first lines on,
before its slow imports. (A signal before that, within the interpreter's own start-up, ends
any Python program as Python's default handlers do.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.ros, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NODES = ROOT / 'nodes'
WAIT_S = 60.0  # only a hang reaches this


def _command(name: str, tmp_path: Path) -> list[str]:
    if name == 'vla_sim_robot':
        return [str(NODES / name), '--robot-id', 'robot_0', '--report-period', '0.2']
    if name == 'vla_chunk_executor':
        return [str(NODES / name), '--ros-args', '-r', '__ns:=/robot_0']
    params = tmp_path / 'params.yaml'
    params.write_text(yaml.safe_dump({'/**': {'ros__parameters': {'robot_ids': ['robot_0']}}}))
    return [str(NODES / name), '--ros-args', '--params-file', str(params)]


def _catches_sigterm(pid: int) -> bool:
    status = Path(f'/proc/{pid}/status').read_text()
    caught = next(line for line in status.splitlines() if line.startswith('SigCgt:'))
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


def _wait(proc: subprocess.Popen, ready, log_path: Path) -> None:
    end = time.monotonic() + WAIT_S
    while not ready() and time.monotonic() < end:
        assert proc.poll() is None, log_path.read_text()[-2000:]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.005)


def _signal_stream(proc: subprocess.Popen, gap_s: float) -> int:
    """SIGINT, then SIGTERM and SIGINT in turn every ``gap_s`` until ``proc`` has exited;
    how many were sent."""
    proc.send_signal(signal.SIGINT)
    sent = 1
    end = time.monotonic() + WAIT_S
    while proc.poll() is None and time.monotonic() < end:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=gap_s)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM if sent % 2 else signal.SIGINT)
            sent += 1
    return sent


@pytest.mark.parametrize(
    ('name', 'after_output', 'gap_s'),
    [
        ('vla_sim_robot', False, 0.02),
        ('vla_sim_robot', True, 0.02),
        ('vla_sim_robot', True, 0.5),
        ('vla_chunk_executor', False, 0.02),
        ('vla_chunk_executor', True, 0.3),
        ('vla_sched_node', False, 0.3),
    ],
)
def test_the_executable_exits_zero_under_signals(tmp_path, name, after_output, gap_s):
    log_path = tmp_path / 'out.log'
    with log_path.open('w') as log:
        proc = subprocess.Popen(
            [sys.executable, *_command(name, tmp_path)], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        if after_output:
            _wait(proc, lambda: log_path.read_text().strip(), log_path)
        else:
            _wait(proc, lambda: _catches_sigterm(proc.pid), log_path)
        sent = _signal_stream(proc, gap_s)
        code = proc.wait(timeout=10)
        out = log_path.read_text()
        assert code == 0, f'exit {code} after {sent} signals: {out[-2000:]}'
        assert 'Traceback' not in out and 'KeyboardInterrupt' not in out, out[-2000:]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
