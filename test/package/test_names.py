"""One name, one class; one place that rounds lengths to KV pages.

* No top-level class name is defined twice in ``vla_sched/`` and ``kernels/``: a reader
  (and an import) must never have to guess which ``StepResult`` is meant.
* Page rounding is written only in ``vla_sched/core/memory/pages.py``. Outside it, in
  ``vla_sched/`` and ``bench/`` code (comments and strings aside), these idioms are
  refused: rounding to a multiple (``-(-x // d) * d``, ``x // d * d``, ``x - x % d``) for
  any ``d``, and ceiling division (``-(-x // d)``, ``(x + d - 1) // d``) when ``d`` names a
  page (``page_size``, ``self.page_size``, ``page`` or the docstrings' ``p``/``P``). The
  kernels do their own grid arithmetic and are not scanned; tests compute expected values
  their own way and are not scanned either.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES_MODULE = ROOT / 'vla_sched' / 'core' / 'memory' / 'pages.py'

_DIVISOR = r'(?P<d>[\w.]+)'
_PAGE_DIVISOR = r'(?P<d>[\w.]*page[\w.]*|[pP])'
PAGE_ROUNDING = {
    'round up': re.compile(rf'-\(\s*-.*?//\s*{_DIVISOR}\s*\)\s*\*\s*(?P=d)\b'),
    'round down': re.compile(rf'//\s*{_DIVISOR}\s*\*\s*(?P=d)\b'),
    'round down by remainder': re.compile(r'(?<![\w.])(?P<x>[\w.]+)\s*-\s*(?P=x)\s*%'),
    'pages needed': re.compile(rf'-\(\s*-.*?//\s*{_PAGE_DIVISOR}\s*\)'),
    'pages needed, added': re.compile(rf'\+\s*{_PAGE_DIVISOR}\s*-\s*1\s*\)\s*//\s*(?P=d)\b'),
}
_NOT_CODE = {tokenize.STRING, tokenize.COMMENT, getattr(tokenize, 'FSTRING_MIDDLE', -1)}


def _python_files(*folders: str) -> list[Path]:
    """The ``.py`` files under ``folders``, each once (``vla_sched/kernels`` is a link)."""
    files = {p.resolve() for folder in folders for p in (ROOT / folder).rglob('*.py')}
    return sorted(files)


def _code_only(source: str) -> str:
    """``source`` with its strings and comments blanked out (line and column kept)."""
    lines = source.splitlines(keepends=True)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            continue
        (row, col), (end_row, end_col) = tok.start, tok.end
        for r in range(row, end_row + 1):
            line = lines[r - 1]
            start = col if r == row else 0
            stop = end_col if r == end_row else len(line.rstrip('\n'))
            lines[r - 1] = line[:start] + ' ' * (stop - start) + line[stop:]
    return ''.join(lines)


def _page_rounding(source: str) -> list[str]:
    """Each page-rounding idiom in ``source``'s code, as ``'kind: line'``."""
    found = []
    for number, line in enumerate(_code_only(source).splitlines(), 1):
        for kind, pattern in PAGE_ROUNDING.items():
            if pattern.search(line):
                found.append(f'{number}: {kind}: {line.strip()}')
    return found


def test_no_top_level_class_name_is_defined_twice():
    defined = defaultdict(list)
    for path in _python_files('vla_sched', 'kernels'):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                defined[node.name].append(str(path.relative_to(ROOT)))
    assert len(defined) > 50  # the scan did reach the package
    assert {name: paths for name, paths in defined.items() if len(paths) > 1} == {}


@pytest.mark.parametrize(
    'code',
    [
        'n = -(-num_tokens // page_size) * page_size',
        'n = -(-len(ids) // self.page_size) * self.page_size',
        'n = len(prompt) // page_size * page_size',
        'n = (a + p - 1) // p * p',
        'start = slot - slot % page_size',
        'num_pages = -(-length // page)',
        'num_pages = (seq_lens + p - 1) // p',
        'num_pages = (seq_lens + self.page_size - 1) // self.page_size',
    ],
)
def test_page_rounding_idioms_are_recognized(code):
    assert _page_rounding(code + '\n')


@pytest.mark.parametrize(
    'code',
    [
        'reps = -(-MIN_CALLS // len(prompts))',  # a ceiling, not of pages
        'slot = page * page_size + pos % page_size',  # an address, not a rounding
        'num_pages = pool_tokens // page_size',
        "'''Rounds with x // page_size * page_size.'''",
        'n = 3  # -(-x // page_size) * page_size',
        'n = num_tokens // page_size * page_size_other',
        'n = total - x % page_size',
        'n = ax - x % page_size',
    ],
)
def test_other_arithmetic_is_not_taken_for_page_rounding(code):
    assert _page_rounding(code + '\n') == []


def test_page_rounding_is_written_only_in_the_pages_module():
    assert _page_rounding(PAGES_MODULE.read_text())  # the patterns see the helpers
    found = []
    for path in _python_files('vla_sched', 'bench'):
        if path == PAGES_MODULE or (ROOT / 'kernels') in path.parents:
            continue
        found += [f'{path.relative_to(ROOT)}:{hit}' for hit in _page_rounding(path.read_text())]
    assert found == []
