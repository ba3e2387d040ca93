"""Exceptions raised by the KV memory layer (pools, radix cache, sessions).

Every message names the offending request, page, slot, node or robot, so a bad call is
found from the log line alone. Nothing in this layer corrupts its state silently: a call
that raises leaves the pools and the tree as they were before it.
"""

from __future__ import annotations


class KVMemoryError(RuntimeError):
    """Base class of every error raised by the KV memory layer."""


class OutOfPagesError(KVMemoryError):
    """The token pool has too few free (and evictable) pages for an allocation."""


class OutOfReqSlotsError(KVMemoryError):
    """Every row of the request-to-token pool is owned by a live request."""


class DoubleFreeError(KVMemoryError):
    """A page or request slot was freed that is already free."""


class LockRefError(KVMemoryError):
    """A radix node's lock count would drop below zero, or a dead node was locked."""


class KeyAlignmentError(KVMemoryError, ValueError):
    """A radix key's length is not a multiple of the page size."""


class SessionError(KVMemoryError):
    """A session call that does not fit the session's state (unknown robot, bad prefix)."""


class IntegrityError(KVMemoryError):
    """``check_integrity`` found the pools, the tree and the live requests out of step."""
