"""Where the engine's checkpoint comes from (a folder, or the built-in tiny one), which
model family serves it, and whether the engine's settings suit it."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vla_sched.engine.config import EngineConfig
    from vla_sched.model.families.protocol import FamilyOptions, ServedModel

TINY_CHECKPOINT_NAME = 'tiny-vla-v1'


class ModelPathError(ValueError):
    """``engine.model_path`` (or ``engine.unnorm_key``) names nothing the engine can serve."""


def cache_dir() -> Path:
    """vla_sched's cache folder (``$XDG_CACHE_HOME/vla_sched`` or ``~/.cache/vla_sched``)."""
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return Path(base) / 'vla_sched'


def resolve_checkpoint(model_path: str) -> tuple[Path, bool]:
    """The checkpoint folder to load, and whether it is the built-in random one.

    An empty ``model_path`` means the built-in tiny random checkpoint: built on first use in
    the cache folder, into a temporary folder renamed into place, so a crash mid-build
    never leaves a half-written checkpoint behind.
    """
    if model_path:
        folder = Path(model_path).expanduser()
        if not (folder / 'config.json').is_file():
            raise FileNotFoundError(f'no checkpoint at {folder} (config.json missing)')
        return folder, False
    folder = cache_dir() / TINY_CHECKPOINT_NAME
    if (folder / 'config.json').is_file():
        return folder, True
    from vla_sched.model.loading.tiny_checkpoint import build_tiny_checkpoint

    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f'.{TINY_CHECKPOINT_NAME}-', dir=folder.parent))
    try:
        build_tiny_checkpoint(staging, seed=0, action_horizon=2)
        try:
            staging.rename(folder)
        except OSError:
            if not (folder / 'config.json').is_file():  # not a concurrent build that won
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder, True


def family_options(config: EngineConfig) -> FamilyOptions:
    """The engine's settings as a model family reads them."""
    from vla_sched.model.families.protocol import FamilyOptions

    return FamilyOptions(
        settings=config.to_mapping(),
        center_crop_robots=frozenset(r for r in config.robots if config.robot_center_crop(r)),
    )


def open_served(folder: Path, config: EngineConfig) -> ServedModel:
    """The checkpoint in ``folder`` as its family serves it under ``config`` (the weights
    load when the family builds its runner)."""
    from vla_sched.model.families.registry import family_of

    return family_of(folder).open(folder, family_options(config))


def check_model_path(config: EngineConfig) -> None:
    """Check cheaply (JSON files only: no transformers, no torch) that the engine can serve
    ``config.model_path`` with ``config.unnorm_key``.

    The folder must exist and be of a known model family (``families.registry``), which
    checks it under the engine's settings (its own settings, its action statistics);
    ``unnorm_key`` must name one of its datasets, or be empty for a checkpoint with one
    dataset (or one whose ``vla_config.json`` names its own). Settings owned by another
    family are refused, and ``engine.core sequential`` for a family with no one-step
    baseline. The engine reads the whole spec when it loads. For the built-in tiny
    checkpoint (``model_path`` empty) only the settings of other families are refused.

    Raises:
        ModelPathError: naming the setting and what is wrong (the dataset names when the
            ``unnorm_key`` is missing or unknown).
    """
    from vla_sched.model.families.protocol import FamilyError
    from vla_sched.model.families.registry import family_of, foreign_settings, known_families

    settings = config.to_mapping()
    if not config.model_path:
        owned = [
            f'engine.{name}'
            for family in known_families()
            for name, unset in family.owned_settings.items()
            if settings.get(name, unset) != unset
        ]
        if owned:
            raise ModelPathError(
                f'{", ".join(owned)} set but engine.model_path is empty: the built-in tiny '
                'checkpoint takes none of them'
            )
        return
    folder = Path(config.model_path).expanduser()
    try:
        family = family_of(folder)
        foreign = foreign_settings(family, settings)
        if foreign:
            raise ModelPathError(
                f'{", ".join(foreign)} set but engine.model_path {str(folder)!r} is a '
                f'{family.name} checkpoint, which does not take them: leave them unset'
            )
        if config.core == 'sequential' and not family.has_one_step_baseline:
            raise ModelPathError(
                f'engine.core sequential does not serve {family.name} checkpoints '
                f'(engine.model_path {str(folder)!r}): use engine.core scheduled'
            )
        names, own_key = family.check_folder(folder, family_options(config))
    except FamilyError as exc:
        raise ModelPathError(f'engine.model_path {str(folder)!r}: {exc}') from None
    key = config.unnorm_key
    if key and key not in names:
        raise ModelPathError(
            f'engine.unnorm_key {key!r} is not a dataset of {folder}; choose one of {list(names)}'
        )
    if not key and own_key is None and len(names) > 1:
        raise ModelPathError(
            f'engine.unnorm_key is empty but {folder} holds the action statistics of '
            f'{len(names)} datasets: set it to one of {list(names)}'
        )
