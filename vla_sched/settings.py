"""Settings defined once, as fields of the frozen config dataclass that holds them.

A setting is a dataclass field made by ``setting()``: its default, what it means, the values
it allows (a tuple of choices, or a closed range), whether it may change while the node runs,
and the parameter group it is set from (``'engine'``, ``'scheduler'``, ``'diagnostics'`` ...;
empty for a setting that its owner fills in). Everything else is derived from that field:

- ``settings_of(cls)`` lists a class's settings in field order;
- ``check_settings(config, error=...)``, called from ``__post_init__``, checks every setting
  of a built config (rules between settings stay in the class);
- ``vla_sched.ros.parameters`` declares one ROS parameter per setting.

A setting's type is its default's: a tuple default means a tuple of strings, and a float
setting also accepts an int. ``check_value`` is the one place where types, choices and ranges
are checked, whether a value comes from a ROS parameter, a JSON mapping or a constructor.
This module imports nothing from the project, so every layer may use it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

_METADATA_KEY = 'vla_sched.setting'


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting as its field defines it (see the module docstring).

    ``min_value`` and ``max_value`` are both set (a closed range) or both None. ``runtime``
    True means the setting may change while the node runs. ``group`` is the parameter section
    (the parameter is ``<group>.<name>``); '' for a setting that is not a parameter of its own.
    """

    name: str
    default: Any
    description: str
    choices: tuple[str, ...] = ()
    min_value: float | None = None
    max_value: float | None = None
    runtime: bool = False
    group: str = ''

    @property
    def is_string_list(self) -> bool:
        return isinstance(self.default, tuple)

    @property
    def label(self) -> str:
        """``<group>.<name>``, or the bare name for a setting without a group."""
        return f'{self.group}.{self.name}' if self.group else self.name

    def range_text(self) -> str:
        """The allowed range in words ('' when there is none)."""
        if self.min_value is None:
            return ''
        if isinstance(self.default, int) and self.min_value == 1:
            return f'a positive integer <= {self.max_value}'
        return f'in [{self.min_value}, {self.max_value}]'


def setting(
    default: Any,
    description: str,
    *,
    choices: tuple[str, ...] = (),
    min_value: float | None = None,
    max_value: float | None = None,
    runtime: bool = False,
    group: str = '',
) -> Any:
    """A dataclass field with ``default`` that carries its ``Setting`` as metadata.

    Raises:
        ValueError: only one end of the range is given, or the default breaks the rules
            it declares (a mistake in the class definition).
    """
    if (min_value is None) != (max_value is None):
        raise ValueError(f'setting {description!r}: give both min_value and max_value')
    defined = Setting(
        name='',
        default=default,
        description=description,
        choices=tuple(choices),
        min_value=min_value,
        max_value=max_value,
        runtime=runtime,
        group=group,
    )
    check_value(defined, default, label=f'the default of {description!r}', error=ValueError)
    return dataclasses.field(default=default, metadata={_METADATA_KEY: defined})


def setting_like(owner: type, name: str, *, group: str, description: str = '') -> Any:
    """A field defined as ``owner``'s setting ``name``: same default, choices and range.

    For a setting one config forwards to another (the node sends its instruction limit to
    the engine): its definition stays written once. ``group`` and ``description`` (default:
    the owner's) say where and how the new field appears as a parameter.
    """
    base = setting_of(owner, name)
    defined = dataclasses.replace(
        base, name='', group=group, description=description or base.description
    )
    return dataclasses.field(default=base.default, metadata={_METADATA_KEY: defined})


def settings_of(cls: type) -> tuple[Setting, ...]:
    """The settings of the dataclass ``cls``, in field order (fields not made by
    ``setting`` or ``setting_like`` are left out)."""
    return tuple(
        dataclasses.replace(f.metadata[_METADATA_KEY], name=f.name)
        for f in dataclasses.fields(cls)
        if _METADATA_KEY in f.metadata
    )


def setting_of(cls: type, name: str) -> Setting:
    """The setting ``name`` of ``cls``; KeyError if ``cls`` has no such setting."""
    for defined in settings_of(cls):
        if defined.name == name:
            return defined
    raise KeyError(f'{cls.__name__} has no setting {name!r}')


def check_value(defined: Setting, value: Any, *, label: str, error: type[Exception]) -> None:
    """Raise ``error`` naming ``label`` unless ``value`` has the setting's type and lies in
    its choices and range."""
    if defined.is_string_list:
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            raise error(f'{label} must be a list of strings, got {value!r}')
        return
    kind = type(defined.default)
    if isinstance(value, bool) != (kind is bool) or not isinstance(
        value, int | float if kind is float else kind
    ):
        raise error(f'{label} must be {kind.__name__}, got {value!r}')
    if defined.choices and value not in defined.choices:
        raise error(f'{label} must be one of {list(defined.choices)}, got {value!r}')
    if defined.min_value is not None and not defined.min_value <= value <= defined.max_value:
        raise error(f'{label} must be {defined.range_text()}, got {value!r}')


def check_settings(config: Any, *, error: type[Exception], prefix: str = '') -> None:
    """Check every setting of the dataclass instance ``config`` with ``check_value``.

    Messages name ``<prefix>.<name>`` when ``prefix`` is given, else the setting's label.
    """
    for defined in settings_of(type(config)):
        label = f'{prefix}.{defined.name}' if prefix else defined.label
        check_value(defined, getattr(config, defined.name), label=label, error=error)
