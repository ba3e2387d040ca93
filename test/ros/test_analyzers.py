"""config/diagnostics_analyzers.yaml claims every status the node publishes exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from analyzer_rules import Rule, claims, rules_from_params

from vla_sched.ros.diagnostics import status_names

ROOT = Path(__file__).resolve().parents[2]
ANALYZERS = ROOT / 'config' / 'diagnostics_analyzers.yaml'
ROBOT_IDS = ['robot_0', 'robot_1', 'robot_12', 'arm_left', 'scheduler', 'R2', 'robotx']


def _rules() -> list[Rule]:
    data = yaml.safe_load(ANALYZERS.read_text())
    # diagnostic_aggregator's node is named 'analyzers'
    return list(rules_from_params(data['analyzers']['ros__parameters']))


@pytest.mark.parametrize('name', status_names(ROBOT_IDS))
def test_every_status_is_claimed_by_exactly_one_rule(name):
    found = claims(_rules(), name)
    assert len(found) == 1, f'{name!r} is claimed by {found}'


def test_scheduler_and_robots_land_in_different_groups():
    rules = _rules()
    scheduler = claims(rules, 'vla_sched: scheduler')[0].analyzer
    robots = {claims(rules, n)[0].analyzer for n in status_names(ROBOT_IDS)[1:]}
    assert robots == {'robots'} and scheduler == 'scheduler'


@pytest.mark.parametrize('name', ['other_node: cpu', 'vla_sched', 'robot_0', 'vla_sched: sched'])
def test_foreign_statuses_are_left_to_other_analyzers(name):
    assert claims(_rules(), name) == []


def test_matching_follows_the_aggregator_rules():
    params = {
        'a': {'type': 'diagnostic_aggregator/GenericAnalyzer', 'path': 'A', 'name': 'x: y'},
        'g': {
            'type': 'diagnostic_aggregator/AnalyzerGroup',
            'path': 'G',
            'analyzers': {
                'b': {
                    'type': 'diagnostic_aggregator/GenericAnalyzer',
                    'path': 'B',
                    'regex': ['ro+t'],
                    'contains': 'mid',
                },
            },
        },
        'path': 'Top',
    }
    rules = list(rules_from_params(params))
    assert [(r.analyzer, r.kind) for r in rules] == [
        ('a', 'name'),
        ('g.b', 'contains'),
        ('g.b', 'regex'),
    ]
    assert [r.analyzer for r in claims(rules, 'x: y')] == ['a']
    assert claims(rules, 'x: yz') == []  # name is exact
    assert [r.kind for r in claims(rules, 'root')] == ['regex']
    assert claims(rules, 'roots') == []  # regex must match the whole name
    assert [r.kind for r in claims(rules, 'a mid b')] == ['contains']
    assert [r.kind for r in claims(rules, 'roomidt')] == ['contains']


def test_a_second_claim_is_detected():
    params = yaml.safe_load(ANALYZERS.read_text())['analyzers']['ros__parameters']
    params['everything'] = {
        'type': 'diagnostic_aggregator/GenericAnalyzer',
        'path': 'All',
        'contains': ['vla_sched'],
    }
    assert len(claims(list(rules_from_params(params)), 'vla_sched: robot robot_0')) == 2


def test_an_analyzer_without_patterns_is_refused():
    params = {'bad': {'type': 'diagnostic_aggregator/GenericAnalyzer', 'path': 'Bad'}}
    with pytest.raises(ValueError, match='bad has no matching parameter'):
        list(rules_from_params(params))


def test_patterns_hold_no_list_separators_the_aggregator_would_split():
    for rule in _rules():
        assert not set(rule.pattern) & set('[],'), rule
        assert rule.pattern == rule.pattern.strip(), rule
