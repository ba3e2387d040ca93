"""Imports go one way and the engine needs no ROS.

    ros -> serving -> ipc          (the node, the serving logic, the transport)
            serving -> model -> engine   (model runner -> the scheduler's plain-data seam)
                       model -> kernels
    engine/scheduling -> engine/memory

ipc holds only messages, their codec, channels and heartbeats; it imports no other layer.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# For each layer, the vla_sched subpackages and third-party modules it must never import.
_ALL = {'vla_sched.ros', 'vla_sched.serving', 'vla_sched.ipc', 'vla_sched.engine',
        'vla_sched.model', 'rclpy'}  # fmt: skip
FORBIDDEN = {
    'vla_sched/serving': {'vla_sched.ros', 'rclpy'},
    'vla_sched/ipc': _ALL - {'vla_sched.ipc'},
    'vla_sched/model': {'vla_sched.ros', 'vla_sched.serving', 'vla_sched.ipc', 'rclpy'},
    'vla_sched/engine': _ALL - {'vla_sched.engine'},
    'vla_sched/engine/memory': (_ALL - {'vla_sched.engine'}) | {'vla_sched.engine.scheduling'},
    'kernels': _ALL,
}
ROS_MESSAGE_MODULES = (
    'std_msgs',
    'sensor_msgs',
    'diagnostic_msgs',
    'trajectory_msgs',
    'builtin_interfaces',
    'vla_sched.msg',
    'cv_bridge',
)


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_lower_layers_never_import_upper_layers_or_ros():
    problems = []
    for layer, forbidden in FORBIDDEN.items():
        banned = forbidden | set(ROS_MESSAGE_MODULES)
        for path in sorted((ROOT / layer).rglob('*.py')):
            for name in _imports(path):
                if any(name == b or name.startswith(b + '.') for b in banned):
                    problems.append(f'{path.relative_to(ROOT)} imports {name}')
    assert problems == []


def test_engine_imports_with_rclpy_unavailable_and_no_cuda(tmp_path):
    # A meta-path hook makes rclpy and the message packages unimportable for this process.
    code = """
import importlib, pkgutil, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'rclpy', 'std_msgs', 'sensor_msgs', 'diagnostic_msgs'}:
            raise ImportError(f'{name} is blocked for this test')
sys.meta_path.insert(0, Block())
import vla_sched.engine
for mod in pkgutil.walk_packages(vla_sched.engine.__path__, 'vla_sched.engine.'):
    importlib.import_module(mod.name)
import torch
assert not torch.cuda.is_available()
leaked = sorted(m for m in sys.modules if m.split('.')[0] in {'rclpy', 'vla_sched'}
                and (m.startswith('rclpy') or m.startswith('vla_sched.msg')))
assert not leaked, leaked
print('engine ok', len([m for m in sys.modules if m.startswith('vla_sched.engine')]))
"""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='')
    proc = subprocess.run(
        [sys.executable, '-c', code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith('engine ok')
