"""How the generated messages and the Python sources meet under one package name.

Decision: the messages are installed by CMake into a prefix (the development venv, or a colcon
install space); the sources may live elsewhere (this checkout). ``vla_sched/__init__.py`` uses
``pkgutil.extend_path`` so that every ``vla_sched`` folder on ``sys.path`` serves the package.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _import_locations(cwd: Path) -> dict[str, str]:
    code = (
        'import json, vla_sched.msg, vla_sched.core, vla_sched.kernels\n'
        'print(json.dumps({m.__name__: m.__file__ for m in '
        '(vla_sched.msg, vla_sched.core, vla_sched.kernels)}))'
    )
    out = subprocess.run(
        [sys.executable, '-c', code], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout
    import json

    return json.loads(out)


def test_messages_come_from_the_install_prefix_and_sources_from_the_checkout(tmp_path):
    where = _import_locations(tmp_path)  # outside the checkout: no '' entry pointing at it
    assert Path(where['vla_sched.core']).is_relative_to(ROOT / 'vla_sched')
    assert Path(where['vla_sched.kernels']).resolve().is_relative_to(ROOT / 'kernels')
    msg_path = Path(where['vla_sched.msg'])
    assert not msg_path.is_relative_to(ROOT / 'vla_sched'), 'messages must be generated code'
    assert msg_path.parent.name == 'msg'


def test_source_tree_holds_no_generated_message_code():
    assert not (ROOT / 'vla_sched' / 'msg').exists()
    assert (ROOT / 'vla_sched' / 'kernels').resolve() == ROOT / 'kernels'
