"""Exit status 0 however SIGINT and SIGTERM arrive: before, during and after the stop.

A signal can come at any moment of the way out: while the loop runs, while the engine is
stopped, and after the handlers' ``with`` block has been left, while the interpreter
finishes (where Python's own SIGINT handler used to end the node with -2). The first test
walks a small program built like the node's ``main`` through those moments one by one; the
second sends the node a stream of alternating signals from its first SIGINT until it has
exited, so every moment of its real shutdown gets one, however long each takes.
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

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

ROOT = Path(__file__).resolve().parents[2]
# The node's main in miniature: poll the request, stop, leave the block, finish; it waits on
# stdin at each moment so that the test can signal it exactly there.
PROGRAM = """
import sys, time
from vla_sched.ros.shutdown import ShutdownRequest
with ShutdownRequest() as shutdown:
    print('ready', flush=True)
    while not shutdown.requested:
        time.sleep(0.005)
    print('stopping', flush=True)
    sys.stdin.readline()
print('left', flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize(
    'signals',
    [
        (signal.SIGINT, signal.SIGINT),
        (signal.SIGINT, signal.SIGTERM),
        (signal.SIGTERM, signal.SIGINT),
        (signal.SIGTERM, signal.SIGTERM),
    ],
)
def test_signals_while_stopping_and_after_the_block_still_exit_zero(signals):
    proc = subprocess.Popen(
        [sys.executable, '-c', PROGRAM],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == 'ready\n'
        first, later = signals
        proc.send_signal(first)
        assert proc.stdout.readline() == 'stopping\n'  # the request was taken
        proc.send_signal(later)  # while stopping
        proc.send_signal(first)
        proc.stdin.write('\n')
        proc.stdin.flush()
        assert proc.stdout.readline() == 'left\n'
        proc.send_signal(later)  # after the block: the old handlers would end it with -2
        proc.send_signal(first)
        proc.stdin.write('\n')
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.ros
def test_the_node_exits_zero_under_signals_from_its_first_sigint_until_it_has_exited(
    tmp_path,
):
    params = tmp_path / 'params.yaml'
    values = {'robot_ids': ['robot_0']}
    params.write_text(yaml.safe_dump({'/**': {'ros__parameters': values}}))
    log_path = tmp_path / 'node.log'
    cmd = [sys.executable, '-m', 'vla_sched.ros.node', '--ros-args', '--params-file', str(params)]
    with log_path.open('w') as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 60
        while 'serving 1 robots' not in log_path.read_text() and time.monotonic() < end:
            assert proc.poll() is None, log_path.read_text()[-2000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        sent = 1
        while proc.poll() is None and time.monotonic() < end:
            proc.send_signal(signal.SIGTERM if sent % 2 else signal.SIGINT)
            sent += 1
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.02)
        code = proc.wait(timeout=5)
        log = log_path.read_text()
        assert code == 0, f'exit {code} after {sent} signals: {log[-2000:]}'
        assert 'Traceback' not in log and 'KeyboardInterrupt' not in log, log[-2000:]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
