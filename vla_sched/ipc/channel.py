"""Two-way message channels between the frontend and the engine.

``Channel`` is the seam: ``send`` one message, ``recv`` the next one or ``None``. Two
implementations: an in-process pair of queues (tests, single-process demos) and ZMQ over
``ipc://`` sockets in a private runtime folder (mode 0700) for an engine in its own process.

The frontend binds both ZMQ sockets and the engine connects, so an engine that dies and is
restarted finds the frontend where it was. A restart gets fresh sockets (new file names): a
request queued for a dead engine is dropped with the old sockets, never delivered late.

Only the engine and the node talk on them. Each socket is a ZMQ PAIR, which takes one peer
and refuses every later connection, so no other process can take the node's steps once the
engine is connected (and the node sends steps only after the engine's key-tagged EngineInfo
came, so not before either); every message carries a tag under the key of this start of the
link (``frame_keys``), so no process without the key can forge one: a message whose tag does
not check out is refused like a malformed frame (``CodecError``).
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from vla_sched.ipc import codec, frame_keys

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
IPC_SCHEME = 'ipc://'


class ChannelClosedError(RuntimeError):
    """The channel was closed, or its peer cannot take messages."""


class Channel(Protocol):
    def send(self, msg: Any) -> None:
        """Queue ``msg`` for the peer; raises ChannelClosedError if it cannot."""
        ...

    def recv(self, timeout_s: float = 0.0) -> Any | None:
        """The next message, waiting up to ``timeout_s``; None if none arrived.

        A channel that decodes frames raises ``codec.CodecError`` for a malformed one; that
        frame is consumed, so the next call returns what came after it.
        """
        ...

    def close(self) -> None: ...


class InProcessChannel:
    """One end of an in-process pair; messages are passed by reference, never copied."""

    def __init__(self, inbox: queue.SimpleQueue, outbox: queue.SimpleQueue) -> None:
        self._inbox = inbox
        self._outbox = outbox
        self._closed = False

    def send(self, msg: Any) -> None:
        if self._closed:
            raise ChannelClosedError('in-process channel is closed')
        self._outbox.put(msg)

    def recv(self, timeout_s: float = 0.0) -> Any | None:
        if self._closed:
            raise ChannelClosedError('in-process channel is closed')
        try:
            if timeout_s <= 0:
                return self._inbox.get_nowait()
            return self._inbox.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._closed = True


def in_process_pair() -> tuple[InProcessChannel, InProcessChannel]:
    """Two connected ends: what one sends, the other receives."""
    a_to_b: queue.SimpleQueue = queue.SimpleQueue()
    b_to_a: queue.SimpleQueue = queue.SimpleQueue()
    return InProcessChannel(b_to_a, a_to_b), InProcessChannel(a_to_b, b_to_a)


@dataclass(frozen=True, slots=True)
class ZmqEndpoints:
    """The two socket addresses of one frontend/engine connection."""

    to_engine: str
    from_engine: str


RUNTIME_DIR_PREFIX = 'vla_sched-'
OWNER_FILE = 'owner.pid'


def runtime_base_dir() -> Path:
    """Where runtime folders are made: XDG_RUNTIME_DIR when set, else the temp folder."""
    return Path(os.environ.get('XDG_RUNTIME_DIR') or tempfile.gettempdir())


def private_runtime_dir() -> Path:
    """A new folder only this user can enter (0700) in ``runtime_base_dir()``, holding
    ``owner.pid``: the id of the process that made it (see ``remove_stale_runtime_dirs``)."""
    path = Path(tempfile.mkdtemp(prefix=RUNTIME_DIR_PREFIX, dir=runtime_base_dir()))
    path.chmod(0o700)
    (path / OWNER_FILE).write_text(f'{os.getpid()}\n')
    return path


def remove_stale_runtime_dirs(base: Path | None = None) -> list[Path]:
    """Remove the runtime folders in ``base`` (default ``runtime_base_dir()``) whose owner
    process is gone, as a process killed with SIGKILL leaves them; return those removed.

    Only folders of this user, named like ours and holding a readable ``owner.pid`` are
    considered; a folder whose owner still runs (or cannot be told) is kept.
    """
    removed = []
    base = runtime_base_dir() if base is None else base
    for path in sorted(base.glob(f'{RUNTIME_DIR_PREFIX}*')):
        try:
            if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid():
                continue
            owner = int((path / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        if owner > 0 and not _process_exists(owner):
            remove_runtime_dir(path)
            removed.append(path)
    return removed


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


class ZmqChannel:
    """Two one-peer (PAIR) sockets over ``ipc://``, one each way; the frontend side binds,
    the engine side connects. Messages are tagged under ``key`` (see the module docstring).

    The binding end removes its two socket files when it is closed, so a restart's earlier
    sockets do not pile up in the runtime folder.
    """

    def __init__(
        self,
        endpoints: ZmqEndpoints,
        *,
        bind: bool,
        key: bytes,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        high_water_mark: int = 1000,
    ) -> None:
        import zmq

        self._zmq = zmq
        self._key = frame_keys.check_key(key)
        self._out_label, self._in_label = (
            (frame_keys.TO_ENGINE, frame_keys.FROM_ENGINE)
            if bind
            else (frame_keys.FROM_ENGINE, frame_keys.TO_ENGINE)
        )
        self._ctx = zmq.Context()
        self._push = self._ctx.socket(zmq.PAIR)  # sends only
        self._pull = self._ctx.socket(zmq.PAIR)  # receives only
        for sock in (self._push, self._pull):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, high_water_mark)
            sock.setsockopt(zmq.RCVHWM, high_water_mark)
        # A peer that sends a larger frame is disconnected instead of filling our memory.
        self._pull.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        if bind:
            # The frontend queues only on live connections: nothing waits for an engine
            # that is not there. The engine (connecting) queues until its connection is up.
            self._push.setsockopt(zmq.IMMEDIATE, 1)
        out_addr, in_addr = (
            (endpoints.from_engine, endpoints.to_engine)
            if not bind
            else (endpoints.to_engine, endpoints.from_engine)
        )
        self._bound_paths: tuple[Path, ...] = ()
        if bind:
            self._push.bind(out_addr)
            self._pull.bind(in_addr)
            self._bound_paths = tuple(
                Path(addr.removeprefix(IPC_SCHEME))
                for addr in (out_addr, in_addr)
                if addr.startswith(IPC_SCHEME)
            )
        else:
            self._push.connect(out_addr)
            self._pull.connect(in_addr)
        self._poller = zmq.Poller()
        self._poller.register(self._pull, zmq.POLLIN)
        self._closed = False

    def send(self, msg: Any) -> None:
        if self._closed:
            raise ChannelClosedError('zmq channel is closed')
        try:
            frames = frame_keys.sealed(self._key, self._out_label, codec.encode(msg))
            self._push.send_multipart(frames, flags=self._zmq.NOBLOCK, copy=False)
        except self._zmq.Again as exc:
            raise ChannelClosedError('no engine connected, or its queue is full') from exc

    def recv(self, timeout_s: float = 0.0) -> Any | None:
        """See ``Channel.recv``: raises ``codec.CodecError`` for a malformed message or one
        whose key tag does not check out."""
        if self._closed:
            raise ChannelClosedError('zmq channel is closed')
        if not self._poller.poll(max(0, int(timeout_s * 1000))):
            return None
        frames = self._pull.recv_multipart(copy=False)
        body = frame_keys.open_frames(self._key, self._in_label, [f.buffer for f in frames])
        return codec.decode(body)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._push.close(0)
            self._pull.close(0)
            self._ctx.term()
            for path in self._bound_paths:
                path.unlink(missing_ok=True)


def new_endpoints(runtime_dir: Path, generation: int) -> ZmqEndpoints:
    """Fresh socket addresses in ``runtime_dir`` for the ``generation``-th engine start."""
    return ZmqEndpoints(
        to_engine=f'{IPC_SCHEME}{runtime_dir}/to_engine.{generation}',
        from_engine=f'{IPC_SCHEME}{runtime_dir}/from_engine.{generation}',
    )


def remove_runtime_dir(runtime_dir: Path) -> None:
    shutil.rmtree(runtime_dir, ignore_errors=True)
