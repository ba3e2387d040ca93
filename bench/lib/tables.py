"""Markdown tables for benchmark reports: one renderer, numbers formatted one way."""

from __future__ import annotations

import math
from collections.abc import Sequence


def cell(value: object, *, digits: int = 2) -> str:
    """One table cell: floats with ``digits`` decimals, NaN as ``n/a``, the rest as str."""
    if isinstance(value, bool):
        return 'yes' if value else 'no'
    if isinstance(value, float):
        return 'n/a' if math.isnan(value) else f'{value:.{digits}f}'
    return str(value)


def markdown_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, digits: int = 2
) -> str:
    """A GitHub markdown table of ``rows`` under ``headers`` (each row as long as headers)."""
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f'a row has {len(row)} cells for {len(headers)} headers: {row}')
    lines = ['| ' + ' | '.join(headers) + ' |', '|' + '---|' * len(headers)]
    lines += ['| ' + ' | '.join(cell(v, digits=digits) for v in row) + ' |' for row in rows]
    return '\n'.join(lines)
