"""config/diagnostics_analyzers.yaml claims every status of every node exactly once, and the
rows they become in rqt_robot_monitor are short and never shared by two statuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from analyzer_rules import Rule, analyzers_from_params, claims, row_name, rules_from_params

from vla_sched.ros.diagnostic_keys import (
    robot_status_name,
    scheduler_status_name,
    status_names,
)

ROOT = Path(__file__).resolve().parents[2]
ANALYZERS = ROOT / 'config' / 'diagnostics_analyzers.yaml'
ROBOT_IDS = ['robot_0', 'robot_1', 'robot_12', 'arm_left', 'scheduler', 'R2', 'robotx']
NODES = ['/vla_sched', '/gpu0/vla_sched', '/gpu1/vla_sched', '/site/gpu_2/vla_sched']
ALL_NAMES = [name for node in NODES for name in status_names(node, ROBOT_IDS)]


def _params() -> dict:
    # diagnostic_aggregator's node is named 'analyzers'
    return yaml.safe_load(ANALYZERS.read_text())['analyzers']['ros__parameters']


def _rules() -> list[Rule]:
    return list(rules_from_params(_params()))


def _row(name: str) -> str:
    (rule,) = claims(_rules(), name)
    return row_name(analyzers_from_params(_params())[rule.analyzer], name)


@pytest.mark.parametrize('name', ALL_NAMES)
def test_every_status_of_every_node_is_claimed_by_exactly_one_rule(name):
    found = claims(_rules(), name)
    assert len(found) == 1, f'{name!r} is claimed by {found}'


@pytest.mark.parametrize('node', NODES)
def test_scheduler_and_robots_land_in_different_groups(node):
    rules = _rules()
    scheduler = claims(rules, scheduler_status_name(node))[0].analyzer
    robots = {claims(rules, n)[0].analyzer for n in status_names(node, ROBOT_IDS)[1:]}
    assert robots == {'robots'} and scheduler == 'scheduler'


def test_the_root_namespace_nodes_rows_show_the_robot_id_alone():
    assert _row(robot_status_name('/vla_sched', 'robot_0')) == '/VLA/Robots/robot_0'
    assert _row(robot_status_name('/vla_sched', 'scheduler')) == '/VLA/Robots/scheduler'
    assert _row(scheduler_status_name('/vla_sched')) == '/VLA/Scheduler/scheduler'


def test_namespaced_nodes_rows_keep_their_namespace_one_path_level_deep():
    row = _row(robot_status_name('/gpu0/vla_sched', 'robot_0'))
    assert row == '/VLA/Robots/gpu0 vla_sched: robot robot_0'
    row = _row(scheduler_status_name('/gpu0/vla_sched'))
    assert row == '/VLA/Scheduler/gpu0 vla_sched: scheduler'


def test_no_two_statuses_of_any_nodes_share_a_row():
    rows = [_row(name) for name in ALL_NAMES]
    assert len(set(rows)) == len(rows)


@pytest.mark.parametrize(
    'name',
    [
        'other_node: cpu',
        'vla_sched',
        'robot_0',
        'vla_sched: sched',
        'vla_sched: scheduler',  # no node name
        '/vla_sched_2: scheduler',
        '/gpu0/other: robot robot_0',
        '/gpu0/vla_sched: robot ',
        '/gpu0/vla_sched: robot a b',
    ],
)
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
    assert len(claims(list(rules_from_params(params)), '/vla_sched: robot robot_0')) == 2


def test_rows_follow_the_aggregators_prefix_removal():
    params = {
        'path': 'Top',
        'g': {
            'type': 'diagnostic_aggregator/AnalyzerGroup',
            'path': 'G',
            'analyzers': {
                'a': {
                    'type': 'diagnostic_aggregator/GenericAnalyzer',
                    'path': 'A',
                    'find_and_remove_prefix': ['/cam'],
                    'remove_prefix': 'x',
                },
            },
        },
    }
    analyzer = analyzers_from_params(params)['g.a']
    assert analyzer.path == '/Top/G/A' and analyzer.prefixes == ('/cam', 'x')
    assert row_name(analyzer, '/cam: rate') == '/Top/G/A/rate'  # prefix, ':' and spaces
    assert row_name(analyzer, '/ns/cam: rate') == '/Top/G/A/ns cam: rate'  # not leading
    assert row_name(analyzer, 'xy') == '/Top/G/A/y'


def test_an_analyzer_without_patterns_is_refused():
    params = {'bad': {'type': 'diagnostic_aggregator/GenericAnalyzer', 'path': 'Bad'}}
    with pytest.raises(ValueError, match='bad has no matching parameter'):
        list(rules_from_params(params))


def test_patterns_hold_no_list_separators_the_aggregator_would_split():
    for rule in _rules():
        assert not set(rule.pattern) & set('[],'), rule
        assert rule.pattern == rule.pattern.strip(), rule
