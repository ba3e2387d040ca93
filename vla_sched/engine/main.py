"""Entry point of the engine process: connect to the frontend's sockets and serve.

    python -m vla_sched.engine.main --to-engine ipc://... --from-engine ipc://... \
        --key-fd N --config '{"model_path": ""}'

``--key-fd`` names the inherited pipe that holds this start's frame key
(``vla_sched.ipc.frame_keys``); it is read before anything else and closed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading

from vla_sched.engine.config import EngineConfig
from vla_sched.engine.core_factory import build_core
from vla_sched.engine.message_server import serve
from vla_sched.ipc.channel import ZmqChannel, ZmqEndpoints
from vla_sched.ipc.frame_keys import read_key
from vla_sched.ipc.heartbeat import HeartbeatTracker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description='vla_sched engine process')
    parser.add_argument('--to-engine', required=True)
    parser.add_argument('--from-engine', required=True)
    parser.add_argument('--key-fd', type=int, required=True, help="the frame key's pipe")
    parser.add_argument('--config', default='{}', help='engine settings as JSON')
    parser.add_argument('--heartbeat-period', type=float, required=True)
    parser.add_argument('--heartbeat-timeout', type=float, required=True)
    args = parser.parse_args(argv)
    try:
        key = read_key(args.key_fd)
    except (OSError, ValueError) as exc:
        print(f'vla_sched engine: no frame key on fd {args.key_fd}: {exc}', file=sys.stderr)
        return 1

    # Stopping is the frontend's call (SIGTERM); a terminal's Ctrl-C reaches this process too,
    # also while the model loads, and must not end it with a traceback.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    logging.basicConfig(level=logging.WARNING, format='vla_sched engine: %(message)s')
    config = EngineConfig.from_mapping(json.loads(args.config))
    try:
        core = build_core(config)
    except Exception as exc:  # the frontend sees the exit status and restarts after a wait
        print(
            f'vla_sched engine: cannot load the model: {type(exc).__name__}: {exc}',
            file=sys.stderr,
        )
        return 1
    channel = ZmqChannel(ZmqEndpoints(args.to_engine, args.from_engine), bind=False, key=key)
    heartbeat = HeartbeatTracker(
        sender='engine', period_s=args.heartbeat_period, timeout_s=args.heartbeat_timeout
    )
    try:
        why = serve(
            channel, core, heartbeat=heartbeat, stats_period_s=config.stats_period_s, stop=stop
        )
    finally:
        core.close()
        channel.close()
    print(f'vla_sched engine: {why}', file=sys.stderr)
    return 0


if __name__ == '__main__':
    status = main()
    # The channel and the core are closed by now. The interpreter's own teardown (torch's
    # above all) takes a second or more, which a stopping frontend would wait out: skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
