"""A robot's joint limits, from its URDF and from ``joint_limits`` entries.

``urdf_joint_limits`` reads a URDF string (``robot_description``) with the standard library's
XML parser: a ``revolute`` or ``prismatic`` joint's ``<limit lower upper velocity>``, a
``continuous`` joint's velocity (no position limits); other joints do not move and are left
out. URDF has no acceleration limit: that comes from the entries.

``limit_entries`` reads the executor's ``joint_limits`` parameter, one string per joint, a
name then ``key=value`` fields, any of ``lower``, ``upper``, ``velocity``, ``acceleration``::

    'shoulder_pan lower=-2.9 upper=2.9 velocity=2.0 acceleration=5.0'

and ``combined_limits`` lays them over the URDF's, field by field; a field given nowhere is
unlimited (infinite). Nothing here does I/O; bad text raises ``ValueError`` naming it.
"""

from __future__ import annotations

import dataclasses
import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass

LIMIT_FIELDS = ('lower', 'upper', 'velocity', 'acceleration')
_MOVING_TYPES = ('revolute', 'prismatic', 'continuous')


@dataclass(frozen=True, slots=True)
class JointLimits:
    """One joint's limits: position range, and the most speed and acceleration (per s, per
    s^2), each infinite when unlimited."""

    lower: float = -math.inf
    upper: float = math.inf
    velocity: float = math.inf
    acceleration: float = math.inf

    def __post_init__(self) -> None:
        if any(math.isnan(getattr(self, name)) for name in LIMIT_FIELDS):
            raise ValueError(f'limits {self} hold NaN')
        if self.lower > self.upper:
            raise ValueError(f'lower limit {self.lower} is above upper limit {self.upper}')
        if self.velocity <= 0 or self.acceleration <= 0:
            raise ValueError(
                f'velocity and acceleration limits must be > 0, got {self.velocity} and '
                f'{self.acceleration}'
            )


def urdf_joint_limits(urdf: str) -> dict[str, JointLimits]:
    """The limits of each moving joint of the URDF text ``urdf`` (see the module docstring).

    Raises:
        ValueError: not XML, not a robot, or a limit that is not a number.
    """
    try:
        root = ET.fromstring(urdf)
    except ET.ParseError as exc:
        raise ValueError(f'robot_description is not XML: {exc}') from None
    if root.tag != 'robot':
        raise ValueError(f'robot_description is not a URDF: its root is <{root.tag}>')
    limits = {}
    for joint in root.iter('joint'):
        name, kind = joint.get('name', ''), joint.get('type', '')
        if kind not in _MOVING_TYPES or not name:
            continue
        element = joint.find('limit')
        attributes = {} if element is None else element.attrib
        fields = {}
        if 'velocity' in attributes:
            fields['velocity'] = _number(attributes['velocity'], f'joint {name} velocity')
        if kind != 'continuous':  # URDF: lower and upper default to 0
            for end in ('lower', 'upper'):
                fields[end] = _number(attributes.get(end, '0'), f'joint {name} {end}')
        try:
            limits[name] = JointLimits(**fields)
        except ValueError as exc:
            raise ValueError(f'robot_description joint {name}: {exc}') from None
    return limits


def limit_entries(entries: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """The fields each ``joint_limits`` entry gives, by joint name.

    Raises:
        ValueError: an entry without a name, with an unknown or repeated field, a value that
            is not a number, or a joint given twice.
    """
    parsed: dict[str, dict[str, float]] = {}
    for entry in entries:
        name, *fields = entry.split()
        if not name or '=' in name:
            raise ValueError(f'joint_limits entry {entry!r} does not start with a joint name')
        if name in parsed:
            raise ValueError(f'joint_limits gives joint {name} twice')
        values = {}
        for item in fields:
            key, sep, text = item.partition('=')
            if not sep or key not in LIMIT_FIELDS or key in values:
                raise ValueError(
                    f'joint_limits entry {entry!r}: {item!r} is not one of '
                    f'{", ".join(f"{k}=<number>" for k in LIMIT_FIELDS)} (each once)'
                )
            values[key] = _number(text, f'joint_limits {name} {key}')
        parsed[name] = values
    return parsed


def combined_limits(
    urdf: dict[str, JointLimits], entries: dict[str, dict[str, float]]
) -> dict[str, JointLimits]:
    """The URDF's limits with each entry's fields laid over them.

    Raises:
        ValueError: a joint's combined limits do not make sense (lower above upper ...).
    """
    limits = dict(urdf)
    for name, fields in entries.items():
        try:
            limits[name] = dataclasses.replace(limits.get(name, JointLimits()), **fields)
        except ValueError as exc:
            raise ValueError(f'joint {name}: {exc}') from None
    return limits


def _number(text: str, label: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f'{label}: {text!r} is not a number') from None
    if math.isnan(value):
        raise ValueError(f'{label} is NaN')
    return value
