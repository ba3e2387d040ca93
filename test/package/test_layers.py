"""Imports go one way and the core needs no ROS.

    ros -> engine -> ipc          (the node, the engine process, the transport)
           engine -> model -> core      (model runner -> the scheduler's plain-data seam)
                     model -> kernels
    core/scheduling -> core/memory

Inside model/, each shared concern builds on those before it, as SGLang stacks configs <
layers < model_loader < model_executor, and the model families sit on top of them, one
folder each (vLLM's one module per model over shared layers):

    model/config < model/layers < model/loading < model/runner < model/families

core/ and engine/ reach a family only through ``model.families.registry`` and
``model.families.protocol``, never a family's own modules.

ipc holds only messages, their codec, channels and heartbeats; it imports no other layer.
vla_sched.testing (checkpoint writers, the simulated runner) is for tests and benchmarks:
the product never imports it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_PRODUCT = {'vla_sched.ros', 'vla_sched.engine', 'vla_sched.ipc', 'vla_sched.core',
            'vla_sched.model', 'rclpy'}  # fmt: skip
_ALL = _PRODUCT | {'vla_sched.testing'}
_MODEL_ORDER = ('config', 'layers', 'loading', 'runner', 'families')
# For each layer, the vla_sched subpackages and third-party modules it must never import.
FORBIDDEN = {
    'vla_sched/ros': {'vla_sched.testing'},
    'vla_sched/engine': {'vla_sched.ros', 'rclpy', 'vla_sched.testing'},
    'vla_sched/ipc': _ALL - {'vla_sched.ipc'},
    'vla_sched/model': _ALL - {'vla_sched.model', 'vla_sched.core'},
    'vla_sched/core': _ALL - {'vla_sched.core'},
    'vla_sched/core/memory': (_ALL - {'vla_sched.core'}) | {'vla_sched.core.scheduling'},
    'kernels': _ALL,
    **{
        f'vla_sched/model/{concern}': {
            f'vla_sched.model.{above}' for above in _MODEL_ORDER[i + 1 :]
        }
        for i, concern in enumerate(_MODEL_ORDER)
    },
}
# The families the registry lists, each a folder under model/families.
FAMILIES = sorted(
    p.name for p in (ROOT / 'vla_sched/model/families').iterdir() if (p / 'family.py').is_file()
)
# core/ and engine/ see a family only through the registry and the protocol.
for _layer in ('vla_sched/engine', 'vla_sched/core'):
    FORBIDDEN[_layer] = FORBIDDEN[_layer] | {
        f'vla_sched.model.families.{family}' for family in FAMILIES
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
        banned = set(forbidden)
        if layer != 'vla_sched/ros':
            banned |= set(ROS_MESSAGE_MODULES)
        for path in sorted((ROOT / layer).rglob('*.py')):
            for name in _imports(path):
                if any(name == b or name.startswith(b + '.') for b in banned):
                    problems.append(f'{path.relative_to(ROOT)} imports {name}')
    assert problems == []


def test_the_model_concerns_each_hold_a_package_in_the_order_they_build_on():
    model = ROOT / 'vla_sched' / 'model'
    packages = sorted(p.name for p in model.iterdir() if (p / '__init__.py').is_file())
    assert packages == sorted(_MODEL_ORDER)
    assert sorted(p.name for p in model.glob('*.py')) == ['__init__.py']


def test_every_family_folder_is_listed_by_the_registry_and_every_listed_one_exists():
    from vla_sched.model.families.registry import FAMILY_NAMES

    assert FAMILIES and sorted(FAMILY_NAMES) == FAMILIES


@pytest.mark.slow
def test_core_imports_with_rclpy_unavailable_and_no_cuda(tmp_path):
    # A meta-path hook makes rclpy and the message packages unimportable for this process.
    code = """
import importlib, pkgutil, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'rclpy', 'std_msgs', 'sensor_msgs', 'diagnostic_msgs'}:
            raise ImportError(f'{name} is blocked for this test')
sys.meta_path.insert(0, Block())
import vla_sched.core
for mod in pkgutil.walk_packages(vla_sched.core.__path__, 'vla_sched.core.'):
    importlib.import_module(mod.name)
import torch
assert not torch.cuda.is_available()
leaked = sorted(m for m in sys.modules if m.split('.')[0] in {'rclpy', 'vla_sched'}
                and (m.startswith('rclpy') or m.startswith('vla_sched.msg')))
assert not leaked, leaked
print('core ok', len([m for m in sys.modules if m.startswith('vla_sched.core')]))
"""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='')
    proc = subprocess.run(
        [sys.executable, '-c', code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith('core ok')
