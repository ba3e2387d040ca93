"""The simulated fleet's frames are exactly ``synthetic_frame``'s, and each tick's is new."""

from __future__ import annotations

import importlib
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

from vla_sched.synthetic_frames import synthetic_frame

ROOT = Path(__file__).resolve().parents[2]


def _frame_source(width: int, height: int):
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module('bench.robot_fleet').FrameSource(width=width, height=height)


@pytest.mark.parametrize(('width', 'height'), [(64, 64), (224, 224), (33, 17), (1, 1), (2, 5)])
def test_fleet_frames_are_the_synthetic_frames_byte_for_byte(width, height):
    source = _frame_source(width, height)
    for index in (*range(40), 255, 256, 1000, 123_457):
        frame = source.frame(index)
        assert frame.dtype == np.uint8 and frame.shape == (height, width, 3)
        assert frame.tobytes() == synthetic_frame(index, width=width, height=height).tobytes()


def test_consecutive_fleet_frames_differ_so_each_is_a_new_image():
    source = _frame_source(64, 64)
    frames = [source.frame(index).tobytes() for index in range(300)]
    assert all(a != b for a, b in itertools.pairwise(frames))
