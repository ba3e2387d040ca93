"""Engine restarts back off: the wait doubles for each restart in a row up to a cap, a long
enough run ends the row, and a dead engine's socket files do not pile up."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from vla_sched.engine.checkpoints import check_model_path
from vla_sched.engine.client import EngineClient
from vla_sched.engine.config import EngineConfig, EngineLinkConfig
from vla_sched.ipc.channel import IPC_SCHEME
from vla_sched.ipc.messages import EngineInfo
from vla_sched.model.loading.tiny_checkpoint import build_tiny_checkpoint
from vla_sched.ros.engine_link import (
    DEAD,
    READY,
    STARTING,
    EngineLink,
    restart_attempt,
    restart_delay,
)

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

INFO = EngineInfo('fake', 0, 1, 1, 8, 16, True)


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


class FakeClient:
    """An engine client whose engine becomes ready or dies when the test says so."""

    def __init__(self) -> None:
        self.info: EngineInfo | None = None
        self.failure = ''
        self.num_starts = 0
        self.pid = None
        self.heartbeat_age_s = 0.0
        self.num_bad_frames = 0

    @property
    def alive(self) -> bool:
        return self.info is not None and not self.failure

    def start(self) -> None:
        self.num_starts += 1
        self.info, self.failure = None, ''

    def restart(self) -> None:
        self.start()

    def close(self) -> None:
        pass

    def send(self, msg) -> None:
        pass

    def poll(self, timeout_s: float = 0.0) -> list:
        return []


def test_the_delay_doubles_per_attempt_up_to_the_cap():
    delays = [restart_delay(k, first_s=1.0, max_s=30.0) for k in range(1, 8)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert restart_delay(10**6, first_s=1.0, max_s=30.0) == 30.0
    assert restart_delay(5, first_s=0.0, max_s=30.0) == 0.0


def test_an_engine_ready_long_enough_starts_a_new_row_of_restarts():
    assert restart_attempt(0, 0.0, stable_s=30.0) == 1
    assert restart_attempt(3, 0.0, stable_s=30.0) == 4
    assert restart_attempt(3, 29.9, stable_s=30.0) == 4
    assert restart_attempt(3, 30.0, stable_s=30.0) == 1


def _die_and_wait(link: EngineLink, client: FakeClient, clock: Clock) -> tuple[float, int]:
    """Kill the fake engine; return the wait the link announces and its attempt, then let
    the wait pass so the link restarts it."""
    client.failure = 'engine process exited with status 1'
    assert link.poll().died
    view = link.view()
    assert view.state == DEAD
    clock.now_s += view.restart_in_s - 0.001
    link.poll()
    assert link.state == DEAD  # not before its time
    clock.now_s += 0.001
    link.poll()
    assert link.state == STARTING
    return view.restart_in_s, view.restart_attempt


def test_the_link_backs_off_while_the_engine_keeps_dying_and_resets_after_a_long_run():
    clock, client = Clock(), FakeClient()
    config = EngineLinkConfig(restart_delay_s=1.0, restart_max_delay_s=4.0)
    link = EngineLink(client, config, clock=clock)
    link.start()
    row = [_die_and_wait(link, client, clock) for _ in range(4)]
    assert row == [(1.0, 1), (2.0, 2), (4.0, 3), (4.0, 4)]
    client.info = INFO  # ready, but not for long enough: the row goes on
    link.poll()
    assert link.state == READY
    clock.now_s += 3.9
    assert _die_and_wait(link, client, clock) == (4.0, 5)
    client.info = INFO
    link.poll()
    clock.now_s += 4.0  # ready for restart_max_delay_s: the row is over
    link.poll()
    assert link.view().restart_attempt == 0
    assert _die_and_wait(link, client, clock) == (1.0, 1)
    assert client.num_starts == 1 + 6 and link.num_restarts == 6


def test_a_cap_below_the_first_delay_is_refused_naming_both():
    want = r'restart_max_delay_s \(2.0\) is below engine\.restart_delay_s \(5.0\)'
    with pytest.raises(ValueError, match=want):
        EngineLinkConfig(restart_delay_s=5.0, restart_max_delay_s=2.0)


def _weightless_checkpoint(folder: Path) -> Path:
    """A checkpoint folder whose JSON files are right and whose weights are missing."""
    build_tiny_checkpoint(folder, seed=0, action_horizon=2)
    for weights in folder.glob('*.safetensors*'):
        weights.unlink()
    return folder


def _socket_files(client: EngineClient) -> list[str]:
    runtime_dir = Path(client.endpoints.to_engine.removeprefix(IPC_SCHEME)).parent
    return sorted(p.name for p in runtime_dir.iterdir() if p.name != 'owner.pid')


@pytest.mark.slow
def test_an_engine_that_cannot_load_is_restarted_ever_later_and_leaves_no_sockets(tmp_path):
    config = EngineConfig(model_path=str(_weightless_checkpoint(tmp_path / 'ckpt')))
    check_model_path(config)  # what the node checks before the first start passes
    link_config = EngineLinkConfig(mode='process', restart_delay_s=1.0, restart_max_delay_s=2.0)
    client = EngineClient(config, link_config)
    clock = Clock()  # the link's waits pass when the test says; the engines die for real
    link = EngineLink(client, link_config, clock=clock)
    link.start()
    waits, files = [], []
    try:
        end_s = time.monotonic() + 120.0
        while len(waits) < 3:
            assert time.monotonic() < end_s, f'engine did not die: {link.view()}'
            polled = link.poll()
            if not polled.died:
                time.sleep(0.02)  # an exit has no event to wait on here
                continue
            assert 'exited with status 1' in polled.died
            waits.append(link.view().restart_in_s)
            clock.now_s += link.restart_delay_s
            link.poll()  # restarts: the dead engine's sockets go, the new one's come
            files.append(_socket_files(client))
    finally:
        client.close()
    assert waits == [1.0, 2.0, 2.0]
    assert files == [[f'from_engine.{g}', f'to_engine.{g}'] for g in (2, 3, 4)]
