"""One recorded forward pass: what a private gradient is computed from.

Every quantity of a private step (JL projections or exact norms, and the clipped
sum) is read from *one* forward pass recorded on a ``tf.GradientTape``, so dropout
masks are the same for the norm and for the gradient that gets clipped; the
privacy proof (seed, Lemma "subroutine privacy") needs that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import keras
import tensorflow as tf

__all__ = [
    "ForwardFn",
    "ForwardPass",
    "PrivateGradient",
    "RecordedForward",
    "ZERO",
    "check_forward",
    "raw_variables",
    "record_forward",
    "stand_in_row",
    "trim_to_rows",
]

ZERO = tf.UnconnectedGradients.ZERO


@dataclass(frozen=True)
class ForwardPass:
    """What a forward function returns.

    Attributes:
      per_example_losses: l_1..l_b, shape ``[b]``.
      regularization: a data-independent scalar loss (weight penalties) or
        ``None``. Its gradient is added without clipping: it does not depend on
        any example, so it costs no privacy.
      outputs: the model outputs, for metrics.
    """

    per_example_losses: tf.Tensor
    regularization: tf.Tensor | None = None
    outputs: Any = None


@dataclass(frozen=True)
class RecordedForward:
    """A forward pass recorded on a tape, plus JL projections if forward mode ran."""

    tape: tf.GradientTape
    forward: ForwardPass
    projections: tf.Tensor | None = None


@dataclass(frozen=True)
class PrivateGradient:
    """Result of one private gradient computation.

    Attributes:
      gradients: g~ per variable, same order as the variables given.
      forward: the recorded forward pass (losses, outputs).
      norms: M_i (JL estimates) or the exact ||g_i||_2, shape ``[b]``.
      clip_factors: c_i = min(1, C / M_i), shape ``[b]``; 0 for an example whose
        loss or norm is not finite (it is dropped, see :func:`fdp_tf.clip_factors`).
      dropped: number of examples dropped that way (int32 scalar).
      fallbacks: 1 if a layer-wise step found a weight read outside its layer and
        used exact per-example gradients of a fresh pass instead, else 0 (int32
        scalar; ``None`` for the other methods).
    """

    gradients: list[tf.Tensor]
    forward: ForwardPass
    norms: tf.Tensor
    clip_factors: tf.Tensor
    dropped: tf.Tensor | None = None
    fallbacks: tf.Tensor | None = None


ForwardFn = Callable[[], ForwardPass]


def raw_variables(variables: Sequence[Any]) -> list[tf.Variable]:
    """The ``tf.Variable`` behind each Keras 3 variable (ForwardAccumulator needs it)."""
    return [v.value if isinstance(v, keras.Variable) else v for v in variables]


def record_forward(forward_fn: ForwardFn, *, persistent: bool = False) -> RecordedForward:
    """Run ``forward_fn`` once under a ``GradientTape``."""
    with tf.GradientTape(persistent=persistent) as tape:
        forward = forward_fn()
    check_forward(forward)
    return RecordedForward(tape=tape, forward=forward)


def check_forward(forward: ForwardPass) -> None:
    """Refuse a forward function that does not return one loss per example."""
    if not isinstance(forward, ForwardPass):
        raise TypeError(
            f"forward_fn must return fdp_tf.ForwardPass; got {type(forward).__name__}"
        )
    if forward.per_example_losses.shape.rank != 1:
        raise ValueError(
            "ForwardPass.per_example_losses must have shape [batch]; got shape "
            f"{forward.per_example_losses.shape}"
        )


def _dense_leaves(structure: Any) -> list[tf.Tensor] | None:
    """The leaves of ``structure`` as dense tensors, or ``None`` if one is ragged or sparse."""
    leaves = [t for t in tf.nest.flatten(structure) if t is not None]
    if any(isinstance(t, (tf.RaggedTensor, tf.SparseTensor)) for t in leaves):
        return None
    return [tf.convert_to_tensor(t) for t in leaves]


def stand_in_row(x: Any, y: Any, sample_weight: Any) -> tuple[Any, Any, Any, tf.Tensor | None]:
    """``(x, y, sample_weight, rows)``, with one all-zero row standing in for an empty batch.

    Poisson sampling and random allocation draw empty batches, and some TensorFlow
    kernels crash on a batch of zero rows (a dilated ``Conv2D``'s bias add). A private
    step on an empty batch must release the noise alone, so the model runs on one
    data-independent row of zeros whose loss the caller multiplies by 0
    (:meth:`fdp_tf.PrivateModel.private_gradients`): its clipped term is 0 and nothing of
    it is released. Each leaf is ``concat([t, zeros(1, ...)])[:max(rows, 1)]``, the batch
    itself when it has a row. ``rows`` is the batch's row count, ``None`` (nothing
    changed) when an input is ragged or sparse. Not for XLA (``jit_compile``), which runs
    zero rows itself and aborts on this value-dependent shape.
    """
    leaves = _dense_leaves(x)
    if not leaves or _dense_leaves((y, sample_weight)) is None:
        return x, y, sample_weight, None
    rows = tf.shape(leaves[0])[0]
    keep = tf.maximum(rows, 1)

    def pad(t: Any) -> Any:
        if t is None:
            return None
        t = tf.convert_to_tensor(t)
        if t.shape.rank == 0:
            return t
        zero = tf.zeros(tf.concat([[1], tf.shape(t)[1:]], 0), t.dtype)
        return tf.concat([t, zero], 0)[:keep]

    return (tf.nest.map_structure(pad, x), tf.nest.map_structure(pad, y),
            None if sample_weight is None else pad(sample_weight), rows)


def trim_to_rows(result: PrivateGradient, rows: tf.Tensor | None) -> PrivateGradient:
    """``result`` with its per-example parts cut back to the batch's ``rows`` (drops the
    row :func:`stand_in_row` added to an empty batch; the gradients are not per example)."""
    if rows is None:
        return result

    def cut(t: Any) -> Any:
        return t[:rows] if isinstance(t, tf.Tensor) and t.shape.rank else t

    forward = result.forward
    forward = ForwardPass(cut(forward.per_example_losses), forward.regularization,
                          tf.nest.map_structure(cut, forward.outputs))
    return PrivateGradient(result.gradients, forward, cut(result.norms), cut(result.clip_factors),
                           result.dropped, result.fallbacks)
