"""Refusing a private step from inside the graph, before anything is released.

A check that can only be decided on the data (one loss per input row, the row
independence probe, a non-trainable weight that changed) runs inside the traced step.
Two things make such a refusal hold:

* **it gates the release.** A failed ``tf.debugging.Assert`` does not stop stateful ops
  that do not depend on it (TensorFlow runs a later ``assign`` of an unrelated variable
  anyway), so the released tensors are made to depend on every check
  (:func:`gated`): ``apply_gradients`` cannot run before the checks passed.
* **it says what to do.** Eagerly it is a ``ValueError``; in a graph TensorFlow raises
  ``tf.errors.InvalidArgumentError`` carrying the same message after :data:`REFUSED`,
  which ``PrivateModel``'s training function turns back into that ``ValueError``
  (:func:`as_value_error`). A custom loop inside ``tf.function`` sees the
  ``InvalidArgumentError``.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import tensorflow as tf

__all__ = ["REFUSED", "as_value_error", "gated", "refuse_unless"]

#: Starts the message of every run-time refusal (how a graph error is recognised).
REFUSED = "private step refused: "


def refuse_unless(ok: Any, message: str) -> list[Any]:
    """Refuse the step unless ``ok`` (a boolean scalar) holds.

    Eagerly: raises ``ValueError(REFUSED + message)`` at once. In a graph: returns the
    assertion op, which the caller must pass to :func:`gated` (``message`` must not
    contain ``]``, which ends it in TensorFlow's error text).
    """
    if "]" in message:
        raise ValueError(f"a refusal message must not contain ']': {message!r}")
    if isinstance(ok, bool) or tf.executing_eagerly():
        if not bool(ok):
            raise ValueError(REFUSED + message)
        return []
    return [tf.debugging.Assert(ok, [REFUSED + message])]


def gated(tensors: Sequence[tf.Tensor], checks: Sequence[Any]) -> list[tf.Tensor]:
    """``tensors``, each made to depend on every op of ``checks`` (no-op when empty)."""
    checks = [c for c in checks if c is not None]
    if not checks:
        return list(tensors)
    with tf.control_dependencies(checks):
        return [tf.identity(t) for t in tensors]


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
