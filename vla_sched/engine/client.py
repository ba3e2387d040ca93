"""The frontend's handle on the engine: start it, talk to it, notice when it dies, restart it.

The engine runs either as a child process (``mode='process'``, over ZMQ ``ipc://`` sockets in
a private runtime folder) or in a thread of the caller (``mode='inprocess'``, over queues).
Both speak the same messages and heartbeats, so the frontend cannot tell them apart except by
``pid``.

Each engine's messages are received by an ``EngineInbox`` thread as they arrive, and
``on_arrival`` is called from that thread when some are waiting (or the engine has ended),
so a frontend can sleep until then instead of polling; ``poll`` takes them. Nothing the
engine sends makes ``poll`` raise: a frame the codec refuses, or a message that is not for
the frontend, is dropped, counted (``num_bad_frames``, over every engine this client
started) and logged at a bounded rate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vla_sched.engine.bad_frames import BadFrames
from vla_sched.engine.config import EngineConfig, EngineLinkConfig
from vla_sched.engine.inbox import EngineInbox
from vla_sched.ipc.channel import (
    Channel,
    ChannelClosedError,
    ZmqChannel,
    ZmqEndpoints,
    in_process_pair,
    new_endpoints,
    private_runtime_dir,
    remove_runtime_dir,
    remove_stale_runtime_dirs,
)
from vla_sched.ipc.frame_keys import key_pipe, new_key
from vla_sched.ipc.heartbeat import HeartbeatTracker
from vla_sched.ipc.messages import CloseSession, EngineInfo, StepRequest

logger = logging.getLogger(__name__)
# A heartbeat falling due within this share of its period is sent now: a caller that polls
# once per period (a timer a little early or late) then never skips one.
HEARTBEAT_EARLY_SHARE = 0.5
INBOX_MAX_WAIT_S = 0.25  # the inbox's longest wait for a message before it looks around


class EngineUnavailable(RuntimeError):  # noqa: N818 (reads as a state, like TimeoutError)
    """The engine is not running, still starting, or not answering."""


class EngineClient:
    """Frontend side of the engine connection (see the module docstring)."""

    def __init__(self, config: EngineConfig, link: EngineLinkConfig | None = None) -> None:
        """``config`` is what the engine runs with; ``link`` how it is run and watched
        (default: ``EngineLinkConfig()``). Set ``on_arrival`` to be called, from the
        receiving thread, when messages are waiting for ``poll`` or the engine has ended."""
        self.config = config
        self.link = link if link is not None else EngineLinkConfig()
        self.info: EngineInfo | None = None
        self.on_arrival: Callable[[], object] = lambda: None
        self._heartbeat = HeartbeatTracker(
            sender='frontend',
            period_s=self.link.heartbeat_period_s,
            timeout_s=self.link.heartbeat_timeout_s,
        )
        self._channel: Channel | None = None
        self._inbox: EngineInbox | None = None
        self._process: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self._stop_thread: threading.Event | None = None
        self._runtime_dir: Path | None = None
        self._endpoints: ZmqEndpoints | None = None
        self._generation = 0
        self._thread_error = ''
        self._bad_frames = BadFrames('the engine', logger=logger)

    # --- life cycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine; returns at once (``info`` is set when the engine is ready)."""
        if self._channel is not None:
            raise RuntimeError('engine already started; use restart()')
        self._generation += 1
        self._heartbeat.reset()
        self._thread_error = ''
        self.info = None
        if self.link.mode == 'process':
            self._start_process()
        else:
            self._start_thread()
        self._start_inbox()

    def _start_inbox(self) -> None:
        assert self._channel is not None
        self._inbox = EngineInbox(
            self._channel,
            heartbeat=self._heartbeat,
            bad_frames=self._bad_frames,
            engine_ended=lambda: bool(self.failure),
            on_arrival=lambda: self.on_arrival(),
            # A running engine's heartbeats wake the inbox about this often anyway; the cap
            # bounds how long stopping it (and so a restart) waits.
            wait_s=min(self.link.heartbeat_period_s, INBOX_MAX_WAIT_S),
        )

    def _start_process(self) -> None:
        if self._runtime_dir is None:
            remove_stale_runtime_dirs()  # left by frontends killed with SIGKILL
            self._runtime_dir = private_runtime_dir()
        endpoints = new_endpoints(self._runtime_dir, self._generation)
        # A key of this start only: the engine gets it through an inherited pipe.
        key = new_key()
        self._channel = ZmqChannel(endpoints, bind=True, key=key)
        self._endpoints = endpoints
        key_fd = key_pipe(key)
        cmd = [
            sys.executable, '-m', 'vla_sched.engine.main',
            '--to-engine', endpoints.to_engine,
            '--from-engine', endpoints.from_engine,
            '--key-fd', str(key_fd),
            '--config', json.dumps(self.config.to_mapping()),
            '--heartbeat-period', str(self.link.heartbeat_period_s),
            '--heartbeat-timeout', str(self.link.heartbeat_timeout_s),
        ]  # fmt: skip
        # A session of its own: a terminal's Ctrl-C (SIGINT to the foreground process group)
        # reaches the frontend only, which stops the engine with SIGTERM; an engine that
        # outlives a killed frontend ends when the frontend's heartbeats stop.
        try:
            self._process = subprocess.Popen(cmd, start_new_session=True, pass_fds=(key_fd,))
        finally:
            os.close(key_fd)

    def _start_thread(self) -> None:
        from vla_sched.engine.core_factory import build_core
        from vla_sched.engine.message_server import serve

        frontend_end, engine_end = in_process_pair()
        self._channel = frontend_end
        stop = threading.Event()
        config = self.config
        heartbeat = HeartbeatTracker(
            sender='engine',
            period_s=self.link.heartbeat_period_s,
            timeout_s=self.link.heartbeat_timeout_s,
        )

        def run() -> None:
            try:
                core = build_core(config)
            except Exception as exc:  # reported through ``failure``, like a dead process
                self._thread_error = f'{type(exc).__name__}: {exc}'
                return
            try:
                serve(
                    engine_end,
                    core,
                    heartbeat=heartbeat,
                    stats_period_s=config.stats_period_s,
                    stop=stop,
                )
            finally:
                core.close()
                engine_end.close()

        self._stop_thread = stop
        self._thread = threading.Thread(target=run, name='vla_sched-engine', daemon=True)
        self._thread.start()

    def stop(self, *, grace_s: float = 5.0) -> None:
        """Stop the engine and drop its connection; queued messages are discarded.

        A process gets ``grace_s`` to exit after SIGTERM, then SIGKILL (0: at once). Even if
        the wait is interrupted (an exception in this thread), the process is killed and
        reaped, and the connection closed.
        """
        try:
            self._stop_inbox()
            self._stop_process(grace_s)
            self._stop_thread_engine()
        finally:
            if self._channel is not None:
                self._channel.close()  # removes this engine's socket files
                self._channel = None
            self._endpoints = None
            self.info = None

    def _stop_inbox(self) -> None:
        inbox, self._inbox = self._inbox, None
        if inbox is not None:
            inbox.close()  # its queued messages go with it

    def _stop_process(self, grace_s: float) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            if grace_s > 0 and process.poll() is None:
                process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=grace_s)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()

    def _stop_thread_engine(self) -> None:
        if self._thread is not None:
            assert self._stop_thread is not None
            self._stop_thread.set()
            self._thread.join(timeout=10)
            self._thread = None

    def restart(self) -> None:
        """Replace the engine: a dead or silent one is killed at once, not waited for."""
        self.stop(grace_s=0.0)
        self.start()

    def close(self, *, grace_s: float = 2.0) -> None:
        """Stop the engine (``grace_s`` as in ``stop``: an engine still loading its model
        cannot answer SIGTERM at once) and remove the runtime folder, also if stopping is
        interrupted."""
        try:
            self.stop(grace_s=grace_s)
        finally:
            if self._runtime_dir is not None:
                remove_runtime_dir(self._runtime_dir)
                self._runtime_dir = None

    # --- talking ------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def endpoints(self) -> ZmqEndpoints | None:
        """The sockets of the running engine process (None in-process or when stopped)."""
        return self._endpoints

    @property
    def num_bad_frames(self) -> int:
        """Frames from the engine that ``poll`` refused, over every engine started."""
        return self._bad_frames.num_refused

    @property
    def alive(self) -> bool:
        """Ready (its EngineInfo arrived), running, and heard from within the timeout."""
        if self._channel is None or self.info is None:
            return False
        if self._process is not None and self._process.poll() is not None:
            return False
        if self._thread is not None and not self._thread.is_alive():
            return False
        return self._heartbeat.alive(time.monotonic())

    @property
    def failure(self) -> str:
        """Why the engine stopped on its own ('' while it runs or before it starts)."""
        if self._process is not None and self._process.poll() is not None:
            return f'engine process exited with status {self._process.returncode}'
        if self._thread is not None and not self._thread.is_alive():
            return self._thread_error or 'engine thread ended'
        return ''

    @property
    def heartbeat_age_s(self) -> float:
        return self._heartbeat.age_s(time.monotonic())

    def send(self, msg: StepRequest | CloseSession) -> None:
        """Send a step or a session close; raises EngineUnavailable unless ``alive``."""
        if not self.alive:
            raise EngineUnavailable('the engine is not running or not answering')
        assert self._channel is not None
        try:
            self._channel.send(msg)
        except ChannelClosedError as exc:
            raise EngineUnavailable(str(exc)) from exc

    def poll(self, timeout_s: float = 0.0) -> list[Any]:
        """Send a heartbeat when due; return every message that arrived (heartbeats aside),
        waiting up to ``timeout_s`` for one.

        Never raises for what arrived: bad frames were counted and logged as they came (see
        the module docstring), and the messages around them are returned.
        """
        if self._channel is None or self._inbox is None:
            return []
        now_s = time.monotonic()
        beat = self._heartbeat.due(now_s + HEARTBEAT_EARLY_SHARE * self._heartbeat.period_s)
        if beat is not None:
            beat = dataclasses.replace(beat, sent_ns=int(now_s * 1e9))
            # Nobody connected yet, or gone: ``alive`` says which.
            with contextlib.suppress(ChannelClosedError):
                self._channel.send(beat)
        out = self._inbox.take(timeout_s)
        for msg in out:
            if isinstance(msg, EngineInfo):
                self.info = msg
        return out
