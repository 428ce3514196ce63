"""Clip factors, the clipped sum and its release with noise (seed, Algorithm 1, l. 12-14).

Notation::

    l_i   per-example loss (i = 1..b, b the realised batch size)
    M_i   JL estimate or exact value of ||grad l_i||_2
    c_i   min(1, C / M_i), and 0 for an example whose l_i or M_i is not finite
    B     the *expected* batch size of the Poisson sampling the accountant assumes
    g~    (1/B) sum_i c_i grad l_i + (sigma C / B) N(0, I_d)

B is never the realised batch size: with Poisson sampling at rate p = B / N, the
realised size is Binomial(N, p), and dividing by it would make the noise scale
depend on the data (smaller than sigma C / B for large batches).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from fdp._validation import check_integer
from fdp_tf.forward import ZERO, PrivateGradient, RecordedForward
from fdp_tf.randomness import add_gaussian_noise

__all__ = [
    "check_batch_size",
    "clip_factors",
    "clipped_gradient",
    "dropped_count",
    "plus_regularization",
    "regularization_gradient",
    "release",
]


def check_batch_size(value: object) -> int:
    """B, an integer >= 1; ``None`` is refused with what to do."""
    if value is None:
        raise ValueError(
            "expected_batch_size is None: the noise std sigma*C/B and the average need the "
            "expected batch size B of the Poisson sampling (B = sampling_rate * N), never the "
            "realised one. Pass expected_batch_size=B to the optimizer (or train with "
            "PrivateModel.fit on fdp_tf.poisson_batches(...), which sets it)."
        )
    return check_integer("expected_batch_size", value, low=1)


def clip_factors(norms: tf.Tensor, l2_norm_clip: float, losses: tf.Tensor | None = None) -> tf.Tensor:
    """c_i = min(1, C / M_i), written C / max(M_i, C) so that M_i = 0 gives 1.

    An example whose norm (or loss, when given) is NaN or infinite gets c_i = 0: it is
    dropped from the sum instead of turning the whole update into NaN. The decision
    depends on that example alone, so dropping it is a clipping to norm 0.
    """
    norms = tf.convert_to_tensor(norms)
    clip = clip_constant(l2_norm_clip, norms.dtype)
    finite = tf.math.is_finite(norms)
    if losses is not None:
        finite = tf.logical_and(finite, tf.math.is_finite(tf.cast(losses, norms.dtype)))
    safe = tf.where(finite, norms, tf.zeros_like(norms))
    return tf.where(finite, clip / tf.maximum(safe, clip), tf.zeros_like(norms))


def clip_constant(l2_norm_clip: Any, dtype: tf.DType) -> tf.Tensor:
    """C in ``dtype``, rounded down: the largest value of the dtype not above C (a Python
    float went through float32 before, so a float64 model clipped at C (1 + 1.5e-8))."""
    if isinstance(l2_norm_clip, (int, float)):
        kind = tf.as_dtype(dtype).as_numpy_dtype
        value = kind(l2_norm_clip)
        if float(value) > float(l2_norm_clip):
            value = np.nextafter(value, kind(0))
        return tf.constant(value, dtype)
    return tf.cast(l2_norm_clip, dtype)


def dropped_count(norms: tf.Tensor, losses: tf.Tensor) -> tf.Tensor:
    """Number of examples dropped because their loss or norm was not finite (int32)."""
    bad = tf.logical_not(
        tf.logical_and(tf.math.is_finite(norms), tf.math.is_finite(tf.cast(losses, norms.dtype)))
    )
    return tf.reduce_sum(tf.cast(bad, tf.int32))


def clipped_gradient(
    recorded: RecordedForward,
    variables: Sequence[Any],
    factors: tf.Tensor,
    batch_size: tf.Tensor | float,
) -> list[tf.Tensor]:
    """(1/B) sum_i c_i g_i (+ grad of the regularization), one backward pass.

    This is grad_theta L~ for L~ = (1/B) sum_i c_i l_i with c held fixed
    (Alg. 1, line 13), computed as a vjp with ``output_gradients = c / B``.
    """
    forward = recorded.forward
    losses = forward.per_example_losses
    weights = tf.cast(factors, losses.dtype) / tf.cast(batch_size, losses.dtype)
    targets: list[tf.Tensor] = [losses]
    cotangents: list[tf.Tensor] = [tf.stop_gradient(weights)]
    if forward.regularization is not None:
        targets.append(forward.regularization)
        cotangents.append(tf.ones_like(forward.regularization))
    grads = recorded.tape.gradient(
        targets, list(variables), output_gradients=cotangents, unconnected_gradients=ZERO
    )
    return [tf.convert_to_tensor(g) for g in grads]


def regularization_gradient(recorded: RecordedForward, variables: Sequence[Any]) -> list[Any]:
    """Gradient of the data-independent regularization (``None`` where a variable has none)."""
    reg = recorded.forward.regularization
    if reg is None:
        return [None] * len(variables)
    # not every variable is regularised; TF cannot zero-fill Keras variables (string dtype)
    return list(recorded.tape.gradient(reg, list(variables)))


def plus_regularization(grads: Sequence[tf.Tensor], recorded: RecordedForward,
                        variables: Sequence[Any]) -> list[tf.Tensor]:
    """``grads`` plus the unclipped gradient of the data-independent regularization."""
    reg = regularization_gradient(recorded, variables)
    return [g if rg is None else g + tf.cast(tf.convert_to_tensor(rg), g.dtype)
            for g, rg in zip(grads, reg)]


def release(
    clipped: Sequence[tf.Tensor],
    recorded: RecordedForward,
    norms: tf.Tensor,
    factors: tf.Tensor,
    *,
    l2_norm_clip: float,
    noise_multiplier: float,
    expected_batch_size: int,
    rng: Any,
    fallbacks: tf.Tensor | None = None,
) -> PrivateGradient:
    """g~ = clipped sum / B + N(0, (sigma C / B)^2 I): what leaves the private step."""
    losses = recorded.forward.per_example_losses
    grads = list(clipped)
    if noise_multiplier > 0:
        grads = add_gaussian_noise(grads, noise_multiplier * l2_norm_clip / expected_batch_size, rng)
    return PrivateGradient(
        grads, recorded.forward, norms, factors, dropped_count(norms, losses), fallbacks
    )
