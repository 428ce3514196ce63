"""Refusing a private step from inside the graph, before anything is released.

A check that can only be decided on the data (one loss per input row, the row
independence probe, a non-trainable weight that changed, a finite gradient) runs inside
the traced step. Three things make such a refusal hold on every path:

* **the release is gated by value**, not only by control. The released tensors of a
  refused step are zeros (:func:`gated` selects them with ``tf.where`` on the checks'
  outcome), so nothing computed from the batch leaves, whatever runs the graph. A
  ``tf.debugging.Assert`` alone does not do this: XLA (``jit_compile=True``) drops
  assertions, and a failed one does not stop stateful ops that do not depend on it.
* **the refusal is recorded.** Inside :func:`recording` every check adds its failures to
  a :class:`RefusalRecord` (a counter per message, a variable of the optimizer), and
  :meth:`RefusalRecord.raise_new` raises the first new one on the host as a
  ``ValueError`` — after every compiled step of ``fit`` and ``train_on_batch``, and
  whenever the optimizer's booked steps are read (``model.ledger``, ``model.epsilon``).
* **a refusal leaves nothing written.** A failed check inside a pass stops the graph
  before the step's own guard (:class:`fdp_tf.guards.StateGuard`) could put back what the
  passes wrote to non-trainable weights, so inside :func:`guarding` the check restores
  them first, and fences every later write of the step behind its assertion.
* **it says what to do, at once where it can.** A check decided at trace time (a static
  shape) raises ``ValueError`` while tracing; eagerly every check raises at once; in a
  graph outside XLA, on one replica, the assertion raises
  ``tf.errors.InvalidArgumentError`` carrying the message after :data:`REFUSED`, which ``PrivateModel``'s training function turns back
  into that ``ValueError`` (:func:`as_value_error`). Under ``tf.distribute`` with several
  replicas there is no assertion (an aborted collective fails every later step of the
  process): the step completes with zeros and the record raises after it.
"""

from __future__ import annotations

import contextlib
import re
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import tensorflow as tf

from fdp_tf.randomness import num_replicas

__all__ = ["REFUSED", "Check", "RefusalRecord", "as_value_error", "gated", "guarding", "recording",
           "refuse_unless", "repeated_later"]

#: Starts the message of every run-time refusal (how a graph error is recognised).
REFUSED = "private step refused: "


@dataclass(frozen=True)
class Check:
    """A run-time check in a graph: its outcome and the ops that report a failure."""

    ok: tf.Tensor
    ops: tuple


class RefusalRecord:
    """How often each refusal message was raised inside graphs of one optimizer.

    A counter per message (up to :attr:`SLOTS` distinct messages; later ones share the
    last slot, whose message is the latest). Per replica under ``tf.distribute``, summed
    when read. The host remembers what it has seen, so each refusal is raised once.
    """

    SLOTS = 16

    def __init__(self) -> None:
        with tf.init_scope():  # may be created while the first step traces
            self.counts = tf.Variable(
                tf.zeros([self.SLOTS], tf.int32), trainable=False, name="fdp_refusals",
                synchronization=tf.VariableSynchronization.ON_READ, aggregation=tf.VariableAggregation.SUM)
        self.messages: list[str] = []
        self._seen = np.zeros([self.SLOTS], np.int64)

    def code(self, message: str) -> int:
        if message in self.messages:
            return self.messages.index(message)
        if len(self.messages) < self.SLOTS:
            self.messages.append(message)
        else:
            self.messages[-1] = message
        return min(len(self.messages), self.SLOTS) - 1

    def note(self, ok: tf.Tensor, message: str) -> Any:
        """In a graph: add 1 to ``message``'s counter unless ``ok``."""
        failed = tf.cast(tf.logical_not(ok), tf.int32)
        return self.counts.assign_add(tf.one_hot(self.code(message), self.SLOTS, dtype=tf.int32) * failed)

    def start(self) -> tf.Tensor:
        """In a graph, at a step's start: this replica's counters before the step."""
        return tf.identity(tf.convert_to_tensor(self.counts))

    def unchanged_since(self, start: tf.Tensor) -> tf.Tensor:
        """In a graph: no check of this replica noted a failure since ``start`` (also the
        checks inside the step's branches and loops, whose outcomes stay there)."""
        return tf.reduce_all(tf.equal(tf.convert_to_tensor(self.counts), start))

    def raise_new(self) -> None:
        """Raise ``ValueError`` for a refusal recorded since the last call, if any."""
        counts = np.asarray(tf.convert_to_tensor(self.counts)).astype(np.int64)
        new = np.flatnonzero(counts > self._seen)
        self._seen = counts
        if new.size:
            raise ValueError(REFUSED + self.messages[int(new[0])])


_ACTIVE: list[RefusalRecord] = []


@contextlib.contextmanager
def recording(record: RefusalRecord) -> Iterator[None]:
    """Checks made inside (while tracing or eagerly) are noted in ``record``."""
    _ACTIVE.append(record)
    try:
        yield
    finally:
        _ACTIVE.pop()


#: per thread: a tf.distribute strategy traces its replicas' steps in threads at once, and one
#: replica's tangent pass must not drop another replica's checks
_REPEATED = threading.local()


