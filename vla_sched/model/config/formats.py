"""Which format a checkpoint folder is in, and its spec read through that format.

Sits above the formats (``llava.py``, ``openvla.py``) and dispatches on ``config.json``'s
``model_type``. Only JSON is read here (no torch; transformers only for an OpenVLA
``text_config``), so the engine can ask for the image token count, the action token range,
the horizon and the dof cheaply.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vla_sched.model.config.action_space import (
    ACTION_STATISTICS_FILE,
    ActionStatisticsError,
    load_action_statistics,
)
from vla_sched.model.config.architecture import (
    DecoderSpec,
    UnsupportedArchitectureError,
    VisionSpec,
)
from vla_sched.model.config.checkpoint_spec import (
    CONFIG_FILE,
    OPENVLA_MODEL_TYPE,
    PREPROCESSOR_FILE,
    SUPPORTED_MODEL_TYPES,
    TOKENIZER_FILE,
    VLA_CONFIG_FILE,
    CheckpointError,
    CheckpointSpec,
    base_vocab_size,
    read_json,
)
from vla_sched.model.config.llava import (
    LLAVA_MODEL_TYPES,
    llava_architecture,
    llava_spec_from_dicts,
)
from vla_sched.model.config.openvla import openvla_architecture, openvla_spec_from_dicts
from vla_sched.model.config.openvla_towers import OpenVLAVisionSpec


def parse_architecture(
    config: Mapping[str, Any],
) -> tuple[DecoderSpec, VisionSpec | OpenVLAVisionSpec | None]:
    """Decoder and vision specs of a LLaVA, OpenVLA (or text-only Llama/Qwen2) ``config.json``.

    Raises:
        UnsupportedArchitectureError: naming the field this package cannot serve.
    """
    model_type = config.get('model_type')
    if model_type == OPENVLA_MODEL_TYPE:
        _, decoder, vision = openvla_architecture(config)
        return decoder, vision
    if model_type in LLAVA_MODEL_TYPES:
        return llava_architecture(config)
    architectures = config.get('architectures')
    raise UnsupportedArchitectureError(
        f'unsupported architecture model_type={model_type!r} architectures={architectures}; '
        'supported: llava (with a llama/qwen2 text model), openvla, llama, qwen2'
    )


def read_statistics(folder: Path, config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The folder's per-dataset statistics: ``dataset_statistics.json`` when present (a
    fine-tune's), else ``norm_stats`` in ``config.json``.

    Raises:
        ActionStatisticsError: when neither holds statistics.
    """
    path = folder / ACTION_STATISTICS_FILE
    if path.is_file():
        return read_json(path)
    if isinstance(config.get('norm_stats'), Mapping):
        return config['norm_stats']
    raise ActionStatisticsError(
        f'missing action statistics: no {ACTION_STATISTICS_FILE} and no norm_stats in '
        f'{CONFIG_FILE} under {folder}'
    )


def read_dataset_choice(folder: str | Path) -> tuple[tuple[str, ...], str | None]:
    """The dataset names a folder holds statistics for, and the ``unnorm_key`` its
    ``vla_config.json`` names (or None), from JSON alone: cheap enough for a node's start-up
    (no transformers, no torch), where ``read_checkpoint_spec`` may import transformers.

    Raises:
        CheckpointError, UnsupportedArchitectureError, ActionStatisticsError: as
            ``read_checkpoint_spec`` would for these files.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f'checkpoint folder {folder} does not exist')
    config = read_json(folder / CONFIG_FILE)
    if config.get('model_type') not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedArchitectureError(
            f'unsupported architecture model_type={config.get("model_type")!r}; supported: '
            f'{list(SUPPORTED_MODEL_TYPES)}'
        )
    if not (folder / TOKENIZER_FILE).is_file():
        raise CheckpointError(f'missing {TOKENIZER_FILE} in {folder}: prompts need it')
    vla = read_json(folder / VLA_CONFIG_FILE) if (folder / VLA_CONFIG_FILE).is_file() else {}
    statistics = load_action_statistics(dict(read_statistics(folder, config)))
    key = vla.get('unnorm_key')
    return tuple(sorted(statistics)), None if key is None else str(key)


def read_checkpoint_spec(folder: str | Path) -> CheckpointSpec:
    """Read a LLaVA-layout or OpenVLA folder's spec (JSON files only).

    A family that builds on these formats (OpenVLA-OFT's folders hold an OpenVLA
    ``config.json``) reads its own files on top; which family a folder is of is decided by
    ``vla_sched.model.families.registry``, not here.

    Raises:
        CheckpointError: for a missing or malformed file.
        UnsupportedArchitectureError: for a model type this package cannot run.
        ActionStatisticsError: when the action statistics are missing or malformed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f'checkpoint folder {folder} does not exist')
    config = read_json(folder / CONFIG_FILE)
    vla = read_json(folder / VLA_CONFIG_FILE) if (folder / VLA_CONFIG_FILE).is_file() else {}
    openvla = config.get('model_type') == OPENVLA_MODEL_TYPE
    if openvla and not (folder / TOKENIZER_FILE).is_file():
        raise CheckpointError(
            f'missing {TOKENIZER_FILE} in {folder}: an OpenVLA folder needs the tokenizer '
            f'files it was published with ({TOKENIZER_FILE}, tokenizer_config.json)'
        )
    vocab_end = None
    if not openvla and 'vocab_end' not in vla.get('action_tokens', {}):
        vocab_end = base_vocab_size(folder / TOKENIZER_FILE)
    statistics = read_statistics(folder, config)
    preprocessor = None
    if (folder / PREPROCESSOR_FILE).is_file():
        preprocessor = read_json(folder / PREPROCESSOR_FILE)
    return spec_from_dicts(
        config, vla, statistics, preprocessor=preprocessor, default_vocab_end=vocab_end
    )


def spec_from_dicts(
    config: Mapping[str, Any],
    vla: Mapping[str, Any],
    statistics: Mapping[str, Any],
    *,
    preprocessor: Mapping[str, Any] | None = None,
    default_vocab_end: int | None = None,
) -> CheckpointSpec:
    """Build a spec from already parsed ``config.json``, ``vla_config.json`` and statistics.

    Args:
        config: The LLaVA, OpenVLA (or text-only) ``config.json`` mapping.
        vla: This package's settings (may be empty).
        statistics: OpenVLA-layout statistics per dataset.
        preprocessor: ``preprocessor_config.json`` (image mean/std), if any; not used for
            OpenVLA folders (their towers fix the image statistics).
        default_vocab_end: Action token end when ``vla`` does not set one; not used for
            OpenVLA folders (their ``config.json`` fixes it).
    """
    if config.get('model_type') == OPENVLA_MODEL_TYPE:
        return openvla_spec_from_dicts(config, statistics, vla=vla)
    if config.get('model_type') not in LLAVA_MODEL_TYPES:
        parse_architecture(config)  # raises, naming the unsupported model type
    return llava_spec_from_dicts(
        config,
        vla,
        statistics,
        preprocessor=preprocessor,
        default_vocab_end=default_vocab_end,
    )
