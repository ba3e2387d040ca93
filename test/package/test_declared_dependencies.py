"""package.xml declares every ROS package and system dependency the code imports."""

from __future__ import annotations

import ast
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Python modules that are not ROS packages, and the rosdep key that provides each (a key of
# rosdistro's rosdep/python.yaml).
PYTHON_KEYS = {
    'numpy': 'python3-numpy',
    'yaml': 'python3-yaml',
    'zmq': 'python3-zmq',
    'msgpack': 'python3-msgpack',
    'psutil': 'python3-psutil',
    'cv2': 'python3-opencv',
    'PIL': 'python3-pil',
    'transformers': 'python3-transformers-pip',
    'pytest': 'python3-pytest',
    'hypothesis': 'python3-hypothesis',
    'matplotlib': 'python3-matplotlib',
}
# Modules rosdep has no usable key for: installed with pip as the README says (torch with CUDA
# from pytorch.org's index; safetensors and tokenizers come with transformers).
PIP_INSTALLED = {'torch', 'triton', 'safetensors', 'tokenizers'}
# Keys once declared here that rosdep cannot resolve (absent from rosdep/python.yaml), or that
# resolve to a distribution's CPU-only torch.
UNUSABLE_KEYS = {
    'python3-torch',
    'python3-triton-pip',
    'python3-safetensors-pip',
    'python3-tokenizers-pip',
}
# ROS packages that may be imported without being installed on this machine.
KNOWN_ROS_PACKAGES = {'launch', 'launch_ros', 'launch_xml', 'cv_bridge', 'diagnostic_updater'}
FIRST_PARTY = {'vla_sched', 'kernels', 'bench'}  # bench: the benchmarks, tested in test/bench

RUNTIME_GLOBS = ('vla_sched/**/*.py', 'kernels/**/*.py', 'launch/*.py', 'nodes/*')
TEST_GLOBS = ('test/**/*.py',)


def imported_modules(source: str) -> set[str]:
    """Top-level names of the absolute imports in a Python source."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split('.')[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split('.')[0])
    return names


def declared(package_xml: str, tags: tuple[str, ...]) -> set[str]:
    root = ET.fromstring(package_xml)
    return {el.text.strip() for tag in tags for el in root.iter(tag) if el.text}


def is_ros_package(name: str) -> bool:
    if name in KNOWN_ROS_PACKAGES:
        return True
    prefixes = [*os.environ.get('AMENT_PREFIX_PATH', '').split(os.pathsep), sys.prefix]
    return any(
        (Path(p) / 'share' / 'ament_index' / 'resource_index' / 'packages' / name).exists()
        for p in prefixes
        if p
    )


def undeclared(modules: set[str], keys: set[str]) -> list[str]:
    """Modules whose ROS package or rosdep key is missing from ``keys`` (or unknown)."""
    problems = []
    for name in sorted(modules - FIRST_PARTY - PIP_INSTALLED - set(sys.stdlib_module_names)):
        if name in PYTHON_KEYS:
            if PYTHON_KEYS[name] not in keys:
                problems.append(f'{name}: declare <exec_depend>{PYTHON_KEYS[name]}</exec_depend>')
        elif is_ros_package(name):
            if name not in keys:
                problems.append(f'{name}: ROS package used but not declared in package.xml')
        else:
            problems.append(f'{name}: unknown import; map it to a rosdep key in this test')
    return problems


def _modules(globs: tuple[str, ...]) -> set[str]:
    names: set[str] = set()
    for pattern in globs:
        for path in ROOT.glob(pattern):
            if path.is_file() and '__pycache__' not in path.parts:
                names |= imported_modules(path.read_text())
    return names


def test_runtime_imports_are_declared_as_exec_dependencies():
    xml = (ROOT / 'package.xml').read_text()
    keys = declared(xml, ('depend', 'exec_depend'))
    assert undeclared(_modules(RUNTIME_GLOBS), keys) == []


def test_test_imports_are_declared():
    xml = (ROOT / 'package.xml').read_text()
    keys = declared(xml, ('depend', 'exec_depend', 'test_depend'))
    # Helper modules that live beside the tests import by their bare names.
    local = {path.stem for path in (ROOT / 'test').rglob('*.py')}
    assert undeclared(_modules(TEST_GLOBS) - local, keys) == []


def test_checker_reports_a_ros_package_used_but_not_declared():
    xml = '<package><exec_depend>rclpy</exec_depend></package>'
    modules = imported_modules('import rclpy\nfrom trajectory_msgs.msg import JointTrajectory\n')
    assert undeclared(modules, declared(xml, ('exec_depend',))) == [
        'trajectory_msgs: ROS package used but not declared in package.xml'
    ]


def test_checker_reports_an_undeclared_python_dependency_and_an_unknown_one():
    modules = imported_modules('import numpy as np\nimport some_unvetted_module\n')
    assert undeclared(modules, set()) == [
        'numpy: declare <exec_depend>python3-numpy</exec_depend>',
        'some_unvetted_module: unknown import; map it to a rosdep key in this test',
    ]


def test_message_dependencies_are_declared_for_the_build():
    xml = (ROOT / 'package.xml').read_text()
    build_keys = declared(xml, ('depend', 'build_depend', 'buildtool_depend'))
    used = set()
    for msg in (ROOT / 'msg').glob('*.msg'):
        for line in msg.read_text().splitlines():
            field_type = line.split('#')[0].split()[:1]
            if field_type and '/' in field_type[0]:
                used.add(field_type[0].split('/')[0])
    assert used <= build_keys, f'message dependencies not declared: {used - build_keys}'
    assert 'rosidl_default_generators' in build_keys


def test_no_declared_key_is_one_rosdep_cannot_resolve():
    xml = (ROOT / 'package.xml').read_text()
    keys = declared(xml, ('depend', 'exec_depend', 'build_depend', 'test_depend'))
    assert keys & UNUSABLE_KEYS == set()


def test_the_readme_says_how_the_pip_installed_modules_get_in():
    readme = (ROOT / 'README.md').read_text()
    pip_lines = [line for line in readme.splitlines() if line.startswith('pip install ')]
    for name in PIP_INSTALLED:
        assert any(name in line for line in pip_lines), name
    torch_line = next(line for line in pip_lines if line.startswith('pip install torch '))
    assert '--index-url https://download.pytorch.org/whl/' in torch_line
