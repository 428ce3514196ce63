"""The JL norm estimator of DP-SGD-JL / DP-Adam-JL (seed, Algorithm 1, lines 5-14).

Reference: Bu, Gopi, Kulkarni, Lee, Shen, Tantipongpipat, "Fast and Memory
Efficient Differentially Private-SGD via JL Projections", arXiv:2102.03013v1,
Algorithm 1 (DP-SGD-JL), Algorithm 3 (DP-Adam-JL).

Notation::

    l_i      per-example loss of example i in the batch (i = 1..b)
    g_i      grad_theta l_i, the per-example gradient
    v_j      j-th JL direction, v_j ~ N(0, I_d), same shapes as the variables
    P_ij     <g_i, v_j>, the JL projections                     (Alg. 1, line 7)
    M_i      sqrt( sum_j P_ij^2 / r ), estimate of ||g_i||_2    (Alg. 1, line 10)
    g~       (1/B) sum_i min(1, C/M_i) g_i + (sigma C / B) N(0, I_d)   (line 14)

The projections are read from the same recorded forward pass whose tape then gives
the clipped sum (one vjp with ``output_gradients = c / B``), so M_i estimates the
norm of exactly the gradient that gets clipped.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import tensorflow as tf

from fdp_tf.clipping import (
    check_batch_size,
    clip_factors,
    clipped_gradient,
    plus_regularization,
    release,
)
from fdp_tf.forward import ForwardFn, PrivateGradient, RecordedForward, record_forward
from fdp_tf.introspection import seed_rewind
from fdp_tf.jl_projections import LOOP_MESSAGE, double_vjp_projections, forward_mode_projections
from fdp_tf.layerwise import layerwise_pieces, layerwise_projections, reconstructed_sum
from fdp_tf.per_example import streamed_clipped_sum
from fdp_tf.randomness import DIRECTIONS_STREAM, step_randomness
from fdp_tf.recurrent_tangents import TangentRecorded, recorded_tangent_projections, tangent_unsupported
from fdp_tf.refusals import gated
from fdp_tf.second_order import without_second_order

__all__ = [
    "jl_norm_estimates",
    "jl_norms",
    "jl_private_gradient",
    "layerwise_jl_gradient",
    "loop_jl_clipped",
    "sample_directions",
]


def jl_norms(projections: tf.Tensor) -> tf.Tensor:
    """M_i = sqrt( (1/r) sum_j P_ij^2 ) for projections of shape ``[b, r]``.

    Seed, Proposition "JL projections": M_i ~ ||g_i||_2 sqrt(chi2_r / r), so
    E[M_i^2] = ||g_i||^2.
    """
    return tf.sqrt(tf.reduce_mean(tf.square(projections), axis=1))


def sample_directions(
    variables: Sequence[Any], jl_projections: int, rng: Any = None
) -> list[tf.Tensor]:
    """Draw v_1..v_r ~ N(0, I_d), returned per variable with a leading axis r.

    Args:
      variables: the trainable variables.
      jl_projections: r.
      rng: ``tf.random.Generator``, a :class:`fdp_tf.randomness.StepRandomness`, or
        ``None`` (OS entropy); an int is refused (it would repeat the directions).

    Returns:
      A list, one tensor of shape ``[r, *variable.shape]`` per variable.
    """
    draws = step_randomness(rng)
    return [
        draws.normal((jl_projections, *tuple(v.shape)), v.dtype, DIRECTIONS_STREAM)
        for v in variables
    ]


def jl_norm_estimates(
    forward_fn: ForwardFn,
    variables: Sequence[Any],
    jl_projections: int,
    *,
    rng: Any = None,
    jvp_method: str = "forward",
    directions: Sequence[tf.Tensor] | None = None,
    model: Any = None,
) -> tuple[RecordedForward, tf.Tensor]:
    """Record one forward pass and estimate every ||g_i|| by M_i (Alg. 1, l. 6-11).

    Args:
      forward_fn: runs the model on the batch and returns a :class:`ForwardPass`.
      variables: the trainable variables theta.
      jl_projections: r.
      rng: generator (or step randomness) for the directions; ``None``: OS entropy.
      jvp_method: ``"forward"``, ``"double_vjp"``, or ``"auto"`` (forward mode, and
        the double vjp where forward mode cannot pass through a loop of the model).
        Forward mode through a model whose loops are all plain Keras LSTM, GRU or
        SimpleRNN layers carries the r tangents together through the loops, then records a
        second pass for the clipped sum
        (:func:`fdp_tf.recurrent_tangents.recorded_tangent_projections`).
      directions: fixed directions (list of ``[r, *shape]``), for tests.
      model: the Keras model ``forward_fn`` runs (needed for forward mode through its loops).

    Returns:
      ``(recorded, M)`` with the recorded pass (tape persistent for the
      double-vjp path) and M of shape ``[b]``.
    """
    if directions is None:
        directions = sample_directions(variables, jl_projections, rng)
    if jvp_method not in ("forward", "double_vjp", "auto"):
        raise ValueError(
            f"jvp_method must be 'forward', 'double_vjp' or 'auto'; got {jvp_method!r}"
        )
    if jvp_method in ("forward", "auto") and model is not None and tangent_unsupported(model) is None:
        recorded = recorded_tangent_projections(forward_fn, variables, model, directions)
        return recorded, jl_norms(recorded.projections)
    if jvp_method in ("forward", "auto"):
        try:
            recorded = forward_mode_projections(forward_fn, variables, directions)
            return recorded, jl_norms(recorded.projections)
        except ValueError as err:
            if jvp_method == "forward" or LOOP_MESSAGE not in str(err):
                raise
            # a loop the static checks could not see (ops.scan, tf.map_fn, ...): the
            # abandoned trace leaves no live ops, the double vjp works through loops
    recorded = record_forward(forward_fn, persistent=True)
    recorded = RecordedForward(
        recorded.tape, recorded.forward, double_vjp_projections(recorded, variables, directions)
    )
    return recorded, jl_norms(recorded.projections)


def jl_private_gradient(
    forward_fn: ForwardFn,
    variables: Sequence[Any],
    *,
    l2_norm_clip: float,
    noise_multiplier: float,
    jl_projections: int,
    expected_batch_size: int,
    rng: Any = None,
    jvp_method: str = "forward",
    model: Any = None,
) -> PrivateGradient:
    """One DP-SGD-JL gradient (seed, Algorithm 1, lines 5-14).

        v_1..v_r ~ N(0, I_d)
        P_ij = <grad l_i, v_j>       (layer taps, forward-mode jvp or double vjp)
        M_i  = sqrt( sum_j P_ij^2 / r )
        g~   = grad (1/B) sum_i min(1, C/M_i) l_i  +  (sigma C / B) N(0, I_d)

    Args:
      forward_fn: runs the model once and returns a :class:`ForwardPass`.
      variables: trainable variables.
      l2_norm_clip: C.
      noise_multiplier: sigma.
      jl_projections: r.
      expected_batch_size: B, the *expected* batch size of the Poisson sampling
        (required: the realised size would make the noise scale data-dependent).
      rng: ``tf.random.Generator`` for directions and noise; ``None``: OS entropy.
        An int is refused (it would repeat the same noise at every call).
      jvp_method: ``"layerwise"`` (needs ``model``; see :func:`layerwise_jl_gradient`),
        ``"forward"``, ``"double_vjp"``, ``"loop"`` (exact per-example gradients, one
        backward pass per example: see :func:`loop_jl_clipped`) or ``"auto"``.
      model: the Keras model run by ``forward_fn`` (for ``"layerwise"``, and for forward
        mode through its recurrent loops).
    """
    batch = check_batch_size(expected_batch_size)
    draws = step_randomness(rng)
    if jvp_method == "layerwise":
        if model is None:
            raise ValueError("jvp_method='layerwise' needs the model (model=...)")
        return layerwise_jl_gradient(
            forward_fn, variables, model, l2_norm_clip=l2_norm_clip,
            noise_multiplier=noise_multiplier, jl_projections=jl_projections,
            expected_batch_size=batch, rng=draws,
        )
    if jvp_method == "loop":
        recorded = record_forward(forward_fn, persistent=True)
        directions = sample_directions(variables, jl_projections, draws)
        clipped, norms, factors = loop_jl_clipped(recorded, variables, directions, l2_norm_clip, batch)
        clipped = plus_regularization(clipped, recorded, variables)
    else:
        recorded, norms = jl_norm_estimates(
            forward_fn, variables, jl_projections, rng=draws, jvp_method=jvp_method, model=model
        )
        factors = clip_factors(norms, l2_norm_clip, recorded.forward.per_example_losses)
        clipped = clipped_gradient(recorded, variables, factors, batch)
        if isinstance(recorded, TangentRecorded):  # two passes: were they one computation?
            clipped = gated(clipped, recorded.consistent(clipped, factors, batch))
    return release(
        clipped, recorded, norms, factors, l2_norm_clip=l2_norm_clip,
        noise_multiplier=noise_multiplier, expected_batch_size=batch, rng=draws,
    )


def layerwise_jl_gradient(
    forward_fn: ForwardFn,
    variables: Sequence[Any],
    model: Any,
    *,
    l2_norm_clip: float,
    noise_multiplier: float,
    jl_projections: int,
    expected_batch_size: int,
    rng: Any = None,
) -> PrivateGradient:
    """DP-SGD-JL with the projections and the clipped sum read from layer taps.

    One forward pass records, for every supported layer (Dense, Conv, Embedding, LSTM,
    GRU, SimpleRNN, also inside Bidirectional), its input a and the adjoint g of its
    pre-activation; one backward pass of sum_i l_i gives every g. Example i's gradient
    is then G_i = sum_n a_in^T g_in per layer, and

        P_ij = <G_i, v_j> = sum_layers sum_n (a_in V_j) . g_in

    is the jvp of l_i in direction v_j by the tangent-adjoint identity: a_in V_j is the
    tangent of the pre-activation, g_in its adjoint. No tangent travels through the
    network or a recurrence, so r directions cost r products with the layers' inputs.
    The released sum is sum_i c_i G_i / B from the same pieces: what is clipped is
    exactly what M_i estimates, whatever the model does.

    Every step checks that the taps saw every use of every weight
    (:func:`fdp_tf.layerwise.escaped_gradients_vanish`); if not, that step takes the
    projections of exact per-example gradients of a fresh pass (:func:`loop_jl_clipped`).
    A model the taps cannot handle warns and uses the double vjp.
    """
    batch = check_batch_size(expected_batch_size)
    draws = step_randomness(rng)
    # the whole of every variable is drawn, an embedding table too: drawing only the rows
    # the batch uses would give the same law, but which draw a row gets would depend on
    # the other examples, so removing one example would move the others' clipped terms
    # under the same randomness (the privacy fuzzer measured 0.87 C)
    directions = sample_directions(variables, jl_projections, draws)
    rewind = seed_rewind(model)  # a fresh pass below draws the masks of the first
    found = layerwise_pieces(forward_fn, variables, model, draws)
    if found.pieces is None and without_second_order(model) is not None:
        # nothing differentiates this backward pass (fdp_tf.second_order): exact projections
        rewind()
        clipped, norms, factors = loop_jl_clipped(record_forward(forward_fn, persistent=True), variables,
                                                  directions, l2_norm_clip, batch)
        return release(plus_regularization(clipped, found.recorded, variables), found.recorded, norms, factors,
                       l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier, expected_batch_size=batch,
                       rng=draws)
    if found.pieces is None:
        warnings.warn(
            f"jvp_method='layerwise' cannot handle this model ({found.reason}); computing "
            "the JL projections by the double vjp", RuntimeWarning, stacklevel=3,
        )
        projections = double_vjp_projections(found.recorded, variables, directions)
        norms = jl_norms(projections)
        factors = clip_factors(norms, l2_norm_clip, found.recorded.forward.per_example_losses)
        clipped = clipped_gradient(found.recorded, variables, factors, batch)
        return release(clipped, found.recorded, norms, factors, l2_norm_clip=l2_norm_clip,
                       noise_multiplier=noise_multiplier, expected_batch_size=batch, rng=draws)
    recorded, covered = found.recorded, found.covered
    losses = recorded.forward.per_example_losses

    def taps() -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        norms = jl_norms(layerwise_projections(found.pieces, variables, directions, losses))
        factors = clip_factors(norms, l2_norm_clip, losses)
        return reconstructed_sum(found.pieces, variables, factors / tf.cast(batch, factors.dtype)), norms, factors

    def fresh() -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        # the tapped pass read its weights as constants: per-example gradients need another
        rewind()
        return loop_jl_clipped(record_forward(forward_fn, persistent=True), variables, directions,
                               l2_norm_clip, batch)

    if tf.executing_eagerly():
        clipped, norms, factors = taps() if bool(covered) else fresh()
    else:
        clipped, norms, factors = tf.cond(covered, taps, fresh)
    return release(
        plus_regularization(clipped, recorded, variables), recorded, norms, factors,
        l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier, expected_batch_size=batch,
        rng=draws, fallbacks=tf.cast(tf.logical_not(covered), tf.int32),
    )


def loop_jl_clipped(
    recorded: RecordedForward, variables: Sequence[Any], directions: Sequence[tf.Tensor],
    l2_norm_clip: float, batch: int,
) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
    """(sum_i c_i g_i / B, M, c) with P_ij = <g_i, v_j> from exact per-example gradients,
    one backward pass per example (``jvp_method="loop"``): slow to run, quick to trace,
    exact through any model, the reference the other methods are checked against; the
    clipped terms are summed as they come (:func:`fdp_tf.per_example.streamed_clipped_sum`),
    so it holds one gradient, not b. The regularization is not included. The tape of
    ``recorded`` must be persistent."""
    flat = [tf.reshape(tf.cast(d, tf.float32), (tf.shape(d)[0], -1)) for d in directions]

    def estimate(gradient: list[tf.Tensor]) -> tf.Tensor:  # M_i from P_ij = <g_i, v_j>
        projections = tf.add_n([tf.linalg.matvec(d, tf.reshape(tf.cast(g, tf.float32), [-1]))
                                for g, d in zip(gradient, flat)])
        return jl_norms(projections[None])[0]

    return streamed_clipped_sum(recorded, variables, estimate, l2_norm_clip, batch)
