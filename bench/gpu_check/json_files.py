"""The run's JSON and text files, each written whole: to a temporary file beside it, then
renamed over it, so a process stopped at any moment leaves the old file or the new one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def jsonable(value: Any) -> Any:
    """JSON for what ``json`` cannot write itself (paths, tuples, sets; else the repr)."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | set):
        return list(value)
    return repr(value)


def json_text(data: Any) -> str:
    return json.dumps(data, indent=1, default=jsonable) + '\n'


def write_whole(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` through ``.NAME.tmp`` and a rename."""
    tmp = path.with_name(f'.{path.name}.tmp')
    tmp.write_text(text)
    os.replace(tmp, path)


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``; None when there is no such file."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
