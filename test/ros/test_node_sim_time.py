"""Under use_sim_time, while nothing publishes /clock, the node keeps its engine and reports.

The node's heartbeats and /diagnostics run on the steady clock: ROS time standing still must
not silence the frontend (the engine would read it as lost and be restarted in a loop).
"""

from __future__ import annotations

import pytest
from ros_harness import Harness, NodeProcess, values_of

pytestmark = [pytest.mark.ros, pytest.mark.slow]

SCHEDULER = '/vla_sched: scheduler'
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
