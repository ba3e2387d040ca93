"""Publishers that can never reach one of the node's subscriptions, found in the ROS graph.

A camera publishing ``CompressedImage`` on ``camera/image_raw``, or an instruction published
``VOLATILE`` to the node's transient-local subscription, never delivers a message: the
middleware does not match them. rclpy can report such publishers through QoS event handlers,
but each handler is a waitable that the executor walks on every wake-up, two per
subscription: with 16 robots they cost the node more than its whole work per image. So the
node's subscriptions have none, and ``PublisherCheck`` asks the graph instead, once per
``/diagnostics`` period: a topic whose publisher count has not changed since its last look is
not looked at again, and each offending publisher is reported once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rclpy.qos import QoSCompatibility, QoSProfile, qos_check_compatible

UNKNOWN_PREFIX = '_NODE_'  # the graph's placeholder names, e.g. '_NODE_NAME_UNKNOWN_'


@dataclass(frozen=True, slots=True)
class WatchedTopic:
    """One subscription of the node: its full topic name, message type and QoS."""

    topic: str
    type_name: str  # as the graph names it, e.g. 'sensor_msgs/msg/Image'
    qos: QoSProfile


def type_name(msg_type: type) -> str:
    """The graph's name of a generated message class: ``'<package>/msg/<Name>'``."""
    return f'{msg_type.__module__.split(".")[0]}/msg/{msg_type.__name__}'


def publisher_problem(watched: WatchedTopic, info: Any) -> str | None:
    """Why the publisher ``info`` (a ``TopicEndpointInfo``) cannot reach ``watched``, or None."""
    who = f'{info.node_namespace.rstrip("/")}/{info.node_name}'
    if info.node_name.startswith(UNKNOWN_PREFIX):  # the graph knows its endpoint only
        who = '(of a node not yet discovered)'
    if info.topic_type != watched.type_name:
        return (
            f'{watched.topic}: publisher {who} offers type {info.topic_type}, the node '
            f'subscribes {watched.type_name}; its messages never arrive'
        )
    compatibility, reason = qos_check_compatible(info.qos_profile, watched.qos)
    if compatibility == QoSCompatibility.ERROR:
        return (
            f'{watched.topic}: publisher {who} has a QoS the node cannot receive '
            f'({reason.strip()}); its messages never arrive'
        )
    return None


class PublisherCheck:
    """Finds the publishers of the watched topics that cannot reach the node (see the module
    docstring). The graph is read through the two callables (``Node.count_publishers`` and
    ``Node.get_publishers_info_by_topic``)."""

    def __init__(
        self,
        topics: Sequence[WatchedTopic],
        *,
        count_publishers: Callable[[str], int],
        publishers_info: Callable[[str], list[Any]],
    ) -> None:
        self.topics = tuple(topics)
        self._count = count_publishers
        self._info = publishers_info
        self._counts: dict[str, int] = {}
        self._reported: set[tuple[str, tuple[int, ...]]] = set()

    def new_problems(self) -> list[str]:
        """One line per offending publisher not reported before."""
        problems = []
        for watched in self.topics:
            count = self._count(watched.topic)
            if self._counts.get(watched.topic, 0) == count:
                continue
            self._counts[watched.topic] = count
            for info in self._info(watched.topic):
                key = (watched.topic, tuple(info.endpoint_gid))
                problem = publisher_problem(watched, info)
                if problem is not None and key not in self._reported:
                    self._reported.add(key)
                    problems.append(problem)
        return problems
