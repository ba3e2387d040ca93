"""Which diagnostic_aggregator rules claim a status name, and the row it becomes, as the
aggregator does it.

``GenericAnalyzer`` matches a status name against its parameters: ``name`` and ``expected``
exactly, ``startswith`` and ``find_and_remove_prefix`` as a prefix, ``contains`` as a
substring, and ``regex`` against the whole name (``std::regex_match``). An
``AnalyzerGroup`` holds further analyzers under ``analyzers``. A status claimed by two
analyzers shows up twice in rqt_robot_monitor; one claimed by none lands in "Other".

The row a claimed status becomes on /diagnostics_agg is the analyzer's path, '/', and the
status name with every '/' turned into ' '; then each prefix of ``remove_prefix`` and
``find_and_remove_prefix`` (turned the same way) is removed where it starts the last path
element, followed by one leading ':' and any leading spaces.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

GENERIC = 'diagnostic_aggregator/GenericAnalyzer'
GROUP = 'diagnostic_aggregator/AnalyzerGroup'
RULE_KINDS = ('name', 'expected', 'startswith', 'find_and_remove_prefix', 'contains', 'regex')
CHAFF_KINDS = ('find_and_remove_prefix', 'remove_prefix')


@dataclass(frozen=True, slots=True)
class Rule:
    """One pattern of one analyzer."""

    analyzer: str  # the analyzer's key path, e.g. 'robots' or 'topology.left'
    kind: str
    pattern: str

    def matches(self, status_name: str) -> bool:
        if self.kind in ('name', 'expected'):
            return status_name == self.pattern
        if self.kind in ('startswith', 'find_and_remove_prefix'):
            return status_name.startswith(self.pattern)
        if self.kind == 'contains':
            return self.pattern in status_name
        return re.fullmatch(self.pattern, status_name) is not None


@dataclass(frozen=True, slots=True)
class Analyzer:
    """Where an analyzer puts its statuses and which name prefixes it removes."""

    key: str
    path: str  # e.g. '/VLA/Robots'
    prefixes: tuple[str, ...]


def _as_list(value: Any, where: str) -> list[str]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise ValueError(f'{where} must be a string or a list of non-empty strings')
    return values


def rules_from_params(params: Mapping[str, Any], prefix: str = '') -> Iterator[Rule]:
    """Every matching rule of the analyzers in ``params`` (the ``ros__parameters`` mapping)."""
    for key, value in params.items():
        if not isinstance(value, Mapping) or 'type' not in value:
            continue
        where = f'{prefix}{key}'
        kind = value['type']
        if kind == GROUP:
            yield from rules_from_params(value.get('analyzers', {}), f'{where}.')
        elif kind == GENERIC:
            found = False
            for rule_kind in RULE_KINDS:
                if rule_kind in value:
                    found = True
                    for pattern in _as_list(value[rule_kind], f'{where}.{rule_kind}'):
                        if rule_kind == 'regex':
                            re.compile(pattern)
                        yield Rule(where, rule_kind, pattern)
            if not found:
                raise ValueError(f'analyzer {where} has no matching parameter')


def analyzers_from_params(
    params: Mapping[str, Any], base_path: str = '', prefix: str = ''
) -> dict[str, Analyzer]:
    """Each generic analyzer by key path, with its full path (``params['path']`` of the
    top level, then each analyzer's) and the prefixes it removes."""
    base = base_path or '/' + str(params.get('path', '')).strip('/')
    found: dict[str, Analyzer] = {}
    for key, value in params.items():
        if not isinstance(value, Mapping) or 'type' not in value:
            continue
        where = f'{prefix}{key}'
        path = f'{base.rstrip("/")}/{value["path"]}'
        if value['type'] == GROUP:
            found.update(analyzers_from_params(value.get('analyzers', {}), path, f'{where}.'))
        elif value['type'] == GENERIC:
            chaff = [
                p
                for kind in CHAFF_KINDS
                if kind in value
                for p in _as_list(value[kind], f'{where}.{kind}')
            ]
            found[where] = Analyzer(where, path, tuple(chaff))
    return found


def claims(rules: list[Rule], status_name: str) -> list[Rule]:
    """The rules that claim ``status_name``."""
    return [rule for rule in rules if rule.matches(status_name)]


def _slashes_to_spaces(name: str) -> str:
    return name.replace('/', ' ')


def _remove_leading(row: str, chaff: str) -> str:
    last = row.rfind('/')
    head, tail = row[: last + 1], row[last + 1 :]
    if chaff and tail.startswith(chaff):
        tail = tail[len(chaff) :]
    if chaff and tail.startswith(':'):
        tail = tail[1:]
    if chaff:
        tail = tail.lstrip(' ')
    return head + tail


def row_name(analyzer: Analyzer, status_name: str) -> str:
    """The row ``status_name`` becomes under ``analyzer`` on /diagnostics_agg."""
    row = f'{analyzer.path}/{_slashes_to_spaces(status_name)}'
    for chaff in analyzer.prefixes:
        row = _remove_leading(row, _slashes_to_spaces(chaff))
    return row
