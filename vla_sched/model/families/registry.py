"""Which family a checkpoint folder is of, and the families this package serves.

Each family is one folder under ``vla_sched/model/families/`` whose ``family`` module
defines ``FAMILY`` (a ``ModelFamily``); ``FAMILY_NAMES`` lists them, one line each. A
family that builds on another's folders (OpenVLA-OFT's folders hold an OpenVLA
``config.json``) is listed before it: the first family that claims a folder serves it.
Family modules are imported when first asked for, never at import time.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vla_sched.model.families.protocol import FamilyError, ModelFamily

FAMILY_NAMES = (
    'openvla_oft',
    'openvla',
    'pi0',
    'smolvla',
)


def family_named(name: str) -> ModelFamily:
    """The family listed as ``name``.

    Raises:
        FamilyError: for a name not listed, naming the families known.
    """
    if name not in FAMILY_NAMES:
        raise FamilyError(f'unknown model family {name!r}; known: {list(FAMILY_NAMES)}')
    return importlib.import_module(f'vla_sched.model.families.{name}.family').FAMILY


def known_families() -> tuple[ModelFamily, ...]:
    return tuple(family_named(name) for name in FAMILY_NAMES)


def family_of(folder: Path) -> ModelFamily:
    """The family that serves ``folder`` (the first listed that claims it).

    Raises:
        FamilyError: for a folder no family claims, naming what it holds and what each
            family looks for.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FamilyError(f'checkpoint folder {folder} does not exist')
    for family in known_families():
        if family.claims(folder):
            return family
    looks_for = '; '.join(f'{f.name}: {f.describe(folder)}' for f in known_families())
    raise FamilyError(
        f'{folder} is not a checkpoint of a known model family: it holds {_what_is_in(folder)}'
        f'. Families known: {looks_for}'
    )


def check_engine_settings(settings: Mapping[str, Any]) -> None:
    """Refuse any family's own settings that disagree among themselves (no I/O)."""
    for family in known_families():
        family.check_settings(settings)


def foreign_settings(family: ModelFamily, settings: Mapping[str, Any]) -> tuple[str, ...]:
    """The settings owned by other families that ``settings`` sets (away from their unset
    values), which ``family``'s folders cannot use, by parameter name."""
    from vla_sched.model.families.protocol import engine_setting_name

    found = []
    for other in known_families():
        if other.name == family.name:
            continue
        found += [
            engine_setting_name(name)
            for name, unset in other.owned_settings.items()
            if settings.get(name, unset) != unset
        ]
    return tuple(found)


def _what_is_in(folder: Path) -> str:
    config_path = folder / 'config.json'
    if not config_path.is_file():
        names = sorted(p.name for p in folder.iterdir())[:8]
        return f'no config.json (files: {names})'
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        return f'an unreadable config.json ({exc})'
    if not isinstance(config, Mapping):
        return 'a config.json that is not a JSON object'
    keys = {k: config[k] for k in ('model_type', 'type', 'architectures') if k in config}
    return f'a config.json with {keys or "no model_type, type or architectures"}'
