"""Examples with a non-finite loss or gradient: dropped, never allowed to poison the update."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from fdp_tf.forward import ZERO, ForwardPass, PrivateGradient, record_forward
from fdp_tf.refusals import gated, refuse_unless

__all__ = ["NOT_FINITE", "single_row_check", "without_nonfinite_examples"]

NOT_FINITE = ("the private gradient is not finite even without the examples whose loss or gradient "
              "is not finite: the model overflows on finite inputs; scale the inputs")


def without_nonfinite_examples(
    result: PrivateGradient,
    rerun: Callable[[tf.Tensor], PrivateGradient],
    finite_alone: Callable[[tf.Tensor, tf.Tensor], tf.Tensor] | None = None,
) -> PrivateGradient:
    """Run the step on the examples whose loss and per-example gradient are finite.

    Backpropagation mixes rows (a weight's gradient is x^T delta over the batch), so
    one example with non-finite activations turns every per-example gradient, JL
    projection and the clipped sum into 0 * inf = NaN, even with its c_i = 0; its loss
    may still be finite (an infinite input through a saturated tanh). When some loss or
    per-example norm (exact, or the JL estimate M_i) is not finite, the whole private
    step is run afresh (new directions, noise and dropout) on the other rows. A row is
    judged by itself: the JL projections, the layer taps and pfor compute each row's
    norm from that row alone, but the per-example loop's backward passes share the batch,
    so a norm that is not finite may be another row's 0 * inf; such a row is kept if its
    gradient, computed on a batch of that row alone (``finite_alone``), is finite. Either
    way the released gradient is a fresh private step of the sub-batch of finite rows,
    and a row's membership depends on that row alone (and public randomness), so this is
    a per-example clipping to 0: an abort or a drop of the whole batch when one example
    is present would reveal that it is. Rows whose norm only overflows get c_i = 0
    inside the step (their gradient is finite). The retry is decided before the noise,
    never by the released result (that would be a data-dependent rejection of noise).

    Args:
      result: the private step on the whole batch.
      rerun: runs the whole private step afresh on the rows where a mask is true.
      finite_alone: for row indices and a mask of the rows asked about, whether each
        asked row's gradient is finite on a batch of that row alone (False for the
        others); ``None``: a non-finite norm drops its row.

    Raises:
      tf.errors.InvalidArgumentError: at run time, if the update is still not finite
        (the model overflows on finite inputs): training stops rather than release it
        (the released gradients depend on that check).
    """
    losses = result.forward.per_example_losses
    finite_loss = tf.math.is_finite(losses)
    finite_norm = tf.math.is_finite(tf.cast(result.norms, tf.float32))
    keep = tf.logical_and(finite_loss, finite_norm)
    if finite_alone is not None:
        suspects = tf.logical_and(finite_loss, tf.logical_not(finite_norm))

        def judged_alone() -> tf.Tensor:
            # every row, each pass skipped unless it is a suspect (no tf.where: XLA needs
            # the shapes of scatter_nd at compile time)
            rows = tf.range(tf.shape(suspects)[0], dtype=tf.int32)
            return tf.logical_or(keep, finite_alone(rows, suspects))

        keep = _cond(tf.reduce_any(suspects), judged_alone, lambda: keep)
    finite = tf.reduce_all(keep)

    def first() -> tuple:
        return (list(result.gradients), tf.cast(result.dropped, tf.int32), _fallbacks(result),
                result.norms, result.clip_factors)

    def again() -> tuple:
        retry = rerun(keep)
        dropped = tf.cast(retry.dropped, tf.int32) + tf.reduce_sum(tf.cast(tf.logical_not(keep), tf.int32))
        # the retry's norms and factors, back at their rows of the whole batch: a dropped
        # row has norm NaN (none was computed) and factor 0. A gather from the retry's
        # values plus one padding entry, not a scatter: XLA compiles this branch even for
        # an empty batch, where it cannot compile a scatter into zero rows
        at = tf.where(keep, tf.cumsum(tf.cast(keep, tf.int32)) - 1, tf.shape(retry.norms)[0])
        norms = tf.gather(tf.concat([tf.cast(retry.norms, result.norms.dtype),
                                     tf.constant([float("nan")], result.norms.dtype)], 0), at)
        factors = tf.gather(tf.concat([tf.cast(retry.clip_factors, result.clip_factors.dtype),
                                       tf.zeros([1], result.clip_factors.dtype)], 0), at)
        return list(retry.gradients), dropped, _fallbacks(retry), norms, factors

    grads, dropped, fallbacks, norms, factors = _cond(finite, first, again)
    # the checked values are what is released: a failed check stops the apply too
    finite_grads = tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in grads]))
    grads = gated(grads, refuse_unless(finite_grads, NOT_FINITE))
    return PrivateGradient(grads, result.forward, norms, factors, dropped,
                           None if result.fallbacks is None else fallbacks)


def single_row_check(
    forward_on_rows: Callable[[tf.Tensor], ForwardPass], variables: Sequence[Any], batch_rows: tf.Tensor
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """``finite_alone`` for :func:`without_nonfinite_examples`: row i's loss and gradient
    on a batch of row i alone (one forward and backward pass per row asked about)."""

    def one(i: tf.Tensor) -> tf.Tensor:
        recorded = record_forward(lambda: forward_on_rows(tf.equal(tf.range(batch_rows), i)))
        losses = recorded.forward.per_example_losses
        grads = recorded.tape.gradient(losses, list(variables), unconnected_gradients=ZERO)
        ok = tf.reduce_all(tf.math.is_finite(losses))
        for g in grads:
            ok = tf.logical_and(ok, tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(g))))
        return ok

    def check(rows: tf.Tensor, asked: tf.Tensor) -> tf.Tensor:
        # a while loop or-ing into a [b] vector, not map_fn or a scatter: XLA compiles
        # neither on an empty batch, which Poisson sampling draws
        def body(k: tf.Tensor, out: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            i = tf.gather(rows, k)
            ok = _cond(tf.gather(asked, i), lambda: one(i), lambda: tf.constant(False))
            return k + 1, tf.logical_or(out, tf.logical_and(tf.equal(index, k), ok))

        count = tf.shape(rows)[0]
        index = tf.range(count)
        return tf.while_loop(lambda k, out: k < count, body,
                             (tf.constant(0), tf.zeros([count], tf.bool)))[1]

    return check


def _cond(pred: tf.Tensor, true_fn: Callable[[], Any], false_fn: Callable[[], Any]) -> Any:
    if tf.executing_eagerly():
        return true_fn() if bool(pred) else false_fn()
    return tf.cond(pred, true_fn, false_fn)


def _fallbacks(result: PrivateGradient) -> tf.Tensor:
    return tf.zeros([], tf.int32) if result.fallbacks is None else tf.cast(result.fallbacks, tf.int32)