@contextlib.contextmanager
def repeated_later() -> Iterator[None]:
    """Inside (in this thread), a check that is not known at trace time adds no ops (it
    returns no :class:`Check`): for a pass that releases nothing and whose every check the
    pass after it makes again on the same computation (the tangent pass of forward mode
    through recurrent loops, vectorized over directions, where an assertion or a counter's
    update cannot be batched)."""
    _REPEATED.depth = getattr(_REPEATED, "depth", 0) + 1
    try:
        yield
    finally:
        _REPEATED.depth -= 1


def refuse_unless(ok: Any, message: str, restore: bool = True) -> list[Check]:
    """Refuse the step unless ``ok`` (a boolean scalar) holds.

    Raises ``ValueError(REFUSED + message)`` at once when the outcome is known: eagerly,
    or at trace time for a constant. In a graph: returns the :class:`Check`, which the
    caller must pass to :func:`gated` (``message`` must not contain ``]``, which ends it
    in TensorFlow's error text). Inside :func:`guarding` a failed graph check first puts
    the guarded variables back (``restore=False``: the guard's own check, which did).
    """
    if "]" in message:
        raise ValueError(f"a refusal message must not contain ']': {message!r}")
    known = ok if isinstance(ok, (bool, np.bool_)) else tf.get_static_value(ok)
    if known is not None or tf.executing_eagerly():
        if not bool(ok if known is None else known):
            raise ValueError(REFUSED + message)
        return []
    if getattr(_REPEATED, "depth", 0):
        return []
    ok = tf.convert_to_tensor(ok)
    guard = _GUARDS.stack[-1] if restore and getattr(_GUARDS, "stack", None) else None
    guard = guard if guard is not None and guard.variables else None  # nothing to restore
    # a failed assertion stops the graph before the step's own restore: restore first
    ops = [] if guard is None else [guard.restore_unless(ok)]
    with tf.control_dependencies(ops):
        if num_replicas() == 1 or not _ACTIVE:
            # raises at once outside XLA; with several replicas a failed assertion would abort
            # the step's collectives, which then fail for the rest of the process
            ops.append(tf.debugging.Assert(ok, [REFUSED + message]))
    if _ACTIVE:
        # after the assertion: recorded only where it did not raise (XLA drops it)
        with tf.control_dependencies(ops):
            ops.append(_ACTIVE[-1].note(ok, message))
    if guard is not None:
        # and no later write may run before the assertion decided (see guarding)
        with tf.control_dependencies(ops):
            ops.extend(guard.fence())
    return [Check(ok, tuple(ops))]


#: per thread (a tf.distribute strategy traces its replicas' steps in threads at once)
_GUARDS = threading.local()


@contextlib.contextmanager
def guarding(guard: Any) -> Iterator[None]:
    """Inside (in this thread), a graph check restores ``guard``'s variables before its
    assertion when it fails, so a refused step leaves nothing written, wherever it stops.

    ``guard`` (a :class:`fdp_tf.guards.StateGuard`, snapshot at the step's start) gives
    ``restore_unless(ok)``, the op that puts the snapshot back unless ``ok``, and
    ``fence()``, a read of every variable in one call. The read comes after the assertion, and
    TensorFlow orders a variable's later writes after its earlier reads (automatic control
    dependencies, program order), so no later write of the step can land after the restore
    while the assertion is still undecided; an earlier write lands before the restore.
    Without the fence a later pass's write could (the assertion, a stateful op without a
    resource, is ordered only with other such ops).
    """
    stack = getattr(_GUARDS, "stack", None)
    if stack is None:
        stack = _GUARDS.stack = []
    stack.append(guard)
    try:
        yield
    finally:
        stack.pop()


def gated(tensors: Sequence[Any], checks: Sequence[Check]) -> list[Any]:
    """``tensors`` if every check passed, else zeros of the same shapes (by value, so
    no compiler can drop it); each made to depend on the checks' ops."""
    checks = [c for c in checks if c is not None]
    if not checks:
        return list(tensors)
    ok = tf.reduce_all(tf.stack([c.ok for c in checks]))
    with tf.control_dependencies([op for c in checks for op in c.ops]):
        return [_select(ok, t) for t in tensors]


def _select(ok: tf.Tensor, t: Any) -> Any:
    if isinstance(t, tf.IndexedSlices):
        return tf.IndexedSlices(_select(ok, t.values), tf.identity(t.indices), t.dense_shape)
    t = tf.convert_to_tensor(t)
    return tf.where(ok, t, tf.zeros_like(t))


_MESSAGE = re.compile(re.escape(REFUSED) + r"([^\]]*)")


def as_value_error(err: BaseException) -> ValueError | None:
    """The ``ValueError`` of a refusal raised inside a graph, or ``None`` for other errors."""
    if not isinstance(err, tf.errors.OpError):
        return None
    found = _MESSAGE.search(str(getattr(err, "message", err)))
    if found is None:
        return None
    # TensorFlow prints the string C-escaped (\' for a quote, octal for UTF-8 bytes)
    text = found.group(1).strip().encode("latin-1", "backslashreplace").decode("unicode_escape")
    return ValueError(REFUSED + text.encode("latin-1", "replace").decode("utf-8", "replace"))
