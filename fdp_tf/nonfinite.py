"""Examples with a non-finite loss: dropped, never allowed to poison the update."""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from fdp_tf.forward import PrivateGradient

__all__ = ["without_nonfinite_examples"]


def without_nonfinite_examples(
    result: PrivateGradient, rerun: Callable[[tf.Tensor], PrivateGradient]
) -> PrivateGradient:
    """Run the step on the examples with a finite loss only.

    Backpropagation mixes rows (a weight's gradient is x^T delta over the batch), so
    one example with non-finite activations turns every per-example gradient, JL
    projection and the clipped sum into 0 * inf = NaN, even with its c_i = 0. When
    some loss is not finite, the whole private step is run afresh (new directions,
    noise and dropout) on the rows with a finite loss. Either way the released
    gradient is a fresh private step of the sub-batch of finite-loss rows, and a
    row's membership depends on that row alone, so this is a per-example clipping to
    0. Rows whose loss is finite but whose norm overflows get c_i = 0 inside the step.
    The retry is decided by the losses only, never by the released result (that
    would be a data-dependent rejection of noise draws).

    Args:
      result: the private step on the whole batch.
      rerun: runs the whole private step afresh on the rows where a mask is true.

    Raises:
      tf.errors.InvalidArgumentError: at run time, if the update is still not finite
        (the model overflows on finite inputs): training stops rather than release it.
    """
    losses = result.forward.per_example_losses
    keep = tf.math.is_finite(losses)
    finite = tf.reduce_all(keep)

    def first() -> tuple:
        return (list(result.gradients), tf.cast(result.dropped, tf.int32), _fallbacks(result),
                result.norms, result.clip_factors)

    def again() -> tuple:
        retry = rerun(keep)
        dropped = tf.cast(retry.dropped, tf.int32) + tf.reduce_sum(tf.cast(tf.logical_not(keep), tf.int32))
        # the retry's norms and factors, back at their rows of the whole batch: a dropped
        # row has norm NaN (none was computed) and factor 0
        rows = tf.cast(tf.where(keep), tf.int32)
        norms = tf.tensor_scatter_nd_update(
            tf.fill(tf.shape(keep), tf.constant(float("nan"), result.norms.dtype)), rows,
            tf.cast(retry.norms, result.norms.dtype))
        factors = tf.scatter_nd(rows, tf.cast(retry.clip_factors, result.clip_factors.dtype), tf.shape(keep))
        return list(retry.gradients), dropped, _fallbacks(retry), norms, factors

    if tf.executing_eagerly():
        grads, dropped, fallbacks, norms, factors = first() if bool(finite) else again()
    else:
        grads, dropped, fallbacks, norms, factors = tf.cond(finite, first, again)
    for g in grads:
        tf.debugging.assert_all_finite(
            g, "the private gradient is not finite even without the examples whose loss "
               "is not finite: the model overflows on finite inputs; scale the inputs")
    return PrivateGradient(grads, result.forward, norms, factors, dropped,
                           None if result.fallbacks is None else fallbacks)


def _fallbacks(result: PrivateGradient) -> tf.Tensor:
    return tf.zeros([], tf.int32) if result.fallbacks is None else tf.cast(result.fallbacks, tf.int32)
