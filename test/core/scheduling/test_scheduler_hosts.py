"""Each host Protocol lists exactly what its module uses of the scheduler, and the
scheduler provides all of it.

The modules below take the scheduler as a host typed by a Protocol of their own. The
first test reads each module's source: the names it reads or calls on the host (a
parameter annotated with the Protocol, ``self.host``, or a local bound to ``self.host``)
must be the Protocol's members, no more and no fewer. The second checks a real
``Scheduler`` against every Protocol: each attribute is there, each method takes the
Protocol's parameters.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
from sched_testing import make_scheduler

ROOT = Path(__file__).resolve().parents[3]

HOSTS = {
    'vla_sched.core.scheduling.decode_pass': 'DecodeHost',
    'vla_sched.core.scheduling.expiry': 'ExpiryHost',
    'vla_sched.core.scheduling.prefill_pass': 'PrefillHost',
    'vla_sched.core.scheduling.scheduler_integrity': 'IntegrityHost',
    'vla_sched.core.scheduling.step_loops': 'LoopHost',
}


def _tree(module: str) -> ast.Module:
    path = ROOT / (module.replace('.', '/') + '.py')
    return ast.parse(path.read_text())


def _members(tree: ast.Module, protocol: str) -> set[str]:
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == protocol]
    names = set()
    for item in cls.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.FunctionDef):
            names.add(item.name)
    return names


def _is_self_host(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == 'host'
        and isinstance(node.value, ast.Name)
        and node.value.id == 'self'
    )


def _host_names(func: ast.FunctionDef, protocol: str) -> set[str]:
    """Names that hold the host inside ``func``."""
    args = func.args.posonlyargs + func.args.args + func.args.kwonlyargs
    names = {
        a.arg for a in args if isinstance(a.annotation, ast.Name) and a.annotation.id == protocol
    }
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and _is_self_host(node.value):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _used_on_host(tree: ast.Module, protocol: str) -> set[str]:
    used = set()
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef):
            continue
        hosts = _host_names(func, protocol)
        for node in ast.walk(func):
            if not isinstance(node, ast.Attribute):
                continue
            value = node.value
            if (isinstance(value, ast.Name) and value.id in hosts) or _is_self_host(value):
                used.add(node.attr)
    return used


@pytest.mark.parametrize('module', sorted(HOSTS))
def test_protocol_lists_exactly_what_the_module_uses(module):
    tree = _tree(module)
    protocol = HOSTS[module]
    assert _used_on_host(tree, protocol) == _members(tree, protocol)


@pytest.mark.parametrize('module', sorted(HOSTS))
def test_scheduler_provides_every_host_protocol(module):
    protocol = getattr(importlib.import_module(module), HOSTS[module])
    scheduler = make_scheduler()
    for name in _members(_tree(module), HOSTS[module]):
        assert hasattr(scheduler, name), f'Scheduler has no {name!r} ({HOSTS[module]})'
        wanted = getattr(protocol, name, None)
        if not inspect.isfunction(wanted):
            continue
        offered = inspect.signature(getattr(scheduler, name)).parameters
        for param in list(inspect.signature(wanted).parameters.values())[1:]:
            assert param.name in offered, f'Scheduler.{name} takes no {param.name!r}'
            assert offered[param.name].kind == param.kind, f'Scheduler.{name}({param.name})'
