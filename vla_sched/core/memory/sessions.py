"""Per-robot sessions: a robot's prompt prefix stays locked in the radix tree.

A robot's prompt is ``[system + instruction] + [image] + [state] + [suffix]``. The first
part is the session prefix. While the session is open it holds one lock on the deepest
cached page-aligned part of that prefix, so each control step prefills only the rest.
The prefix enters the tree when a step's prefill finishes (``KVMemory`` then calls
``refresh``, which moves the lock down to the newly cached pages). Robots with the same
prefix share its pages: each session adds one lock to the same node.

A step's own KV (image, state, suffix, actions) is freed when the step finishes
(``step_kv='free'``: the request's ``max_cache_len`` stops at the prefix) or inserted like
any finished request (``step_kv='insert'``). A new instruction swaps the prefix: the old
one is unlocked and becomes evictable. Closing a session, or its idle timeout, unlocks
the prefix; steps still in flight are returned to the caller, which aborts them through
the normal release path. Times are the caller's clock in integer nanoseconds (``now_ns``),
passed in, never read here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vla_sched.core.memory.kv_config import SESSION_STEP_KV_CHOICES
from vla_sched.core.memory.kv_errors import SessionError
from vla_sched.core.memory.radix_cache import RadixCache, TreeNode
from vla_sched.core.memory.radix_key import RadixKey
from vla_sched.core.memory.req_kv import ReqKV


@dataclass(eq=False, slots=True)
class Session:
    """An open robot session.

    Attributes:
        robot_id: the robot.
        prefix: radix key of the session prefix (system prompt + instruction).
        instruction_version: the caller's version of the instruction ``prefix`` was built
            from (``open`` and ``change_prefix`` set it; only the caller compares it).
        locked_node: node the session holds one lock on (the root when none of the
            prefix is cached yet).
        locked_len: tokens of the prefix covered by ``locked_node``.
        last_active_ns: the caller's clock at the session's last open, prefix change,
            step start or step end (integer nanoseconds).
        active_rids: ids of the session's steps that have begun and not been released.
    """

    robot_id: str
    prefix: RadixKey
    instruction_version: int
    locked_node: TreeNode
    locked_len: int
    last_active_ns: int
    active_rids: set[str] = field(default_factory=set)


class SessionManager:
    """Open sessions by robot id, each holding its prefix locked in ``tree``.

    Args:
        tree: the radix cache the prefixes live in.
        step_kv: ``'free'`` or ``'insert'``, see the module docstring.
        idle_timeout_ns: ``reap_idle`` closes sessions idle this long; 0 disables it.
    """

    def __init__(
        self, tree: RadixCache, *, step_kv: str = 'free', idle_timeout_ns: int = 30 * 10**9
    ) -> None:
        if step_kv not in SESSION_STEP_KV_CHOICES:
            raise ValueError(f'step_kv must be one of {SESSION_STEP_KV_CHOICES}, got {step_kv!r}')
        if idle_timeout_ns < 0:
            raise ValueError(f'idle_timeout_ns must be >= 0, got {idle_timeout_ns}')
        self.tree = tree
        self.step_kv = step_kv
        self.idle_timeout_ns = idle_timeout_ns
        self._sessions: dict[str, Session] = {}
        # No session can be due for reaping before this time (the scheduler asks every pass).
        self._next_reap_ns: int | None = None

    def __contains__(self, robot_id: str) -> bool:
        return robot_id in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, robot_id: str) -> Session:
        """The open session of ``robot_id``.

        Raises:
            SessionError: no session is open for it.
        """
        session = self._sessions.get(robot_id)
        if session is None:
            raise SessionError(f'robot {robot_id!r} has no open session')
        return session

    def sessions(self) -> list[Session]:
        return list(self._sessions.values())

    def open(
        self, robot_id: str, prefix: RadixKey, *, now_ns: int, instruction_version: int = 0
    ) -> Session:
        """Open a session and lock whatever part of ``prefix`` is already cached.

        Raises:
            SessionError: ``robot_id`` already has an open session.
        """
        if robot_id in self._sessions:
            raise SessionError(f'robot {robot_id!r} already has an open session')
        session = Session(robot_id, prefix, instruction_version, self.tree.root, 0, now_ns)
        self._sessions[robot_id] = session
        self.refresh(robot_id)
        return session

    def refresh(self, robot_id: str) -> int:
        """Move the session's lock to the deepest cached page-aligned part of its prefix.

        Returns:
            Tokens of the prefix now locked.
        """
        session = self.get(robot_id)
        match = self.tree.match_prefix(session.prefix.page_aligned(self.tree.page_size))
        if match.last_node is not session.locked_node:
            self.tree.inc_lock_ref(match.last_node)
            self._unlock(session)
            session.locked_node = match.last_node
        session.locked_len = int(match.device_indices.numel())
        return session.locked_len

    def change_prefix(
        self,
        robot_id: str,
        prefix: RadixKey,
        *,
        now_ns: int,
        instruction_version: int | None = None,
    ) -> None:
        """Swap the session prefix (a new instruction); the old one becomes evictable.

        ``instruction_version`` defaults to the session's previous version plus one.
        """
        session = self.get(robot_id)
        session.prefix = prefix
        if instruction_version is None:
            instruction_version = session.instruction_version + 1
        session.instruction_version = instruction_version
        session.last_active_ns = now_ns
        self.refresh(robot_id)

    def begin_step(self, robot_id: str, req: ReqKV, *, now_ns: int) -> None:
        """Bind a step's request to the session, before its ``match_prefix``.

        Raises:
            SessionError: no open session, the request already holds memory, or its key
                does not start with the session prefix.
        """
        session = self.get(robot_id)
        if req.holds_memory:
            raise SessionError(
                f'request {req.rid!r} already holds memory; bind it to robot {robot_id!r} '
                f'before admission'
            )
        if not req.key.starts_with(session.prefix):
            raise SessionError(
                f'request {req.rid!r} does not extend the session prefix of robot '
                f'{robot_id!r} ({len(session.prefix)} tokens, namespace '
                f'{session.prefix.extra_key!r})'
            )
        req.session_id = robot_id
        if self.step_kv == 'free':
            req.max_cache_len = len(session.prefix)
        session.active_rids.add(req.rid)
        session.last_active_ns = now_ns
        self.refresh(robot_id)

    def end_step(self, req: ReqKV, *, now_ns: int | None = None) -> None:
        """Forget a released step (no-op if its session was closed meanwhile)."""
        session = self._sessions.get(req.session_id) if req.session_id is not None else None
        if session is None or req.rid not in session.active_rids:
            return
        session.active_rids.discard(req.rid)
        if now_ns is not None:
            session.last_active_ns = max(session.last_active_ns, now_ns)

    def close(self, robot_id: str) -> tuple[str, ...]:
        """Close the session and unlock its prefix.

        Returns:
            Ids of the session's steps still in flight, for the caller to abort.
        """
        session = self.get(robot_id)
        self._unlock(session)
        del self._sessions[robot_id]
        return tuple(sorted(session.active_rids))

    def reap_idle(self, *, now_ns: int) -> list[str]:
        """Close sessions with no step in flight, idle for ``idle_timeout_ns`` or more.

        The scheduler asks on every pass, so the sessions are scanned only once the earliest
        moment one of them can be due has come: a session's ``last_active_ns`` only grows,
        and one that goes idle later is due no earlier than a timeout from now.

        Returns:
            The robot ids whose sessions were closed (none had a step to abort).
        """
        if self.idle_timeout_ns <= 0:
            return []
        if self._next_reap_ns is not None and now_ns < self._next_reap_ns:
            return []
        idle, next_due = [], now_ns + self.idle_timeout_ns
        for s in self._sessions.values():
            if s.active_rids:
                continue
            due = s.last_active_ns + self.idle_timeout_ns
            if now_ns >= due:
                idle.append(s.robot_id)
            else:
                next_due = min(next_due, due)
        for robot_id in idle:
            self.close(robot_id)
        self._next_reap_ns = next_due
        return idle

    def _unlock(self, session: Session) -> None:
        if session.locked_node is not self.tree.root:
            self.tree.dec_lock_ref(session.locked_node)
