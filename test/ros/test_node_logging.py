"""What the node logs: the launch files' log level reaches its own loggers, and a normal start
is no fault.

- ``log_level:=debug`` gives the node ``--log-level vla_sched:=debug`` (what
  ``launch_args.log_level_arguments`` makes): the node's debug lines appear, rcl's do not,
  and the package's Python loggers are forwarded to the node's logger at its level.
- A node whose robot publishes from the start, before its instruction and while the engine
  loads, tells the robot why each step is refused (StepRejected) but logs no WARN before the
  engine is ready.
"""

from __future__ import annotations

import logging
import re

import pytest
import rclpy.logging
from ros_harness import Harness, NodeProcess

from vla_sched.msg import StepRejected
from vla_sched.ros.launch_args import log_level_arguments
from vla_sched.ros.ros_logging import forward_python_logs, stop_forwarding

pytestmark = [pytest.mark.ros, pytest.mark.slow]

WAIT_S = 120.0  # only a hang reaches this
REASONS = {
    getattr(StepRejected, name): name.removeprefix('REASON_')
    for name in dir(StepRejected)
    if name.startswith('REASON_')
}
LOG_LINE = re.compile(r'^\[(?P<level>[A-Z]+)\] \[[0-9.]+\] \[(?P<logger>[^\]]+)\]: ')


def _lines(log: str) -> list[tuple[str, str, str]]:
    """(level, logger, line) of each ROS log line."""
    out = []
    for line in log.splitlines():
        match = LOG_LINE.match(line)
        if match:
            out.append((match['level'], match['logger'], line))
    return out


def _reasons(harness: Harness, rid: str) -> set[str]:
    """The names of the reasons of the robot's StepRejected messages (``ENGINE_UNAVAILABLE``)."""
    return {REASONS[m.reason] for _, m in harness.rejected[rid]}


@pytest.mark.slow
def test_log_level_debug_from_the_launch_file_shows_the_nodes_debug_lines_and_not_rcls(
    tmp_path,
):
    # autostart off: no engine; a step of the unconfigured node is refused (INACTIVE)
    node = NodeProcess(
        tmp_path,
        {'autostart': False, 'robot_ids': ['arm'], 'robots': {'arm': {'instruction': 'go'}}},
        ros_arguments=tuple(log_level_arguments('debug', '', 'vla_sched')),
    )
    harness = Harness(['arm'])
    try:
        harness.start_camera('arm', 20.0)
        assert harness.spin_until(lambda: harness.rejected['arm'], 30), node.log()[-3000:]

        def debug_line() -> bool:
            return any(
                level == 'DEBUG' and logger == 'vla_sched' and 'refused: inactive' in line
                for level, logger, line in _lines(node.log())
            )

        assert harness.spin_until(debug_line, 30), node.log()[-3000:]
    finally:
        harness.close()
        assert node.stop() == 0, node.log()[-3000:]
    others = {logger for level, logger, _ in _lines(node.log()) if level == 'DEBUG'}
    assert others == {'vla_sched'}  # rcl and the middleware stay at their default


def test_the_packages_python_loggers_follow_the_node_loggers_level(capfd):
    ros_logger = rclpy.logging.get_logger('vla_sched_forward_test')
    ros_logger.set_level(rclpy.logging.LoggingSeverity.DEBUG)
    handler = forward_python_logs(ros_logger)
    try:
        logging.getLogger('vla_sched.engine.client').debug('engine %s started', 'x')
        logging.getLogger('vla_sched.engine.inbox').info('inbox line')
        logging.getLogger('other_package').debug('not ours')
    finally:
        stop_forwarding(handler)
    err = capfd.readouterr().err
    assert re.search(
        r'\[DEBUG\] .*\[vla_sched_forward_test\]: vla_sched\.engine\.client: engine x', err
    )
    assert '[INFO]' in err and 'vla_sched.engine.inbox: inbox line' in err
    assert 'not ours' not in err

    ros_logger.set_level(rclpy.logging.LoggingSeverity.WARN)
    handler = forward_python_logs(ros_logger)
    try:
        logging.getLogger('vla_sched.engine.client').info('below warn')
    finally:
        stop_forwarding(handler)
    assert 'below warn' not in capfd.readouterr().err


@pytest.mark.slow
def test_a_normal_start_with_robots_publishing_from_the_start_logs_no_warn(tmp_path):
    params = {'robot_ids': ['arm'], 'engine': {'device': 'cpu'}}  # the built-in tiny model
    harness = Harness(['arm'])
    harness.start_camera('arm', 20.0)  # from before the node runs
    node = NodeProcess(tmp_path, params)
    try:
        # Images before any instruction: refused (INVALID_INSTRUCTION), as the robot is told.
        assert harness.spin_until(lambda: harness.rejected['arm'], 60), node.log()[-3000:]
        assert 'INVALID_INSTRUCTION' in _reasons(harness, 'arm')
        harness.publish_instruction('arm', 'pick up the red block')
        assert harness.spin_until(lambda: harness.chunks['arm'], WAIT_S), node.log()[-3000:]
    finally:
        harness.close()
        assert node.stop() == 0, node.log()[-3000:]
    log = node.log()
    assert 'engine ready' in log, log[-3000:]
    before_ready = log[: log.index('engine ready')]
    warned = [line for level, _, line in _lines(before_ready) if level in ('WARN', 'ERROR')]
    assert warned == [], warned
    assert 'arm: waiting for an instruction' in before_ready
    reasons = _reasons(harness, 'arm')
    assert 'ENGINE_UNAVAILABLE' in reasons or 'engine ready' in before_ready, reasons
