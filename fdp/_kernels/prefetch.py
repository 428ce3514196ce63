"""Compile a cold query's Numba kernels on more than one core.

A fresh install has an empty Numba cache, so its first query compiles every kernel
it needs, one after another (Numba's compiler holds a global lock: threads cannot
share the work). When the cache is cold and the machine has a spare core, the query
hands the kernel *groups* it will need later to helper processes, which compile them
into the same on-disk cache while this process compiles the group it needs first.
Reaching a kernel of a handed-over group, this process waits until its helper
reports the group done, and Numba then loads the kernel from the cache instead of
compiling it.

A helper only fills the cache with the code this process would have compiled
itself, so no result can depend on it. It is started only when a group's kernels
have no cache entry, never by a helper, and never when ``FDP_PREFETCH=0``; a helper
that fails or takes longer than :data:`WAIT_SECONDS` is given up on (this process then
compiles the kernel itself).

Where helpers lose: several cold processes started together (``pytest -n`` on a fresh
clone) each start their own, so more compilers than cores run at once (two cold Gaussian
queries started together on 2 cores: 5.1 s each, 4.0 s with ``FDP_PREFETCH=0``;
``python benchmarks/first_call.py --concurrent 2``). A helper is killed when its process exits normally; one whose
process is killed (a terminated ``multiprocessing`` worker) finishes its group first,
about a second.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numba

# the kernels register with gate, not with this module (which imports them to compile a group)
from fdp._kernels import gate
from fdp._kernels.gate import GROUPS, PENDING, gated
from fdp._kernels.gate import KERNELS as _KERNELS

__all__ = ["GROUPS", "gated", "start", "wait_for", "cold_groups", "compile_group"]

#: The longest this process waits for a helper's group before compiling it itself.
WAIT_SECONDS = 30.0

_lock = threading.Lock()
_seen: set[str] = set()  # groups looked at in this process: cached, kept or handed over
_done = PENDING  # groups handed to a helper -> set when it reports them (gated kernels wait)
_helpers: list[subprocess.Popen] = []


def _forget() -> None:
    """In a forked child: the parent's helpers report to the parent, not here (and a lock
    a parent's thread held at the fork would never be released)."""
    global _lock
    _lock = threading.Lock()
    _seen.clear()
    _done.clear()
    _helpers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)


def _cached(dispatcher: Any) -> bool:
    """Whether Numba's cache holds a fresh entry for ``dispatcher`` (Numba's own index
    file; if its layout is not the expected one, say cached: then nothing is started)."""
    try:
        return bool(dispatcher._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - any change in Numba's internals: do not prefetch
        return True


def cold_groups(groups: Sequence[str]) -> list[str]:
    """The groups among ``groups`` with a kernel that Numba's cache does not hold."""
    return [g for g in groups if not all(_cached(d) for d in _KERNELS[g])]


def _spare_cores() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores - 1


def _enabled() -> bool:
    return os.environ.get("FDP_PREFETCH", "1") != "0" and not getattr(sys, "frozen", False)


def start(groups: Sequence[str]) -> None:
    """Hand the cold ones of ``groups`` (in the order the query needs them) to helpers.

    The first cold group is left to this process, which needs it first; the rest are
    dealt in turn to at most (cores - 1) helpers, each compiling its groups in order.
    Each group is looked at once per process (cached, kept or handed over).
    """
    if not _enabled():
        return
    with _lock:
        todo = [g for g in dict.fromkeys(groups) if g not in _seen]
        _seen.update(todo)
        todo = cold_groups(todo)
        todo = todo[1:]  # the first cold one: this process needs it first
        helpers = min(_spare_cores(), len(todo))
        for h in range(helpers):
            share = todo[h::helpers]
            proc = _spawn(share)
            if proc is None:
                return
            events = {g: threading.Event() for g in share}
            _done.update(events)
            _helpers.append(proc)
            threading.Thread(target=_listen, args=(proc, events), daemon=True).start()


def _spawn(groups: list[str]) -> subprocess.Popen | None:
    """A helper for ``groups`` that imports this very fdp (it checks, and does nothing if
    another one comes first on its path)."""
    here = str(Path(__file__).resolve())
    root = str(Path(here).parents[2])  # the directory this fdp is imported from
    # `-c` puts the working directory first on the path: drop it (nothing of it may be
    # imported, whatever flags this process ran with) and put fdp's directory last
    code = (f"import sys; sys.path[:] = [p for p in sys.path if p != ''] + [{root!r}]; "
            "from fdp._kernels.prefetch import _helper_main; _helper_main(sys.argv[1], sys.argv[2:])")
    env = {**os.environ, "FDP_PREFETCH": "0"}
    if numba.config.CACHE_DIR:  # the cache this process reads, even if set in code
        env["NUMBA_CACHE_DIR"] = numba.config.CACHE_DIR
    try:
        return subprocess.Popen([sys.executable, "-c", code, here, *groups], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    except OSError:  # no way to start a process here: compile in this one
        return None


def _listen(proc: subprocess.Popen, events: dict[str, threading.Event]) -> None:
    """Set each group's event when the helper reports it; all of them when it ends."""
    assert proc.stdout is not None
    with proc.stdout:
        for line in proc.stdout:
            word = line.split()
            if len(word) == 2 and word[0] == "compiled" and word[1] in events:
                events[word[1]].set()
    proc.wait()
    for event in events.values():
        event.set()


def wait_for(group: str) -> None:
    """Wait (at most :data:`WAIT_SECONDS`, once) until a helper compiling ``group`` is done with it.

    A helper that has not reported by then is given up on for the group: later calls
    do not wait again (this process compiles what it still needs itself)."""
    event = _done.get(group)
    if event is not None and not event.wait(WAIT_SECONDS):
        event.set()


gate.set_waiter(wait_for)  # what a gated kernel calls while a helper holds groups (_done)


@atexit.register
def _stop_helpers() -> None:
    for proc in _helpers:  # a helper killed mid-write leaves no partial entry: Numba renames into place
        if proc.poll() is None:
            proc.kill()


def compile_group(group: str) -> None:
    """Compile (and cache) the kernels of ``group`` with the argument types queries use."""
    import numpy as np

    if group == "jl":
        from fdp._kernels.chi2 import mixture_cells

        one = np.ones(1)
        for remove in (True, False):
            mixture_cells(-8, 0.5, 32, one, one, one, 0.1, 1.0, 0.5, remove, True, 10.0)
    elif group == "pmf":
        from fdp._kernels.low_dft import low_frequency_dft
        from fdp.pld.pmf import DiscretePLD

        pld = DiscretePLD(h=0.5, offset=-4, pmf=np.full(9, 0.1), p_inf=0.0)
        pld.mean()
        pld.log_mgf(np.array([1.0]))
        pld.delta(np.array([0.5]))
        pld.epsilon(0.05)
        low_frequency_dft(np.ones(8), 16, 3)
    elif group == "merge":
        from fdp.pld.discretise import _merge_sweep

        _merge_sweep(0.5, np.full(4, 0.25), np.full(4, 0.01), 0.0, 0.0, 0.0, 0.0)
    else:
        raise ValueError(f"group must be one of {GROUPS}; got {group!r}")


def _helper_main(expected: str, groups: list[str]) -> None:
    """A helper process: compile each group in turn and report it on stdout (nothing
    when this is not the fdp that started it: its kernels would be cached elsewhere)."""
    if str(Path(__file__).resolve()) != expected:
        return
    for group in groups:
        compile_group(group)
        print("compiled", group, flush=True)
