"""bench.chunk_seams: the seam benchmark's bookkeeping in a tiny run (one delay, two modes,
a few chunks of the tiny pi0 on the CPU), and the simulated arm's interpolation; no assert
depends on the machine's speed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import chunk_seams
from bench.lib.seam_arm import SimulatedArm

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

MS = 1_000_000


def test_the_arm_interpolates_each_command_from_its_setpoint_and_lags_behind():
    arm = SimulatedArm(np.zeros(2), start_ns=0, control_period_ns=2 * MS, tau_ns=0)
    arm.command(np.array([1.0, -1.0]), sent_ns=0, reached_ns=10 * MS)
    arm.advance(4 * MS)
    np.testing.assert_allclose(arm.position, [0.4, -0.4])  # a perfect tracker
    arm.command(np.array([0.4, 0.6]), sent_ns=4 * MS, reached_ns=14 * MS)  # from the setpoint
    arm.advance(20 * MS)
    np.testing.assert_allclose(arm.position, [0.4, 0.6])
    lagging = SimulatedArm(np.zeros(1), start_ns=0, control_period_ns=2 * MS, tau_ns=20 * MS)
    lagging.command(np.ones(1), sent_ns=0, reached_ns=2 * MS)
    lagging.advance(20 * MS)
    assert 0.5 < lagging.position[0] < 0.7  # 1 - exp(-18 / 20) after the step
    stats = lagging.motion(0)
    assert stats.num_samples == 11 and stats.velocity_max > stats.velocity_p50 > 0


def test_the_plan_refuses_unknown_modes_and_delays_of_a_period_or_more():
    with pytest.raises(ValueError, match='modes'):
        chunk_seams.SeamPlan(modes=('nearest',))
    with pytest.raises(ValueError, match='delays'):
        chunk_seams.SeamPlan(delays_ms=(400,), period_ms=400)
    assert chunk_seams.SeamPlan(period_ms=400, dt_ms=50).rtc_execution_horizon == 8


def test_a_tiny_run_counts_every_step_seam_and_hold(tmp_path, capsys):
    out, plot = tmp_path / 'seams.json', tmp_path / 'seams.png'
    argv = [
        '--delays-ms',
        '100',
        '--modes',
        'latest',
        'rtc',
        '--duration-s',
        '2.4',
        '--chunk',
        '8',
        '--period-ms',
        '200',
        '--warmup-chunks',
        '1',
        '--num-inference-steps',
        '2',
        '--json',
        str(out),
        '--plot',
        str(plot),
        '--workdir',
        str(tmp_path),
    ]
    assert chunk_seams.main(argv) == 0
    result = json.loads(out.read_text())
    assert result['plan']['rtc_execution_horizon'] == 4  # the period in actions
    rows = {row['mode']: row for row in result['rows']}
    assert list(rows) == ['latest', 'rtc'] and '| latest | 100 (2) |' in capsys.readouterr().out
    for mode, row in rows.items():
        assert row['num_steps'] == 12  # an image every 200 ms for 2.4 s
        assert row['skipped'] == {} and row['chunks_executed'] == 12, mode
        # every switch after the first chunk is a seam; the warm-up's are left out
        assert 0 < row['num_seams'] <= row['chunks_executed'] - 1
        assert row['departure_p50'] <= row['departure_max']
        assert 0.0 <= row['held_fraction'] <= 1.0 and row['num_samples'] > 0
    # only rtc's steps carry the previous chunk, with the node's delay: 100 ms at dt 50 ms
    assert rows['rtc']['guided'] and rows['rtc']['inference_delays_sent'] == [2]
    assert not rows['latest']['guided'] and rows['latest']['inference_delays_sent'] == []
    assert plot.stat().st_size > 0
