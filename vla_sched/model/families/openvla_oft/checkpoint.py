"""OpenVLA-OFT checkpoints: the settings their files cannot say, and their spec.

An OFT folder is an OpenVLA folder (openvla-7b's ``config.json``, the merged model's
safetensors, the tokenizer) plus ``dataset_statistics.json`` and component files written
by openvla-oft's training: ``action_head--<step>_checkpoint.pt`` (the L1-regression MLP
head) and, when trained with proprioception, ``proprio_projector--<step>_checkpoint.pt``.
Chunk length, action and proprio sizes, the normalization, the number of cameras and the
center crop are fixed by upstream's ``prismatic/vla/constants.py`` (chosen there from the
process's command line) and its evaluation settings; here they are ``OFTSettings``, given
by the caller, with a preset per platform upstream defines (``OFT_PRESETS``).

``read_oft_spec`` reads JSON and file names only (no torch): the widths of the component
files are checked when they are loaded (``weights.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vla_sched.model.config.action_space import (
    ACTION_STATISTICS_FILE,
    ActionStatisticsError,
    select_statistics,
)
from vla_sched.model.config.architecture import UnsupportedArchitectureError
from vla_sched.model.config.checkpoint_spec import (
    OPENVLA_MODEL_TYPE,
    CheckpointError,
    CheckpointSpec,
)
from vla_sched.model.config.openvla import OPENVLA_APPEND_TOKEN_ID, openvla_spec_from_dicts

# The component files an OpenVLA-OFT training run writes beside the merged model
# ('<component>--<step>_checkpoint.pt' or '<component>--latest_checkpoint.pt').
ACTION_HEAD_COMPONENT = 'action_head'
PROPRIO_PROJECTOR_COMPONENT = 'proprio_projector'
DIFFUSION_COMPONENT = 'noisy_action_projector'
FILM_COMPONENT = 'vision_backbone'
OPENVLA_OFT_COMPONENTS = (
    ACTION_HEAD_COMPONENT,
    PROPRIO_PROJECTOR_COMPONENT,
    DIFFUSION_COMPONENT,
    FILM_COMPONENT,
)
# Components of the variants not served here, and what each one means.
OUT_OF_SCOPE_COMPONENTS = {
    DIFFUSION_COMPONENT: 'a diffusion action head',
    FILM_COMPONENT: 'a FiLM vision backbone (OFT+)',
}
# predict_action's appended ids: A*K placeholders (ones; their embeddings are zeroed), then
# the stop token '</s>' that training put after the actions.
OFT_ACTION_PLACEHOLDER_ID = 1
OFT_STOP_TOKEN_ID = 2
NORMALIZATIONS = ('bounds', 'bounds_q99')  # min/max, or q01/q99, each mapped to [-1, 1]
MAX_OFT_IMAGES = 3  # primary camera plus up to two wrist cameras
# Added to the range in both directions of the normalization, as upstream does.
BOUNDS_EPSILON = 1e-8


@dataclass(frozen=True, slots=True)
class OFTSettings:
    """What an OFT checkpoint's files cannot say; the platform presets are ``OFT_PRESETS``.

    Attributes:
        chunk_len: Actions per chunk (upstream's ``NUM_ACTIONS_CHUNK``).
        action_dim: Values per action (``ACTION_DIM``).
        proprio_dim: Values of the robot state (``PROPRIO_DIM``).
        normalization: ``bounds`` (min/max) or ``bounds_q99`` (q01/q99), for actions and
            state alike (``ACTION_PROPRIO_NORMALIZATION_TYPE``).
        num_images: Cameras per step (``num_images_in_input``): the primary one first, then
            up to two wrist cameras.
        use_proprio: Whether the state enters as one projected token.
        center_crop: Whether every image is center-cropped to 90% of its area and resized
            back, as the evaluation does (the caller crops before the model sees it).
    """

    chunk_len: int
    action_dim: int
    proprio_dim: int
    normalization: str
    num_images: int
    use_proprio: bool = True
    center_crop: bool = True

    def __post_init__(self) -> None:
        for name in ('chunk_len', 'action_dim', 'proprio_dim', 'num_images'):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f'OFT setting {name} must be a positive integer, got {value!r}')
        if self.num_images > MAX_OFT_IMAGES:
            raise ValueError(
                f'OFT setting num_images must be 1 to {MAX_OFT_IMAGES}, got {self.num_images}'
            )
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                f'OFT setting normalization must be one of {NORMALIZATIONS}, got '
                f'{self.normalization!r}'
            )

    @property
    def num_action_tokens(self) -> int:
        """Placeholder positions of one chunk: ``chunk_len * action_dim``."""
        return self.chunk_len * self.action_dim


# Upstream's platforms (prismatic/vla/constants.py: chunk, action and proprio sizes,
# normalization). Cameras: LIBERO's evaluation uses the agent view and the wrist camera;
# ALOHA's the top camera and both wrists; Bridge has one camera (no wrist camera in its
# dataset). Every evaluation center-crops.
OFT_PRESETS: dict[str, OFTSettings] = {
    'libero': OFTSettings(
        chunk_len=8, action_dim=7, proprio_dim=8, normalization='bounds_q99', num_images=2
    ),
    'aloha': OFTSettings(
        chunk_len=25, action_dim=14, proprio_dim=14, normalization='bounds', num_images=3
    ),
    'bridge': OFTSettings(
        chunk_len=5, action_dim=7, proprio_dim=7, normalization='bounds_q99', num_images=1
    ),
}


def oft_preset(name: str, **overrides: Any) -> OFTSettings:
    """The settings of a platform preset (``libero``, ``aloha``, ``bridge``), with fields
    replaced by ``overrides`` (e.g. ``use_proprio=False`` or ``chunk_len=50``).

    Raises:
        ValueError: for an unknown preset or field, or a value the settings refuse.
    """
    if name not in OFT_PRESETS:
        raise ValueError(f'unknown OFT preset {name!r}; use one of {sorted(OFT_PRESETS)}')
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(OFTSettings)})
    if unknown:
        raise ValueError(f'OFTSettings has no fields {unknown}')
    return dataclasses.replace(OFT_PRESETS[name], **overrides)


@dataclass(frozen=True, slots=True, eq=False)
class NormalizationBounds:
    """One dataset's low/high bounds of its actions or states, and which dimensions they
    apply to (``mask``; a dimension outside it passes unchanged, e.g. the gripper)."""

    low: np.ndarray
    high: np.ndarray
    mask: np.ndarray

    def __post_init__(self) -> None:
        if self.low.ndim != 1 or self.low.size == 0:
            raise ActionStatisticsError(f'bounds must be a non-empty vector, got {self.low.shape}')
        for name in ('high', 'mask'):
            if getattr(self, name).shape != self.low.shape:
                raise ActionStatisticsError(
                    f'{name} has shape {getattr(self, name).shape}, low {self.low.shape}'
                )
        if not (np.isfinite(self.low).all() and np.isfinite(self.high).all()):
            raise ActionStatisticsError('bounds must be finite')

    @property
    def dim(self) -> int:
        return int(self.low.shape[0])

    def unnormalize(self, normalized: np.ndarray) -> np.ndarray:
        """``[..., dim]`` values in [-1, 1] -> robot units (float64), upstream's
        ``_unnormalize_actions``: ``0.5 (x + 1) (high - low + 1e-8) + low`` where masked."""
        x = np.asarray(normalized, dtype=np.float64)
        span = self.high - self.low + BOUNDS_EPSILON
        return np.where(self.mask, 0.5 * (x + 1.0) * span + self.low, x)

    def normalize(self, values: np.ndarray) -> np.ndarray:
        """Robot units -> [-1, 1] (float64), upstream's ``normalize_proprio``:
        ``2 (x - low) / (high - low + 1e-8) - 1`` where masked, then everything clipped."""
        x = np.asarray(values, dtype=np.float64)
        span = self.high - self.low + BOUNDS_EPSILON
        return np.clip(np.where(self.mask, 2.0 * (x - self.low) / span - 1.0, x), -1.0, 1.0)

    @classmethod
    def from_statistics(
        cls, entry: Mapping[str, Any], *, normalization: str, where: str
    ) -> NormalizationBounds:
        """Read ``{"min", "max", "q01", "q99", "mask"?}`` with the keys ``normalization``
        uses (``mask`` defaults to every dimension).

        Raises:
            ActionStatisticsError: naming ``where`` and the missing or malformed key.
        """
        low_key, high_key = ('min', 'max') if normalization == 'bounds' else ('q01', 'q99')
        missing = [k for k in (low_key, high_key) if k not in entry]
        if missing:
            raise ActionStatisticsError(
                f'{where} lacks {missing}, which normalization {normalization!r} needs'
            )
        low = np.asarray(entry[low_key], dtype=np.float64)
        high = np.asarray(entry[high_key], dtype=np.float64)
        mask = entry.get('mask')
        mask = np.ones(low.shape, dtype=bool) if mask is None else np.asarray(mask)
        if mask.dtype != np.bool_:
            raise ActionStatisticsError(f'{where}: mask must hold booleans, got {mask.dtype}')
        try:
            return cls(low=low, high=high, mask=mask)
        except ActionStatisticsError as exc:
            raise ActionStatisticsError(f'{where}: {exc}') from None


@dataclass(frozen=True, slots=True)
class OFTComponentFiles:
    """The component files a folder's spec was read with (names inside the folder)."""

    action_head: str
    proprio_projector: str | None


@dataclass(frozen=True, slots=True, eq=False)
class OFTCheckpointSpec:
    """Everything about an OpenVLA-OFT checkpoint the runner and the engine agree on.

    ``base`` is the merged OpenVLA model's spec (decoder, towers, image token, prompt);
    ``action_bounds`` and ``proprio_bounds`` hold every dataset's bounds under the
    settings' normalization (``proprio_bounds`` is empty without proprio); ``unnorm_key``
    picks the dataset (it may stay None with a single dataset).
    """

    base: CheckpointSpec
    settings: OFTSettings
    action_bounds: Mapping[str, NormalizationBounds]
    proprio_bounds: Mapping[str, NormalizationBounds]
    files: OFTComponentFiles
    unnorm_key: str | None = None

    def __post_init__(self) -> None:
        if self.unnorm_key is not None:
            select_statistics(self.base.action_statistics, self.unnorm_key)

    def with_unnorm_key(self, unnorm_key: str) -> OFTCheckpointSpec:
        """The same spec (un)normalizing with another dataset's statistics.

        Raises:
            ActionStatisticsError: naming the datasets when ``unnorm_key`` is not one.
        """
        select_statistics(self.base.action_statistics, unnorm_key)
        return dataclasses.replace(
            self, base=self.base.with_unnorm_key(unnorm_key), unnorm_key=unnorm_key
        )

    @property
    def dataset(self) -> str:
        """The dataset whose statistics this spec uses.

        Raises:
            ActionStatisticsError: with several datasets and no ``unnorm_key``.
        """
        if self.unnorm_key is not None:
            return self.unnorm_key
        select_statistics(self.base.action_statistics, None)  # raises for several
        return next(iter(self.action_bounds))

    @property
    def selected_action_bounds(self) -> NormalizationBounds:
        return self.action_bounds[self.dataset]

    @property
    def selected_proprio_bounds(self) -> NormalizationBounds | None:
        return self.proprio_bounds[self.dataset] if self.settings.use_proprio else None

    @property
    def chunk_len(self) -> int:
        return self.settings.chunk_len

    @property
    def action_dim(self) -> int:
        return self.settings.action_dim

    @property
    def num_image_tokens(self) -> int:
        """Placeholder tokens of one camera image."""
        return self.base.num_image_tokens


def oft_component_files(folder: Path) -> dict[str, list[str]]:
    """The OFT component files in ``folder``, by component (only components present).

    A component file is ``<component>--<anything>`` holding ``checkpoint`` in its name, as
    upstream's loader finds it.
    """
    found: dict[str, list[str]] = {}
    for component in OPENVLA_OFT_COMPONENTS:
        names = sorted(
            p.name
            for p in folder.glob(f'{component}--*')
            if p.is_file() and 'checkpoint' in p.name
        )
        if names:
            found[component] = names
    return found


def _one_file(found: Mapping[str, list[str]], component: str, folder: Path) -> str | None:
    names = found.get(component, [])
    if len(names) > 1:
        raise CheckpointError(
            f'{folder} holds several {component} files {names}: keep the one to serve'
        )
    return names[0] if names else None


def oft_files_for(folder: Path, settings: OFTSettings) -> OFTComponentFiles:
    """The component files ``settings`` need, checked against what ``folder`` holds.

    Raises:
        UnsupportedArchitectureError: for a diffusion head or a FiLM backbone (out of scope).
        CheckpointError: naming the missing, ambiguous or unexpected file.
    """
    found = oft_component_files(folder)
    for component, meaning in OUT_OF_SCOPE_COMPONENTS.items():
        if component in found:
            raise UnsupportedArchitectureError(
                f'{folder} holds {", ".join(found[component])}: {meaning}, which is not '
                'served (only the L1-regression head without FiLM)'
            )
    head = _one_file(found, ACTION_HEAD_COMPONENT, folder)
    if head is None:
        raise CheckpointError(
            f'{folder} has no {ACTION_HEAD_COMPONENT}--*checkpoint.pt: an OpenVLA-OFT '
            'checkpoint needs its action head'
        )
    proprio = _one_file(found, PROPRIO_PROJECTOR_COMPONENT, folder)
    if settings.use_proprio and proprio is None:
        raise CheckpointError(
            f'OFT setting use_proprio is true but {folder} has no '
            f'{PROPRIO_PROJECTOR_COMPONENT}--*checkpoint.pt'
        )
    if not settings.use_proprio and proprio is not None:
        raise CheckpointError(
            f'OFT setting use_proprio is false but {folder} holds {proprio}: the checkpoint '
            'was trained with the state as input'
        )
    return OFTComponentFiles(action_head=head, proprio_projector=proprio)


def _bounds_per_dataset(
    statistics: Mapping[str, Any], kind: str, settings: OFTSettings, expected_dim: int
) -> dict[str, NormalizationBounds]:
    bounds = {}
    for name, entry in statistics.items():
        where = f'{ACTION_STATISTICS_FILE}[{name!r}][{kind!r}]'
        if not isinstance(entry, Mapping) or not isinstance(entry.get(kind), Mapping):
            raise ActionStatisticsError(f'{where} is missing')
        found = NormalizationBounds.from_statistics(
            entry[kind], normalization=settings.normalization, where=where
        )
        if found.dim != expected_dim:
            setting = 'action_dim' if kind == 'action' else 'proprio_dim'
            raise CheckpointError(
                f'{where} has {found.dim} dimensions but OFT setting {setting} is {expected_dim}'
            )
        bounds[name] = found
    return bounds


def oft_spec_from_dicts(
    config: Mapping[str, Any],
    statistics: Mapping[str, Any],
    settings: OFTSettings,
    files: OFTComponentFiles,
    *,
    vla: Mapping[str, Any] | None = None,
) -> OFTCheckpointSpec:
    """The spec of an OFT folder from its parsed ``config.json``, ``dataset_statistics.json``
    and ``vla_config.json`` (only ``unnorm_key`` may be set there) and the settings.

    Raises:
        UnsupportedArchitectureError, CheckpointError, ActionStatisticsError: naming the
            field or setting that disagrees.
    """
    if config.get('model_type') != OPENVLA_MODEL_TYPE:
        raise UnsupportedArchitectureError(
            f'an OpenVLA-OFT folder holds an OpenVLA config.json (model_type '
            f'{OPENVLA_MODEL_TYPE!r}), got model_type {config.get("model_type")!r}'
        )
    base = openvla_spec_from_dicts(config, statistics, vla=vla)
    if base.prompt.append_token_id != OPENVLA_APPEND_TOKEN_ID:
        raise CheckpointError('an OpenVLA-OFT prompt ends with token 29871')
    action = _bounds_per_dataset(statistics, 'action', settings, settings.action_dim)
    proprio = {}
    if settings.use_proprio:
        proprio = _bounds_per_dataset(statistics, 'proprio', settings, settings.proprio_dim)
    return OFTCheckpointSpec(
        base=base,
        settings=settings,
        action_bounds=action,
        proprio_bounds=proprio,
        files=files,
        unnorm_key=base.unnorm_key,
    )


def read_oft_spec(folder: str | Path, settings: OFTSettings) -> OFTCheckpointSpec:
    """Read an OFT folder's spec under ``settings`` (JSON and file names only).

    Raises:
        CheckpointError, UnsupportedArchitectureError, ActionStatisticsError: naming the
            file, field or setting that disagrees.
    """
    from vla_sched.model.config.checkpoint_spec import (
        CONFIG_FILE,
        TOKENIZER_FILE,
        VLA_CONFIG_FILE,
        read_json,
    )

    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f'checkpoint folder {folder} does not exist')
    files = oft_files_for(folder, settings)
    if not (folder / TOKENIZER_FILE).is_file():
        raise CheckpointError(
            f'missing {TOKENIZER_FILE} in {folder}: an OpenVLA folder needs the tokenizer '
            f'files it was published with ({TOKENIZER_FILE}, tokenizer_config.json)'
        )
    config = read_json(folder / CONFIG_FILE)
    vla = read_json(folder / VLA_CONFIG_FILE) if (folder / VLA_CONFIG_FILE).is_file() else {}
    statistics = read_json(folder / ACTION_STATISTICS_FILE)
    return oft_spec_from_dicts(config, statistics, settings, files, vla=vla)
