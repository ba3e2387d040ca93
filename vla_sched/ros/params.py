"""The node's ROS parameters: names, defaults, descriptors, and reading them into a config.

Robots are listed in ``robot_ids``; each robot's settings are ``robots.<id>.<name>``, and
each one that is not set falls back to ``robot_defaults.<name>``. ``config/vla_sched.yaml``
documents every parameter declared here (a test checks that the two agree).

Only a robot's ``instruction`` and ``period_s`` may change while the node runs; every other
parameter is read-only after start-up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vla_sched.ros.config import (
    ACTION_SPACES,
    ENGINE_MODES,
    IMAGE_TRANSPORTS,
    LATE_POLICIES,
    TRIGGERS,
    ConfigError,
    DiagnosticsConfig,
    EngineLinkConfig,
    FrontendConfig,
    RobotConfig,
)

if TYPE_CHECKING:
    from rclpy.node import Node

STRING_LIST = 'string_list'  # declared with dynamic typing: [] and None both mean empty
RUNTIME_ROBOT_PARAMS = ('instruction', 'period_s')


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One parameter: its name, default, meaning, and allowed values."""

    name: str
    default: Any
    description: str
    choices: tuple[str, ...] = ()
    min_value: float | None = None
    max_value: float | None = None
    kind: str = ''  # '' infers from the default; STRING_LIST for string arrays
    read_only: bool = True


def _robot_specs(prefix: str, *, with_namespace: bool) -> list[ParamSpec]:
    specs = [
        ParamSpec(f'{prefix}.priority', 0, 'higher runs first when enable_priority is on'),
        ParamSpec(
            f'{prefix}.period_s', 0.1, 'control period (s); the target rate is 1/period_s',
            min_value=0.001, max_value=60.0, read_only=False,
        ),
        ParamSpec(
            f'{prefix}.trigger', 'periodic',
            'periodic: a step per period with the newest image; on_image: a step per new image',
            choices=TRIGGERS,
        ),
        ParamSpec(
            f'{prefix}.instruction', '',
            'language instruction until one arrives on vla/instruction', read_only=False,
        ),
        ParamSpec(
            f'{prefix}.state_joint_names', [],
            "joint_states names in the checkpoint's state order", kind=STRING_LIST,
        ),
        ParamSpec(
            f'{prefix}.action_joint_names', [],
            "names of the action columns (empty: the checkpoint's defaults)", kind=STRING_LIST,
        ),
        ParamSpec(f'{prefix}.action_space', 'ee_delta', 'meaning of the actions',
                  choices=ACTION_SPACES),
        ParamSpec(f'{prefix}.dt', 0.1, 'seconds between the actions of one chunk',
                  min_value=1e-4, max_value=10.0),
        ParamSpec(f'{prefix}.frame_id', 'base_link', 'frame_id of the published chunks'),
        ParamSpec(
            f'{prefix}.publish_joint_trajectory', False,
            'also publish vla/joint_trajectory (needs action_space joint_position)',
        ),
        ParamSpec(f'{prefix}.image_transport', 'raw',
                  'raw: camera/image_raw; compressed: camera/image_raw/compressed',
                  choices=IMAGE_TRANSPORTS),
    ]  # fmt: skip
    if with_namespace:
        specs.insert(0, ParamSpec(f'{prefix}.namespace', '', 'topic namespace (empty: the id)'))
    return specs


