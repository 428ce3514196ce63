"""The registry of gated Numba kernels: the ``gated`` decorator and its groups.

Kernel modules import this (never :mod:`fdp._kernels.prefetch`, which imports them to
compile a group), so the dependency runs one way: prefetch -> kernels -> gate.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["GROUPS", "KERNELS", "PENDING", "gated", "set_waiter"]

#: The kernel groups: a mechanism's own (``jl``: the JL mechanism's cells), then, in the
#: order a query needs them, ``pmf`` (plan, composition and queries) and ``merge`` (the
#: optimistic discretisation, only for queries that compose optimistic PLDs).
GROUPS = ("jl", "pmf", "merge")

#: Each group's Numba dispatchers, in the order their modules registered them.
KERNELS: dict[str, list[Any]] = {group: [] for group in GROUPS}

#: Groups handed to a helper -> set when it reports them (filled by prefetch only).
PENDING: dict[str, threading.Event] = {}

_waiter: Callable[[str], None] = lambda group: None  # prefetch.wait_for once imported


def set_waiter(wait_for: Callable[[str], None]) -> None:
    """What a gated kernel calls while :data:`PENDING` is not empty (prefetch's wait)."""
    global _waiter
    _waiter = wait_for


def gated(group: str) -> Callable[[Any], Any]:
    """Decorator for a Numba kernel called from Python: record it as part of ``group``
    and, while a helper compiles that group, make its first call wait for the helper."""
    if group not in KERNELS:
        raise ValueError(f"group must be one of {GROUPS}; got {group!r}")

    def wrap(dispatcher: Any) -> Any:
        KERNELS[group].append(dispatcher)
        return _Gate(dispatcher, group)

    return wrap


class _Gate:
    """A kernel behind its group's gate; attributes are the dispatcher's."""

    __slots__ = ("dispatcher", "group")

    def __init__(self, dispatcher: Any, group: str) -> None:
        self.dispatcher = dispatcher
        self.group = group

    def __call__(self, *args: Any) -> Any:
        if PENDING:  # only while helpers were started in this process
            _waiter(self.group)
        return self.dispatcher(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.dispatcher, name)
