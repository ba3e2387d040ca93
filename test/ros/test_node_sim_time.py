"""Under use_sim_time, while nothing publishes /clock, the node keeps its engine and reports.

It says that sim time is on and no /clock came (once in its log, and on /diagnostics for as
long as none comes), and counts its uptime on the steady clock.

The node's heartbeats and /diagnostics run on the steady clock: ROS time standing still must
not silence the frontend (the engine would read it as lost and be restarted in a loop).
"""

from __future__ import annotations

import time

import pytest
from builtin_interfaces.msg import Time
from ros_harness import Harness, NodeProcess, level_of, values_of
from rosgraph_msgs.msg import Clock

from vla_sched.ros.diagnostic_keys import NODE_UPTIME_KEY, ROS_CLOCK_KEY, SIM_CLOCK, SIM_NO_CLOCK
from vla_sched.ros.diagnostics import NO_CLOCK_WARN_S, WARN

pytestmark = [pytest.mark.ros, pytest.mark.slow]

SCHEDULER = '/vla_sched: scheduler'
ROBOT = '/vla_sched: robot arm'
HEARTBEAT_TIMEOUT_S = 1.0
DIAGNOSTICS_PERIOD_S = 0.2


def test_heartbeats_and_diagnostics_keep_their_period_while_sim_time_stands_still(tmp_path):
    params = {
        'use_sim_time': True,
        'robot_ids': ['arm'],
        'engine': {
            'device': 'cpu',
            'heartbeat_period_s': 0.1,
            'heartbeat_timeout_s': HEARTBEAT_TIMEOUT_S,
        },
        'diagnostics': {'period_s': DIAGNOSTICS_PERIOD_S},
    }
    node = NodeProcess(tmp_path, params)
    harness = Harness(['arm'])
    try:
        ready = harness.wait_status(
            SCHEDULER, lambda s: values_of(s)['engine state'] == 'ready', 180
        )
        assert ready is not None, node.log()[-3000:]
        pid = values_of(ready)['engine pid']
        # Three heartbeat timeouts' worth of statuses, each with the same live engine.
        start = len(harness.diagnostics)
        wanted = start + round(3 * HEARTBEAT_TIMEOUT_S / DIAGNOSTICS_PERIOD_S)
        assert harness.spin_until(lambda: len(harness.diagnostics) >= wanted, 60)
        for _, array in harness.diagnostics[start:]:
            for status in array.status:
                if status.name == SCHEDULER:
                    values = values_of(status)
                    assert values['engine state'] == 'ready', values
                    assert values['engine pid'] == pid
                    assert values['engine restarts'] == '0'
    finally:
        harness.close()
        assert node.stop() == 0, node.log()[-3000:]


def test_sim_time_without_clock_is_said_once_and_uptime_runs_on_the_steady_clock(tmp_path):
    # autostart off: no engine is needed to report the clock
    params = {'use_sim_time': True, 'autostart': False, 'robot_ids': ['arm']}
    params['diagnostics'] = {'period_s': DIAGNOSTICS_PERIOD_S}
    node = NodeProcess(tmp_path, params)
    harness = Harness(['arm'])
    try:

        def no_clock_warned(status) -> bool:
            return level_of(status) == WARN and status.message.startswith(
                'sim time on, no /clock received'
            )

        status = harness.wait_status(SCHEDULER, no_clock_warned, 60)
        assert status is not None, node.log()[-3000:]
        values = values_of(status)
        assert values[ROS_CLOCK_KEY] == SIM_NO_CLOCK
        assert float(values[NODE_UPTIME_KEY]) >= NO_CLOCK_WARN_S  # while ROS time is 0
        robot = harness.status(ROBOT)
        waited_s = float(robot.message.split('(')[1].split(' s since start-up')[0])
        assert waited_s >= NO_CLOCK_WARN_S, robot.message
        assert harness.spin_until(lambda: 'sim time on, no /clock received' in node.log(), 10)

        clock = harness.node.create_publisher(Clock, '/clock', 10)
        clock.publish(Clock(clock=Time(sec=100)))
        after = time.time_ns()
        status = harness.wait_status(
            SCHEDULER, lambda s: values_of(s)[ROS_CLOCK_KEY] == SIM_CLOCK, 30, after_ns=after
        )
        assert status is not None, node.log()[-3000:]
        assert not status.message.startswith('sim time on'), status.message
    finally:
        harness.close()
        assert node.stop() == 0, node.log()[-3000:]
    log = node.log()
    warned = [line for line in log.splitlines() if 'no /clock received' in line]
    assert len(warned) == 1 and '[WARN]' in warned[0], warned
    assert '/clock received: sim time runs' in log
