"""The names of the parameter values a node was given, read from what it was started with.

rclpy hands a node its values (params files, ``-p`` rules, the ``parameter_overrides``
argument) only through ``declare_parameter``, which applies them; it offers no public way to
list them. A node that refuses the names it does not declare (a misspelling, a section for a
robot it does not serve) reads them here from the inputs rcl reads:

- each ``--params-file`` of the command line: the sections keyed by a node name that matches
  the node's fully qualified name as rcl matches it (``*`` stands for one name or namespace
  token, ``**`` for any number of them; a key without a leading ``/`` is read from the root),
  their nested keys joined with dots as rcl flattens them;
- each ``-p name:=value`` rule, or ``-p node:name:=value`` whose node is this one;
- the names of the overrides the node was built with.

Only arguments between ``--ros-args`` and ``--`` count, as rcl reads them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

PARAMS_KEY = 'ros__parameters'


def ros_arguments(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The ``--params-file`` paths and the ``-p``/``--param`` rules (``[node:]name:=value``)
    of ``argv``, in order."""
    files: list[str] = []
    rules: list[str] = []
    inside = False
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == '--ros-args':
            inside = True
        elif arg == '--':
            inside = False
        elif inside and arg == '--params-file' and i + 1 < len(args):
            files.append(args[i + 1])
            i += 1
        elif inside and arg in ('-p', '--param') and i + 1 < len(args):
            rules.append(args[i + 1])
            i += 1
        i += 1
    return files, rules


def rule_target(rule: str) -> tuple[str, str]:
    """``(node, name)`` of a ``-p`` rule (``node`` is '' when the rule names none)."""
    head = rule.split(':=', 1)[0]
    node, _, name = head.rpartition(':')
    return node, name


def rule_names(rules: Iterable[str], node_fqn: str) -> set[str]:
    """The parameter names that ``-p`` rules give the node called ``node_fqn``."""
    basename = node_fqn.rsplit('/', 1)[-1]
    names = set()
    for rule in rules:
        node, name = rule_target(rule)
        if node in ('', basename, node_fqn, node_fqn.lstrip('/')):
            names.add(name)
    return names


def node_key_matches(key: str, node_fqn: str) -> bool:
    """Whether a params file's node key (``/**``, ``/gpu0/vla_sched``, ``vla_sched``,
    ``/**/vla_sched``, ``/gpu*/*``) applies to the node called ``node_fqn``."""
    pattern = ''
    for token in key.strip('/').split('/'):
        if token == '**':
            pattern += r'(/[^/]+)*'
        else:
            pattern += '/' + '[^/]*'.join(re.escape(part) for part in token.split('*'))
    return re.fullmatch(pattern, node_fqn) is not None


def _sections(tree: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """``(node key, parameters)`` of every section of a params file; a namespace may be a
    level of its own (``gpu0: {vla_sched: {ros__parameters: ...}}``)."""
    if not isinstance(tree, dict):
        return
    for key, value in tree.items():
        if key == PARAMS_KEY:
            yield '/'.join(path), value
        else:
            yield from _sections(value, (*path, str(key).strip('/')))


def _flat_names(tree: Any, prefix: str = '') -> Iterator[str]:
    if not isinstance(tree, dict):
        return
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flat_names(value, f'{prefix}{key}.')
        else:
            yield f'{prefix}{key}'


def file_names(data: Any, node_fqn: str) -> set[str]:
    """The parameter names a params file's content (as YAML loads it) gives ``node_fqn``."""
    names: set[str] = set()
    for key, params in _sections(data):
        if node_key_matches(key, node_fqn):
            names.update(_flat_names(params))
    return names


def load_params_file(path: str) -> Any:
    """A params file's content, or None if it cannot be read (rcl reported that already)."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None


def given_names(
    node_fqn: str, command_line: Sequence[str], override_names: Iterable[str] = ()
) -> set[str]:
    """Every parameter name given to the node called ``node_fqn`` by ``command_line`` (the
    arguments given to ``rclpy.init`` and the node's own) and by its overrides."""
    files, rules = ros_arguments(command_line)
    names = set(override_names) | rule_names(rules, node_fqn)
    for path in files:
        names |= file_names(load_params_file(path), node_fqn)
    return names
