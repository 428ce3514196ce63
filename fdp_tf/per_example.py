"""DP-SGD with exact per-example clipping (seed, Algorithm 4; Abadi et al. 2016).

    g^_i = min(1, C / ||g_i||) g_i
    g~   = (1/B) sum_i g^_i + (sigma C / B) N(0, I_d)

Three ways to get ||g_i||, all on one recorded forward pass: layer by layer
(:mod:`fdp_tf.layerwise`, exact norms from activations and backpropagated
gradients), ``GradientTape.jacobian`` with pfor ("vectorized", b-fold memory), or
one backward pass per example ("loop"). Examples whose loss or norm is not finite
get c_i = 0 and their rows are excluded from every sum (0 * inf would be NaN).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import tensorflow as tf

from fdp_tf.clipping import check_batch_size, clip_factors, plus_regularization, release
from fdp_tf.config import PER_EXAMPLE_METHODS
from fdp_tf.forward import ZERO, ForwardFn, PrivateGradient, RecordedForward, record_forward
from fdp_tf.introspection import looped_rnn_layers, seed_rewind
from fdp_tf.layerwise import layerwise_norms, reconstructed_sum
from fdp_tf.randomness import step_randomness

__all__ = [
    "clipped_per_example_sum",
    "per_example_gradients",
    "per_example_norms",
    "vanilla_private_gradient",
]

# the methods of this function ("auto" is the optimizer's choice among them, config.py)
_METHODS = tuple(m for m in PER_EXAMPLE_METHODS if m != "auto")


def per_example_gradients(
    recorded: RecordedForward, variables: Sequence[Any], *, vectorized: bool = True
) -> list[tf.Tensor]:
    """Exact g_1..g_b per variable, each of shape ``[b, *variable.shape]``.

    ``GradientTape.jacobian`` of the per-example losses on one recorded pass;
    ``vectorized=True`` uses pfor (fast, b-fold memory), ``False`` a
    ``tf.while_loop`` with one backward pass per example. The tape must be
    persistent. An empty batch (possible with Poisson sampling) gives ``[0, ...]``.
    """
    losses = recorded.forward.per_example_losses
    static = losses.shape[0]
    if static is not None:
        if static == 0:
            return [tf.zeros((0, *tuple(v.shape)), v.dtype) for v in variables]
        return _jacobian(recorded, variables, vectorized)
    # A batch of unknown size may be empty. A tf.cond around the jacobian would not do:
    # XLA compiles both branches for the actual size, and the jacobian's loop does not
    # compile on zero rows. So one data-independent row of loss 0 is appended (its
    # gradient is 0) and cut off again: the loop always has a row.
    rows = tf.shape(losses)[0]
    with recorded.tape:
        padded = tf.concat([losses, tf.zeros([1], losses.dtype)], 0)[: tf.maximum(rows, 1)]
    padded_forward = type(recorded.forward)(padded, recorded.forward.regularization, recorded.forward.outputs)
    jac = _jacobian(type(recorded)(recorded.tape, padded_forward, recorded.projections), variables, vectorized)
    return [j[:rows] for j in jac]


def _jacobian(recorded: RecordedForward, variables: Sequence[Any], vectorized: bool) -> list[tf.Tensor]:
    losses = recorded.forward.per_example_losses
    if vectorized:
        try:
            jac = recorded.tape.jacobian(
                losses, list(variables), unconnected_gradients=ZERO, experimental_use_pfor=True
            )
        except (ValueError, TypeError, NotImplementedError) as err:
            warnings.warn(
                f"vectorized per-example gradients failed ({type(err).__name__}: {err}); "
                "falling back to one backward pass per example",
                RuntimeWarning,
                stacklevel=3,
            )
            return _jacobian(recorded, variables, False)
    else:
        jac = recorded.tape.jacobian(
            losses, list(variables), unconnected_gradients=ZERO, experimental_use_pfor=False
        )
    return [tf.convert_to_tensor(j) for j in jac]


def per_example_norms(per_example: Sequence[tf.Tensor]) -> tf.Tensor:
    """||g_i||_2 over all variables, from :func:`per_example_gradients`."""
    squares = [
        tf.reduce_sum(tf.reshape(tf.square(g), (tf.shape(g)[0], -1)), axis=1) for g in per_example
    ]
    return tf.sqrt(tf.add_n(squares))


def streamed_clipped_sum(
    recorded: RecordedForward, variables: Sequence[Any], norm_of: Callable[[list[tf.Tensor]], tf.Tensor],
    l2_norm_clip: float, batch: int,
) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
    """(sum_i c_i g_i / B per variable, M, c) with one backward pass per example, the
    clipped terms summed as they come: memory of one gradient, not of b.

    g_i = grad of sum_k e_ik l_k (``output_gradients`` one-hot in row i), M_i =
    ``norm_of(g_i)`` (a scalar: ||g_i|| for exact clipping, the JL estimate for
    DP-SGD-JL), c_i = min(1, C / M_i), 0 for a non-finite M_i or l_i (that row is left
    out of the sum: 0 * inf is NaN). Every row is its own backward pass through the
    same recorded forward pass, so every c_i depends on example i alone. An empty batch
    runs one pass with zero output gradients (XLA compiles no loop of zero trips)."""
    losses = recorded.forward.per_example_losses
    rows = tf.shape(losses)[0]
    trips = tf.maximum(rows, 1)
    weight = 1.0 / float(batch)
    # row positions without a shape-dependent op (XLA needs one_hot's depth constant)
    positions = tf.cumsum(tf.ones_like(losses)) - 1.0
    dtype = _norm_dtype(variables)  # a float64 model's norms and factors in float64, as the losses' may not be

    def body(i, acc, norms, factors):
        row = tf.cast(tf.equal(positions, tf.cast(i, losses.dtype)), losses.dtype)  # zeros past the last row
        g = recorded.tape.gradient(losses, list(variables), output_gradients=row, unconnected_gradients=ZERO)
        g = [tf.convert_to_tensor(t) for t in g]
        norm = tf.reshape(tf.cast(norm_of(g), dtype), [1])
        loss = tf.reshape(tf.gather(tf.concat([losses, tf.zeros([1], losses.dtype)], 0), i), [1])
        factor = clip_factors(norm, l2_norm_clip, loss)
        keep = factor[0] > 0
        acc = [a + tf.where(keep, tf.cast(factor[0] * weight, t.dtype) * t, tf.zeros_like(t)) for a, t in zip(acc, g)]
        return i + 1, acc, norms.write(i, norm[0]), factors.write(i, factor[0])

    start = [tf.zeros(v.shape, v.dtype) for v in variables]
    _, summed, norms, factors = tf.while_loop(
        lambda i, *_: i < trips, body,
        (tf.constant(0), start, tf.TensorArray(dtype, size=trips), tf.TensorArray(dtype, size=trips)))
    return summed, norms.stack()[:rows], factors.stack()[:rows]


def _norm_dtype(tensors: Sequence[Any]) -> tf.DType:
    """float64 if any of ``tensors`` (variables or gradients) is, else float32."""
    return tf.float64 if any(tf.as_dtype(t.dtype) == tf.float64 for t in tensors) else tf.float32


def exact_norm(per_example: list[tf.Tensor]) -> tf.Tensor:
    """||g_i||_2 of one example's gradient (a list over variables), in float64 for a float64
    model (in float32 it is off by ~1e-7 relative, and c_i g_i could exceed C by that)."""
    dtype = _norm_dtype(per_example)
    return tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(tf.cast(t, dtype))) for t in per_example]))


def _clipped_from_per_example(
    recorded: RecordedForward, variables: Sequence[Any], vectorized: bool,
    l2_norm_clip: float, batch: int,
) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
    """(sum_i c_i g_i / B per variable, norms, factors) from exact per-example gradients."""
    if not vectorized:
        return streamed_clipped_sum(recorded, variables, exact_norm, l2_norm_clip, batch)
    per_example = per_example_gradients(recorded, variables, vectorized=vectorized)
    norms = per_example_norms(per_example)
    factors = clip_factors(norms, l2_norm_clip, recorded.forward.per_example_losses)
    return clipped_per_example_sum(per_example, factors, batch), norms, factors


def clipped_per_example_sum(per_example: Sequence[tf.Tensor], factors: tf.Tensor, batch: int) -> list[tf.Tensor]:
    """sum_i c_i g_i / B per variable; rows with c_i = 0 are excluded (they may hold inf
    or NaN, and 0 * inf is NaN)."""
    keep = factors > 0
    weights = factors / tf.cast(batch, factors.dtype)
    grads = []
    for g in per_example:
        mask = tf.reshape(keep, tf.concat([tf.shape(keep), tf.ones([tf.rank(g) - 1], tf.int32)], 0))
        g = tf.where(mask, g, tf.zeros_like(g))
        grads.append(tf.tensordot(tf.cast(weights, g.dtype), g, axes=1))
    return grads


def vanilla_private_gradient(
    forward_fn: ForwardFn,
    variables: Sequence[Any],
    *,
    l2_norm_clip: float,
    noise_multiplier: float,
    expected_batch_size: int,
    rng: Any = None,
    per_example_method: str = "vectorized",
    model: Any = None,
) -> PrivateGradient:
    """One DP-SGD gradient with exact per-example clipping (seed, Algorithm 4).

        g^_i = min(1, C / ||g_i||) g_i
        g~   = (1/B) sum_i g^_i + (sigma C / B) N(0, I_d)

    Args:
      forward_fn: runs the model once and returns a :class:`ForwardPass`.
      variables: trainable variables.
      l2_norm_clip: C.
      noise_multiplier: sigma.
      expected_batch_size: B, the *expected* batch size of the Poisson sampling.
      rng: ``tf.random.Generator`` for the noise; ``None``: OS entropy; an int is refused.
      per_example_method: ``"layerwise"`` (exact ||g_i|| layer by layer; the released
        sum is rebuilt from the same layer taps, so each example's contribution has
        exactly the clipped norm; every step checks that the taps saw every use of every
        weight, and if not, uses the per-example loop on a fresh pass; needs ``model``), ``"vectorized"`` (``GradientTape.jacobian`` with pfor) or
        ``"loop"`` (one backward pass per example). If ``"layerwise"`` cannot handle
        the model at all it warns and uses pfor (the loop for looped RNNs).
      model: the Keras model run by ``forward_fn`` (for ``"layerwise"``).
    """
    if per_example_method not in _METHODS:
        raise ValueError(
            f"per_example_method must be one of {list(_METHODS)}; got {per_example_method!r}"
        )
    batch = check_batch_size(expected_batch_size)
    draws = step_randomness(rng)
    if per_example_method == "layerwise":
        if model is None:
            raise ValueError("per_example_method='layerwise' needs the model (model=...)")
        rewind = seed_rewind(model)  # a fresh pass draws the masks of the first
        recorded, norms, pieces, reason, covered = layerwise_norms(forward_fn, variables, model, draws)
        if norms is not None:
            clipped, norms, factors = _layerwise_release(
                forward_fn, recorded, variables, norms, pieces, covered, l2_norm_clip, batch, rewind
            )
            return release(
                plus_regularization(clipped, recorded, variables), recorded, norms, factors,
                l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier,
                expected_batch_size=batch, rng=draws,
                fallbacks=tf.cast(tf.logical_not(covered), tf.int32),
            )
        vectorized = not looped_rnn_layers(model)
        warnings.warn(
            f"per_example_method='layerwise' cannot handle this model ({reason}); computing "
            f"per-example gradients with {'pfor' if vectorized else 'a per-example loop'}",
            RuntimeWarning,
            stacklevel=2,
        )
    else:
        vectorized = per_example_method == "vectorized"
        recorded = record_forward(forward_fn, persistent=True)
    clipped, norms, factors = _clipped_from_per_example(recorded, variables, vectorized, l2_norm_clip, batch)
    return release(
        plus_regularization(clipped, recorded, variables), recorded, norms, factors,
        l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier,
        expected_batch_size=batch, rng=draws,
    )


def _layerwise_release(
    forward_fn: ForwardFn, recorded: RecordedForward, variables: Sequence[Any], norms: tf.Tensor,
    pieces: Any, covered: tf.Tensor, l2_norm_clip: float, batch: int, rewind: Callable[[], None],
) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
    """The taps' reconstruction sum_i c_i G_i / B if the taps saw every use of every
    variable, else exact per-example gradients of a fresh pass (the tapped pass read
    its weights as constants); the choice is made per step, in the graph."""
    losses = recorded.forward.per_example_losses
    factors = clip_factors(norms, l2_norm_clip, losses)
    mine = reconstructed_sum(pieces, variables, factors / tf.cast(batch, factors.dtype))

    def taps() -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        return list(mine), norms, factors

    def loop() -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        rewind()
        fresh = record_forward(forward_fn, persistent=True)
        return _clipped_from_per_example(fresh, variables, False, l2_norm_clip, batch)

    if tf.executing_eagerly():
        return taps() if bool(covered) else loop()
    return tf.cond(covered, taps, loop)