def node_specs() -> list[ParamSpec]:
    """Every parameter that does not depend on the robot list."""
    return [
        ParamSpec('robot_ids', ['robot_0'], 'the robots this node serves', kind=STRING_LIST),
        *_robot_specs('robot_defaults', with_namespace=False),
        ParamSpec('engine.mode', 'process', 'process: own process over ZMQ; inprocess: thread',
                  choices=ENGINE_MODES),
        ParamSpec('engine.model_path', '', 'checkpoint folder (empty: the built-in tiny one)'),
        ParamSpec('engine.device', 'auto', 'auto, cpu or cuda', choices=('auto', 'cpu', 'cuda')),
        ParamSpec('engine.dtype', 'auto', 'weights and KV dtype',
                  choices=('auto', 'float32', 'bfloat16', 'float16')),
        ParamSpec('engine.core', 'scheduled', 'scheduled (batching) or sequential (baseline)',
                  choices=('scheduled', 'sequential')),
        ParamSpec('engine.cpu_threads', 1, 'torch threads when the model runs on the CPU',
                  min_value=1, max_value=256),
        ParamSpec('engine.cuda_graphs', False, 'replay decode steps as CUDA graphs (GPU only)'),
        ParamSpec('engine.heartbeat_period_s', 0.2, 'heartbeat period both ways (s)',
                  min_value=0.01, max_value=10.0),
        ParamSpec('engine.heartbeat_timeout_s', 1.0, 'engine presumed dead after (s)',
                  min_value=0.05, max_value=60.0),
        ParamSpec('engine.restart_delay_s', 1.0, 'wait before restarting a dead engine (s)',
                  min_value=0.0, max_value=600.0),
        ParamSpec('engine.start_timeout_s', 120.0, 'an engine not ready after this is dead (s)',
                  min_value=1.0, max_value=3600.0),
        ParamSpec('engine.poll_period_s', 0.005, 'how often results are collected (s)',
                  min_value=0.001, max_value=0.1),
        ParamSpec('scheduler.policy', 'fcfs', 'waiting-queue order',
                  choices=('fcfs', 'lpm', 'dfs-weight', 'lof')),
        ParamSpec('scheduler.enable_priority', False, 'order by robot priority first'),
        ParamSpec('scheduler.chunked_prefill_size', 256, 'max prefill tokens per step',
                  min_value=1, max_value=1 << 20),
        ParamSpec('scheduler.page_size', 16, 'tokens per KV page', min_value=1, max_value=1024),
        ParamSpec('scheduler.kv_pool_tokens', 16384, 'KV pool size in tokens',
                  min_value=1, max_value=1 << 30),
        ParamSpec('scheduler.max_running_requests', 64, 'max steps decoding at once',
                  min_value=1, max_value=4096),
        ParamSpec('scheduler.enable_prefill_delayer', True, 'delay prefills to protect decodes'),
        ParamSpec('scheduler.enable_overlap', True, 'process results one step behind the GPU'),
        ParamSpec('scheduler.prefill_decode_interval', 1,
                  'decode-only steps after each prefill (0: prefill first)',
                  min_value=0, max_value=1000),
        ParamSpec('deadlines.step_budget_s', 0.5, 'deadline = image stamp + this (s)',
                  min_value=0.001, max_value=60.0),
        ParamSpec('deadlines.late_policy', 'drop', 'drop late steps or deliver them marked late',
                  choices=LATE_POLICIES),
        ParamSpec('limits.max_instruction_bytes', 1024, 'longest accepted instruction (UTF-8)',
                  min_value=1, max_value=1 << 20),
        ParamSpec('limits.max_image_pixels', 4096 * 4096, 'largest accepted image',
                  min_value=1, max_value=1 << 28),
        ParamSpec('diagnostics.period_s', 1.0, '/diagnostics period (s)',
                  min_value=0.05, max_value=60.0),
        ParamSpec('diagnostics.window_s', 5.0, 'window for rates and recent events (s)',
                  min_value=0.1, max_value=3600.0),
        ParamSpec('diagnostics.queue_warn_threshold', 16, 'WARN above this many waiting steps',
                  min_value=0, max_value=1 << 20),
        ParamSpec('diagnostics.rate_warn_fraction', 0.8, 'WARN below this share of the target',
                  min_value=0.01, max_value=1.0),
        ParamSpec('diagnostics.silent_robot_s', 3.0, 'ERROR when no image came for this (s)',
                  min_value=0.1, max_value=3600.0),
    ]  # fmt: skip


def robot_specs(robot_id: str, defaults: dict[str, Any]) -> list[ParamSpec]:
    """``robots.<robot_id>.*``, with defaults taken from ``robot_defaults.*``."""
    out = []
    for spec in _robot_specs(f'robots.{robot_id}', with_namespace=True):
        key = spec.name.rsplit('.', 1)[1]
        default = defaults.get(key, spec.default)
        out.append(dataclasses.replace(spec, default=default))
    return out


def descriptor(spec: ParamSpec):
    """The ``rcl_interfaces/ParameterDescriptor`` of a spec (ranges, choices, read-only)."""
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

    desc = ParameterDescriptor(description=spec.description, read_only=spec.read_only)
    if spec.choices:
        desc.additional_constraints = 'one of: ' + ', '.join(spec.choices)
    if spec.kind == STRING_LIST:
        desc.dynamic_typing = True
        desc.additional_constraints = 'a list of strings'
    elif spec.min_value is not None and isinstance(spec.default, float):
        desc.floating_point_range = [
            FloatingPointRange(from_value=float(spec.min_value), to_value=float(spec.max_value))
        ]
    elif spec.min_value is not None and isinstance(spec.default, int):
        desc.integer_range = [
            IntegerRange(from_value=int(spec.min_value), to_value=int(spec.max_value), step=1)
        ]
    return desc


