"""Oversized and huge-declared camera images of one robot, with the node and its engine in a
process of their own: each is refused from its header, saying why, while the other robot keeps
getting chunks, and the node's peak memory does not grow by what the images declare."""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path

import pytest
from ros_harness import Harness, NodeProcess, values_of
from sensor_msgs.msg import CompressedImage

from vla_sched.msg import StepRejected
from vla_sched.ros.conversions import ns_to_stamp, stamp_to_ns

pytestmark = [pytest.mark.ros, pytest.mark.slow]

GOOD, BAD = 'robot_a', 'robot_b'
NODE = '/vla_sched'
SCHEDULER = f'{NODE}: scheduler'
MAX_PIXELS = 128 * 128
HUGE = 12000  # 12000 x 12000 x 3 bytes = 432 MB decoded
PEAK_GROWTH_LIMIT_BYTES = 150 * 1024 * 1024


def _params() -> dict:
    return {
        'robot_ids': [GOOD, BAD],
        'robot_defaults': {
            'period_s': 0.2,
            'trigger': 'on_image',
            'instruction': 'pick up the red block',
        },
        'robots': {BAD: {'image_transport': 'compressed'}},
        'engine': {'mode': 'inprocess', 'device': 'cpu', 'heartbeat_timeout_s': 5.0},
        'limits': {'max_image_pixels': MAX_PIXELS},
        'deadlines': {'step_budget_s': 20.0},
        'diagnostics': {'period_s': 0.5, 'silent_robot_s': 60.0},
    }


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack('>I', len(body)) + kind + body + struct.pack('>I', zlib.crc32(kind + body))


def _png(width: int, height: int, *, num_rows: int | None = None) -> bytes:
    """A black RGB PNG of ``width`` x ``height``, compressed row by row (never held whole);
    with ``num_rows`` only that many rows of data follow the header."""
    packer = zlib.compressobj(1)
    row = bytes(3 * width + 1)  # filter byte 0, then the pixels
    rows = height if num_rows is None else num_rows
    idat = b''.join(packer.compress(row) for _ in range(rows)) + packer.flush()
    ihdr = struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 0)
    return (
        b'\x89PNG\r\n\x1a\n'
        + _png_chunk(b'IHDR', ihdr)
        + _png_chunk(b'IDAT', idat)
        + _png_chunk(b'IEND', b'')
    )


def _jpeg_header(width: int, height: int) -> bytes:
    frame = (
        struct.pack('>HBHHB', 17, 8, height, width, 3) + b'\x01\x11\x00\x02\x11\x00\x03\x11\x00'
    )
    return b'\xff\xd8\xff\xc0' + frame + b'\xff\xd9'


def _peak_rss_bytes(pid: int) -> int:
    for line in Path(f'/proc/{pid}/status').read_text().splitlines():
        if line.startswith('VmHWM:'):
            return int(line.split()[1]) * 1024
    raise AssertionError(f'no VmHWM for process {pid}')


def _refusal_of(harness: Harness, data: bytes) -> StepRejected | None:
    """Publish ``data`` as robot BAD's image until a refusal of one of its copies arrives
    (a large message on the best-effort camera topic may be lost in transit)."""
    stamps: set[int] = set()
    for _ in range(30):
        stamp_ns = time.time_ns()
        stamps.add(stamp_ns)
        msg = CompressedImage(format='png', data=data)
        msg.header.stamp = ns_to_stamp(stamp_ns)
        harness.publish_image(BAD, msg)

        def refusals() -> list[StepRejected]:
            return [r for _, r in harness.rejected[BAD] if stamp_to_ns(r.header.stamp) in stamps]

        if harness.spin_until(refusals, 2.0):
            return refusals()[0]
    return None


@pytest.fixture(scope='module')
def served(tmp_path_factory):
    node = NodeProcess(tmp_path_factory.mktemp('image_limits'), _params())
    harness = Harness([GOOD, BAD], compressed=(BAD,))
    try:
        assert harness.wait_matched(60, joints=False), node.log()
        ready = harness.wait_status(
            SCHEDULER, lambda s: values_of(s)['engine state'] == 'ready', 180
        )
        assert ready is not None, node.log()[-3000:]
        yield node, harness
    finally:
        harness.close()
        assert node.stop() == 0, node.log()[-3000:]


def test_oversized_and_huge_declared_images_are_refused_while_the_other_robot_is_served(served):
    node, harness = served
    harness.start_camera(GOOD, rate_hz=5.0)
    assert harness.spin_until(lambda: len(harness.chunks[GOOD]) >= 2, 120), node.log()[-3000:]
    peak_before = _peak_rss_bytes(node.proc.pid)
    started_ns = time.time_ns()
    cases = [
        (_png(HUGE, HUGE), f'png header declares {HUGE}x{HUGE}'),  # 420 kB, all of it real
        (_png(HUGE, HUGE, num_rows=2), f'png header declares {HUGE}x{HUGE}'),
        (_jpeg_header(HUGE, HUGE), f'jpeg header declares {HUGE}x{HUGE}'),
        (_png(200, 100), f'200x100 = 20000 pixels; limits.max_image_pixels is {MAX_PIXELS}'),
        (b'GIF89a' + bytes(64), 'neither PNG nor JPEG'),
    ]
    for data, text in cases:
        rejection = _refusal_of(harness, data)
        assert rejection is not None, (text, node.log()[-3000:])
        assert rejection.reason == StepRejected.REASON_MALFORMED_IMAGE
        assert text in rejection.detail, rejection.detail
    status = harness.wait_status(
        f'{NODE}: robot {BAD}', lambda s: 'neither PNG nor JPEG' in values_of(s)['last error'], 10
    )
    assert status is not None

    # the other robot kept getting chunks for images taken after the bad ones began
    def fresh_chunks() -> int:
        return sum(stamp_to_ns(c.header.stamp) > started_ns for _, c in harness.chunks[GOOD])

    assert harness.spin_until(lambda: fresh_chunks() >= 3, 60), node.log()[-3000:]
    growth = _peak_rss_bytes(node.proc.pid) - peak_before
    assert growth < PEAK_GROWTH_LIMIT_BYTES, f'peak RSS grew by {growth / 2**20:.0f} MiB'
    assert not harness.chunks[BAD]
