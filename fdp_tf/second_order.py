"""Models whose backward pass has no gradient in TensorFlow: first-order methods only.

TensorFlow's forward mode (``tf.autodiff.ForwardAccumulator``) computes a jvp by
differentiating each op's gradient function, and the double-vjp trick differentiates the
backward pass itself: both need the gradient of the gradient ops, which TensorFlow does
not define for every op (``SoftsignGrad``, i.e. a ``softsign`` activation, among others).
Such a model trains fine in plain Keras, and with exact per-example gradients (the layer
taps, the per-example loop), but its first private step crashed while tracing with
``LookupError: gradient registry has no entry for: SoftsignGrad`` however it was asked to
train: the run-time probe's signature uses the double vjp where the taps do not take the
model.

:meth:`fdp_tf.DPOptimizer.compute_private_gradients` catches that error while the step
traces (nothing has run in a graph; eagerly, :func:`fdp_tf.verify.verified_private_gradient`
restores the dropout seed states, the step's key and the guarded weights the attempt
changed, and nothing was released), records the op here for the model, and traces the step again with
first-order methods: ``jvp_method="auto"`` then takes the per-example loop (exact
projections; the layer taps would need a second pass or the double vjp wherever they meet
a weight used outside its layer), the probe's signature uses the per-example loop, and an
explicit ``jvp_method="forward"`` or ``"double_vjp"`` is refused naming the op.
"""

from __future__ import annotations

import re
import warnings
import weakref
from typing import Any, Callable, TypeVar

T = TypeVar("T")

__all__ = ["first_order_if_needed", "missing_gradient", "record_missing", "without_second_order"]

_MISSING: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()

_PATTERNS = (re.compile(r"gradient registry has no entry for: (\w+)"),
             re.compile(r"No gradient defined for operation.*?\(op type: (\w+)\)", re.S))


def missing_gradient(err: BaseException) -> str | None:
    """The op type whose gradient TensorFlow lacks, if ``err`` says so; else ``None``."""
    if not isinstance(err, LookupError):
        return None
    for pattern in _PATTERNS:
        found = pattern.search(str(err))
        if found:
            return found.group(1)
    return None


def without_second_order(model: Any) -> str | None:
    """The op recorded for ``model`` (its backward pass has no gradient), or ``None``."""
    if model is None:
        return None
    try:
        return _MISSING.get(model)
    except TypeError:  # not weak-referenceable: never recorded
        return None


def record_missing(model: Any, op_type: str) -> bool:
    """Record that ``model``'s backward pass has no gradient of ``op_type``; warn once.
    Returns False if it was recorded already (a second crash: not a second-order one)."""
    if model is None or without_second_order(model) is not None:
        return False
    try:
        _MISSING[model] = op_type
    except TypeError:
        return False
    warnings.warn(
        f"TensorFlow defines no gradient of the op {op_type!r} in this model's backward pass, so "
        "nothing can differentiate the backward pass (forward mode and the double vjp): the "
        "private step uses first-order methods instead (the per-example loop, one backward pass "
        "per example, unless jvp_method='layerwise' is asked for)", RuntimeWarning, stacklevel=4)
    return True


def first_order_if_needed(trace: Callable[[], T], model: Any) -> T:
    """``trace()``; if it meets a gradient TensorFlow lacks (nothing has run: it is caught
    while tracing, or eagerly before the step released anything), record the op for
    ``model`` and trace again, now with first-order methods. A second such error, or one
    without a model to record it for, is raised as a ``ValueError`` saying what to do."""
    try:
        return trace()
    except LookupError as err:
        op_type = missing_gradient(err)
        if op_type is None or not record_missing(model, op_type):
            raise _no_gradient(op_type, model, err) from err
    try:
        return trace()
    except LookupError as again:
        raise _no_gradient(missing_gradient(again), model, again) from again


def _no_gradient(op_type: str | None, model: Any, err: BaseException) -> BaseException:
    """The error for a trace that met a gradient TensorFlow lacks even with first-order methods."""
    if op_type is None:
        return err
    if model is None:
        return ValueError(
            f"TensorFlow defines no gradient of the op {op_type!r} in this model's backward pass; nothing "
            "was trained. Pass model=... to compute_private_gradients, so that the step can choose "
            "first-order methods, or use jvp_method='loop' / per_example_method='loop'")
    return ValueError(
        f"TensorFlow defines no gradient of the op {op_type!r}, which this model's training needs even "
        "with first-order methods (exact per-example gradients); nothing was trained. Replace the layer "
        "or activation that uses it (e.g. activation='softsign') or register a gradient for it")