def check_value(spec: ParamSpec, value: Any) -> Any:
    """The value normalised (string lists become tuples), or ConfigError naming the spec."""
    if spec.kind == STRING_LIST:
        if value is None or (isinstance(value, list | tuple) and len(value) == 0):
            return ()
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f'{spec.name} must be a list of strings, got {value!r}')
        return tuple(value)
    if isinstance(spec.default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not type(spec.default):
        raise ConfigError(f'{spec.name} must be {type(spec.default).__name__}, got {value!r}')
    if spec.choices and value not in spec.choices:
        raise ConfigError(f'{spec.name} must be one of {list(spec.choices)}, got {value!r}')
    if spec.min_value is not None and not spec.min_value <= value <= spec.max_value:
        raise ConfigError(
            f'{spec.name} must be in [{spec.min_value}, {spec.max_value}], got {value!r}'
        )
    return value


def config_from_values(values: dict[str, Any]) -> FrontendConfig:
    """Build the validated config from a full ``{parameter name: value}`` mapping."""
    robots = []
    for robot_id in values['robot_ids']:
        prefix = f'robots.{robot_id}.'
        fields = {k[len(prefix) :]: v for k, v in values.items() if k.startswith(prefix)}
        robots.append(RobotConfig(robot_id=robot_id, **fields))
    engine = {
        'model_path': values['engine.model_path'],
        'device': values['engine.device'],
        'dtype': values['engine.dtype'],
        'core': values['engine.core'],
        'cpu_threads': values['engine.cpu_threads'],
        'cuda_graphs': values['engine.cuda_graphs'],
    }
    for key in (
        'policy',
        'enable_priority',
        'chunked_prefill_size',
        'page_size',
        'kv_pool_tokens',
        'max_running_requests',
        'enable_prefill_delayer',
        'enable_overlap',
        'prefill_decode_interval',
    ):
        engine[key] = values[f'scheduler.{key}']
    link = EngineLinkConfig(
        mode=values['engine.mode'],
        engine=engine,
        **{
            key: values[f'engine.{key}']
            for key in (
                'heartbeat_period_s',
                'heartbeat_timeout_s',
                'restart_delay_s',
                'start_timeout_s',
                'poll_period_s',
            )
        },
    )
    diagnostics = DiagnosticsConfig(
        **{k.split('.', 1)[1]: v for k, v in values.items() if k.startswith('diagnostics.')}
    )
    return FrontendConfig(
        robots=tuple(robots),
        link=link,
        diagnostics=diagnostics,
        step_budget_s=values['deadlines.step_budget_s'],
        late_policy=values['deadlines.late_policy'],
        max_instruction_bytes=values['limits.max_instruction_bytes'],
        max_image_pixels=values['limits.max_image_pixels'],
    )


def all_specs(robot_ids: Iterable[str], defaults: dict[str, Any]) -> list[ParamSpec]:
    """The node's specs followed by each robot's."""
    specs = node_specs()
    for robot_id in robot_ids:
        specs.extend(robot_specs(robot_id, defaults))
    return specs


def declare_and_read(node: Node) -> FrontendConfig:
    """Declare every parameter on ``node`` and return the validated config.

    Raises:
        ConfigError: a value is of the wrong type, out of range, or inconsistent.
    """
    values: dict[str, Any] = {}
    base = node_specs()
    for spec in base:
        values[spec.name] = _declare(node, spec)
    defaults = {
        s.name.split('.', 1)[1]: values[s.name]
        for s in base
        if s.name.startswith('robot_defaults.')
    }
    for robot_id in values['robot_ids']:
        RobotConfig(robot_id=robot_id)  # a bad id fails before its parameters are declared
        for spec in robot_specs(robot_id, defaults):
            values[spec.name] = _declare(node, spec)
    return config_from_values(values)


def _declare(node: Node, spec: ParamSpec) -> Any:
    default = spec.default
    if spec.kind == STRING_LIST:
        # Dynamically typed, so that an empty list in a YAML file (a byte array to rclpy)
        # and an unset value (None) are both accepted; check_value normalises them.
        default = list(spec.default) or None
    param = node.declare_parameter(spec.name, default, descriptor(spec))
    return check_value(spec, param.value)


def runtime_validator(
    config: FrontendConfig, apply: Callable[[str, str, Any], None]
) -> Callable[[list], Any]:
    """An on-set-parameters callback: checks runtime-changeable robot parameters.

    ``apply(robot_id, name, value)`` is called for each accepted change.
    """
    from rcl_interfaces.msg import SetParametersResult

    from vla_sched.ros.conversions import ConversionError, check_instruction

    specs = {s.name: s for s in all_specs([r.robot_id for r in config.robots], {})}

    def validate(params: list) -> SetParametersResult:
        accepted = []
        for param in params:
            parts = param.name.split('.')
            spec = specs.get(param.name)
            if spec is None or len(parts) != 3 or parts[0] != 'robots':
                continue  # read-only or unknown parameters are rclpy's business
            if parts[2] not in RUNTIME_ROBOT_PARAMS:
                continue
            try:
                value = check_value(spec, param.value)
                if parts[2] == 'instruction' and value:
                    value = check_instruction(value, max_bytes=config.max_instruction_bytes)
            except (ConfigError, ConversionError) as exc:
                return SetParametersResult(successful=False, reason=str(exc))
            accepted.append((parts[1], parts[2], value))
        for robot_id, name, value in accepted:
            apply(robot_id, name, value)
        return SetParametersResult(successful=True)

    return validate
