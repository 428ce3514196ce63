"""Clipped, noised gradients: JL norm estimates (DP-SGD-JL) and exact norms (DP-SGD).

Everything here is a pure TensorFlow function of a *forward function* and a list
of variables, usable inside ``tf.function`` and from any training loop; the
optimizers in :mod:`fdp_tf.optimizers` and :class:`fdp_tf.PrivateModel` are thin
wrappers around :func:`jl_private_gradient` and :func:`vanilla_private_gradient`.

Reference: Bu, Gopi, Kulkarni, Lee, Shen, Tantipongpipat, "Fast and Memory
Efficient Differentially Private-SGD via JL Projections", arXiv:2102.03013v1,
Algorithm 1 (DP-SGD-JL), Algorithm 3 (DP-Adam-JL), Algorithm 4 (DP-SGD).

Notation::

    l_i      per-example loss of example i in the batch (i = 1..b, b realised size)
    g_i      grad_theta l_i, the per-example gradient
    v_j      j-th JL direction, v_j ~ N(0, I_d), same shapes as the variables
    P_ij     <g_i, v_j>, the JL projections                     (Alg. 1, line 7)
    M_i      sqrt( sum_j P_ij^2 / r ), estimate of ||g_i||_2    (Alg. 1, line 10)
    c_i      min(1, C / M_i), the clip factor
    B        expected batch size (averaging constant)
    g~       (1/B) sum_i c_i g_i + (sigma C / B) N(0, I_d)      (Alg. 1, line 14)

The clipped sum is the gradient of the scaled loss
``L~(theta) = (1/B) sum_i c_i l_i(theta)`` with the c_i held fixed, i.e. one
vector-Jacobian product with ``output_gradients = c / B`` on the tape that
recorded the forward pass. Because the projections are read from the *same*
recorded forward pass (same dropout masks, same batch-norm statistics), the
M_i estimate the norm of exactly the gradient that gets clipped; the privacy
proof (seed, Lemma "subroutine privacy") needs that.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union

import keras
import numpy as np
import tensorflow as tf

__all__ = [
    "ForwardPass",
    "PrivateGradient",
    "RecordedForward",
    "SeedLike",
    "clip_factors",
    "jl_norms",
    "sample_directions",
    "record_forward",
    "forward_mode_projections",
    "double_vjp_projections",
    "jl_norm_estimates",
    "clipped_gradient",
    "add_gaussian_noise",
    "per_example_gradients",
    "per_example_norms",
    "jl_private_gradient",
    "vanilla_private_gradient",
    "layerwise_norms",
    "layerwise_unsupported",
]

SeedLike = Union[int, keras.random.SeedGenerator, None]
_ZERO = tf.UnconnectedGradients.ZERO


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
      clip_factors: c_i = min(1, C / M_i), shape ``[b]``.
    """

    gradients: list[tf.Tensor]
    forward: ForwardPass
    norms: tf.Tensor
    clip_factors: tf.Tensor


ForwardFn = Callable[[], ForwardPass]


def clip_factors(norms: tf.Tensor, l2_norm_clip: float) -> tf.Tensor:
    """c_i = min(1, C / M_i), written C / max(M_i, C) so that M_i = 0 gives 1."""
    norms = tf.convert_to_tensor(norms)
    clip = tf.cast(l2_norm_clip, norms.dtype)
    return clip / tf.maximum(norms, clip)


def jl_norms(projections: tf.Tensor) -> tf.Tensor:
    """M_i = sqrt( (1/r) sum_j P_ij^2 ) for projections of shape ``[b, r]``.

    Seed, Proposition "JL projections": M_i ~ ||g_i||_2 sqrt(chi2_r / r), so
    E[M_i^2] = ||g_i||^2.
    """
    return tf.sqrt(tf.reduce_mean(tf.square(projections), axis=1))


def sample_directions(
    variables: Sequence[Any], jl_projections: int, seed: SeedLike = None
) -> list[tf.Tensor]:
    """Draw v_1..v_r ~ N(0, I_d), returned per variable with a leading axis r.

    Returns:
      A list, one tensor of shape ``[r, *variable.shape]`` per variable.
    """
    return [
        keras.random.normal((jl_projections, *tuple(v.shape)), dtype=v.dtype, seed=s)
        for v, s in zip(variables, _draw_seeds(seed, len(variables), stream=0))
    ]


def _draw_seeds(seed: SeedLike, count: int, stream: int) -> list[Any]:
    """One seed per random draw. A ``SeedGenerator`` (or None) advances by itself; an int
    would give every draw the same numbers (equal noise on equally shaped variables, noise
    equal to a JL direction), so it is expanded into distinct ints per draw and per stream
    (0: JL directions, 1: noise)."""
    if seed is None or isinstance(seed, keras.random.SeedGenerator):
        return [seed] * count
    state = np.random.SeedSequence([int(seed), stream]).generate_state(max(count, 1))
    return [int(v) for v in state[:count]]


def _raw_variables(variables: Sequence[Any]) -> list[tf.Variable]:
    """The ``tf.Variable`` behind each Keras 3 variable (ForwardAccumulator needs it)."""
    return [v.value if isinstance(v, keras.Variable) else v for v in variables]


def record_forward(forward_fn: ForwardFn, *, persistent: bool = False) -> RecordedForward:
    """Run ``forward_fn`` once under a ``GradientTape``."""
    with tf.GradientTape(persistent=persistent) as tape:
        forward = forward_fn()
    _check_forward(forward)
    return RecordedForward(tape=tape, forward=forward)


def forward_mode_projections(
    forward_fn: ForwardFn, variables: Sequence[Any], directions: Sequence[tf.Tensor]
) -> RecordedForward:
    """One forward pass under a tape with r forward-mode accumulators active.

    P[:, j] = grad_theta F(theta) . v_j is read from accumulator j (seed,
    Section "Jacobian-vector product"); the same pass is recorded on the tape
    for the clipped backward pass. The accumulators are nested, so the traced
    graph grows quickly with r; use :func:`double_vjp_projections` for r > 2.
    Nested accumulators (r = 2) work only in graph mode (inside ``tf.function``).

    Forward mode cannot pass through Keras's ``tf.while_loop`` RNNs
    ("dtype variant is not compatible"); build them with ``unroll=True`` or use
    the double-vjp path.
    """
    raw = _raw_variables(variables)
    r = _num_directions(directions)
    if r > 1 and tf.executing_eagerly():
        raise ValueError(
            f"jvp_method='forward' with jl_projections={r} > 1 nests forward "
            "accumulators, which TensorFlow supports only inside tf.function (graph "
            "mode); run without run_eagerly=True, wrap the call in tf.function, or use "
            "jvp_method='double_vjp'."
        )
    with tf.GradientTape() as tape:
        with contextlib.ExitStack() as stack:
            accumulators = [
                stack.enter_context(
                    tf.autodiff.ForwardAccumulator(raw, [d[j] for d in directions])
                )
                for j in range(r)
            ]
            try:
                forward = forward_fn()
            except TypeError as err:
                if "variant" in str(err):
                    raise ValueError(
                        "jvp_method='forward' failed: forward-mode differentiation "
                        "cannot pass through a tf.while_loop (Keras RNN layers with "
                        "unroll=False). Build the RNN with unroll=True or use "
                        "jvp_method='double_vjp'."
                    ) from err
                raise
            _check_forward(forward)
            losses = forward.per_example_losses
            projections = tf.stack(
                [acc.jvp(losses, unconnected_gradients=_ZERO) for acc in accumulators],
                axis=1,
            )
    return RecordedForward(tape=tape, forward=forward, projections=projections)


def double_vjp_projections(
    recorded: RecordedForward, variables: Sequence[Any], directions: Sequence[tf.Tensor]
) -> tf.Tensor:
    """JL projections by the double-vjp trick on an already recorded forward pass.

    Seed, Section "Jacobian-vector product": with G(u) = u^T grad_theta F (one
    vjp, linear in u), grad_u <G(u), v_j> = grad_theta F . v_j = P[:, j].
    The r second vjps run in a ``tf.while_loop`` (``GradientTape.jacobian``
    without pfor), which traces fast and works through RNN loops. The tape of
    ``recorded`` must be persistent.

    Returns:
      P, shape ``[b, r]``.
    """
    losses = recorded.forward.per_example_losses
    u = tf.ones_like(losses)
    with tf.GradientTape(persistent=True) as outer:  # eager jacobian without pfor needs it
        outer.watch(u)
        vjp = recorded.tape.gradient(
            losses, list(variables), output_gradients=u, unconnected_gradients=_ZERO
        )
        inner = [
            tf.linalg.matvec(
                tf.reshape(d, (tf.shape(d)[0], -1)),
                tf.reshape(tf.convert_to_tensor(g), (-1,)),
            )
            for d, g in zip(directions, vjp)
        ]
        targets = tf.add_n(inner)  # [r]: <G(u), v_j>
    # one iteration at a time: running the r second vjps concurrently kept r copies of
    # the backward pass's intermediates alive (peak memory grew with r)
    jac = outer.jacobian(targets, u, unconnected_gradients=_ZERO, experimental_use_pfor=False,
                         parallel_iterations=1)
    return tf.transpose(jac)


def jl_norm_estimates(
    forward_fn: ForwardFn,
    variables: Sequence[Any],
    jl_projections: int,
    *,
    seed: SeedLike = None,
    jvp_method: str = "forward",
    directions: Sequence[tf.Tensor] | None = None,
) -> tuple[RecordedForward, tf.Tensor]:
    """Record one forward pass and estimate every ||g_i|| by M_i (Alg. 1, l. 6-11).

    Args:
      forward_fn: runs the model on the batch and returns a :class:`ForwardPass`.
      variables: the trainable variables theta.
      jl_projections: r.
      seed: seed or ``keras.random.SeedGenerator`` for the directions.
      jvp_method: ``"forward"`` or ``"double_vjp"``.
      directions: fixed directions (list of ``[r, *shape]``), for tests.

    Returns:
      ``(recorded, M)`` with the recorded pass (tape persistent for the
      double-vjp path) and M of shape ``[b]``.
    """
    if directions is None:
        directions = sample_directions(variables, jl_projections, seed)
    if jvp_method == "forward":
        recorded = forward_mode_projections(forward_fn, variables, directions)
    elif jvp_method == "double_vjp":
        recorded = record_forward(forward_fn, persistent=True)
        recorded = RecordedForward(
            recorded.tape,
            recorded.forward,
            double_vjp_projections(recorded, variables, directions),
        )
    else:
        raise ValueError(f"jvp_method must be 'forward' or 'double_vjp'; got {jvp_method!r}")
    return recorded, jl_norms(recorded.projections)


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
        targets, list(variables), output_gradients=cotangents, unconnected_gradients=_ZERO
    )
    return [tf.convert_to_tensor(g) for g in grads]


def add_gaussian_noise(
    gradients: Sequence[tf.Tensor], stddev: tf.Tensor | float, seed: SeedLike = None
) -> list[tf.Tensor]:
    """g + stddev * N(0, I) per tensor; stddev = sigma C / B (Alg. 1, line 14)."""
    return [
        g + keras.random.normal(tuple(g.shape), stddev=1.0, dtype=g.dtype, seed=s)
        * tf.cast(stddev, g.dtype)
        for g, s in zip(gradients, _draw_seeds(seed, len(gradients), stream=1))
    ]


def per_example_gradients(
    recorded: RecordedForward, variables: Sequence[Any], *, vectorized: bool = True
) -> list[tf.Tensor]:
    """Exact g_1..g_b per variable, each of shape ``[b, *variable.shape]``.

    ``GradientTape.jacobian`` of the per-example losses on one recorded pass;
    ``vectorized=True`` uses pfor (fast, b-fold memory), ``False`` a
    ``tf.while_loop`` with one backward pass per example. The tape must be
    persistent. Cross-example couplings (batch normalisation in training mode)
    enter the "per-example" gradient; DP needs models without them.
    """
    losses = recorded.forward.per_example_losses
    if vectorized:
        try:
            jac = recorded.tape.jacobian(
                losses, list(variables), unconnected_gradients=_ZERO, experimental_use_pfor=True
            )
        except (ValueError, TypeError, NotImplementedError) as err:
            warnings.warn(
                f"vectorized per-example gradients failed ({type(err).__name__}: {err}); "
                "falling back to one backward pass per example",
                RuntimeWarning,
                stacklevel=2,
            )
            return per_example_gradients(recorded, variables, vectorized=False)
    else:
        jac = recorded.tape.jacobian(
            losses, list(variables), unconnected_gradients=_ZERO, experimental_use_pfor=False
        )
    return [tf.convert_to_tensor(j) for j in jac]


def per_example_norms(per_example: Sequence[tf.Tensor]) -> tf.Tensor:
    """||g_i||_2 over all variables, from :func:`per_example_gradients`."""
    squares = [
        tf.reduce_sum(tf.reshape(tf.square(g), (tf.shape(g)[0], -1)), axis=1) for g in per_example
    ]
    return tf.sqrt(tf.add_n(squares))


def _resolve_batch_size(losses: tf.Tensor, batch_size: int | None) -> tf.Tensor:
    if batch_size is None:
        return tf.cast(tf.shape(losses)[0], losses.dtype)
    return tf.constant(float(batch_size), dtype=losses.dtype)


def jl_private_gradient(
    forward_fn: ForwardFn,
    variables: Sequence[Any],
    *,
    l2_norm_clip: float,
    noise_multiplier: float,
    jl_projections: int,
    batch_size: int | None = None,
    seed: SeedLike = None,
    jvp_method: str = "forward",
) -> PrivateGradient:
    """One DP-SGD-JL gradient (seed, Algorithm 1, lines 5-14).

        v_1..v_r ~ N(0, I_d)
        P_ij = <grad l_i, v_j>                   (forward-mode jvp or double vjp)
        M_i  = sqrt( sum_j P_ij^2 / r )
        g~   = grad (1/B) sum_i min(1, C/M_i) l_i  +  (sigma C / B) N(0, I_d)

    Args:
      forward_fn: runs the model once and returns a :class:`ForwardPass`.
      variables: trainable variables.
      l2_norm_clip: C.
      noise_multiplier: sigma.
      jl_projections: r.
      batch_size: B, the *expected* batch size under Poisson sampling;
        ``None`` uses the realised batch size (fixed-size batches).
      seed: int or ``keras.random.SeedGenerator`` for directions and noise.
      jvp_method: ``"forward"`` or ``"double_vjp"``.
    """
    recorded, norms = jl_norm_estimates(
        forward_fn, variables, jl_projections, seed=seed, jvp_method=jvp_method
    )
    return _finish(recorded, variables, norms, l2_norm_clip, noise_multiplier, batch_size, seed)


def vanilla_private_gradient(
    forward_fn: ForwardFn,
    variables: Sequence[Any],
    *,
    l2_norm_clip: float,
    noise_multiplier: float,
    batch_size: int | None = None,
    seed: SeedLike = None,
    vectorized: bool = True,
    per_example_method: str | None = None,
    model: Any = None,
) -> PrivateGradient:
    """One DP-SGD gradient with exact per-example clipping (seed, Algorithm 4).

        g^_i = min(1, C / ||g_i||) g_i
        g~   = (1/B) sum_i g^_i + (sigma C / B) N(0, I_d)

    Args:
      per_example_method: ``"layerwise"`` (exact ||g_i|| layer by layer from activations
        and backpropagated gradients, then one backward pass of (1/B) sum_i c_i l_i; needs
        ``model``), ``"vectorized"`` (``GradientTape.jacobian`` with pfor) or ``"loop"``
        (one backward pass per example). ``None``: ``"vectorized"`` if ``vectorized``
        else ``"loop"``. If ``"layerwise"`` meets a layer it cannot handle, it warns and
        computes the per-example gradients on the same recorded pass (pfor, or the loop
        when the model has a looped RNN).
      model: the Keras model run by ``forward_fn`` (for ``"layerwise"``).
    """
    method = per_example_method or ("vectorized" if vectorized else "loop")
    if method not in ("layerwise", "vectorized", "loop"):
        raise ValueError(
            f"per_example_method must be 'layerwise', 'vectorized' or 'loop'; got {method!r}"
        )
    if method == "layerwise":
        if model is None:
            raise ValueError("per_example_method='layerwise' needs the model (model=...)")
        recorded, norms, reason = layerwise_norms(forward_fn, variables, model)
        if norms is not None:
            return _finish(
                recorded, variables, norms, l2_norm_clip, noise_multiplier, batch_size, seed
            )
        from fdp_tf.introspection import looped_rnn_layers

        vectorized = not looped_rnn_layers(model)
        warnings.warn(
            f"per_example_method='layerwise' cannot handle this model ({reason}); computing "
            f"per-example gradients with {'pfor' if vectorized else 'a per-example loop'}",
            RuntimeWarning,
            stacklevel=2,
        )
    else:
        vectorized = method == "vectorized"
        recorded = record_forward(forward_fn, persistent=True)
    per_example = per_example_gradients(recorded, variables, vectorized=vectorized)
    norms = per_example_norms(per_example)
    losses = recorded.forward.per_example_losses
    factors = clip_factors(norms, l2_norm_clip)
    weights = factors / _resolve_batch_size(losses, batch_size)
    grads = [tf.tensordot(tf.cast(weights, g.dtype), g, axes=1) for g in per_example]
    reg = recorded.forward.regularization
    if reg is not None:
        # not every variable is regularised; TF cannot zero-fill Keras variables (string dtype)
        reg_grads = recorded.tape.gradient(reg, list(variables))
        grads = [g if rg is None else g + tf.convert_to_tensor(rg) for g, rg in zip(grads, reg_grads)]
    stddev = noise_multiplier * l2_norm_clip / _resolve_batch_size(losses, batch_size)
    if noise_multiplier > 0:
        grads = add_gaussian_noise(grads, stddev, seed)
    return PrivateGradient(grads, recorded.forward, norms, factors)


def _finish(
    recorded: RecordedForward,
    variables: Sequence[Any],
    norms: tf.Tensor,
    l2_norm_clip: float,
    noise_multiplier: float,
    batch_size: int | None,
    seed: SeedLike,
) -> PrivateGradient:
    losses = recorded.forward.per_example_losses
    size = _resolve_batch_size(losses, batch_size)
    factors = clip_factors(norms, l2_norm_clip)
    grads = clipped_gradient(recorded, variables, factors, size)
    if noise_multiplier > 0:
        grads = add_gaussian_noise(grads, noise_multiplier * l2_norm_clip / size, seed)
    return PrivateGradient(grads, recorded.forward, norms, factors)


def _num_directions(directions: Sequence[tf.Tensor]) -> int:
    r = directions[0].shape[0]
    if r is None:
        raise ValueError("the number of JL directions must be known when tracing")
    return int(r)


def _check_forward(forward: ForwardPass) -> None:
    if not isinstance(forward, ForwardPass):
        raise TypeError(
            f"forward_fn must return fdp_tf.ForwardPass; got {type(forward).__name__}"
        )
    if forward.per_example_losses.shape.rank != 1:
        raise ValueError(
            "ForwardPass.per_example_losses must have shape [batch]; got shape "
            f"{forward.per_example_losses.shape}"
        )


# -- exact per-example norms layer by layer ("layerwise") ---------------------------------
#
# For a layer whose per-example gradient is a sum of outer products, g_i = sum_n A_in^T B_in
# with A the layer's input (or recurrent state) and B the gradient of the loss with respect to
# its pre-activation, ||g_i||_F^2 can be computed from A and B without materialising the
# b per-example gradients of the whole model (Goodfellow 2015, "Efficient per-example
# gradient computations"; Lee & Kifer 2021; Li et al. 2022, "ghost clipping"). One backward
# pass on the recorded tape gives B for every layer at once (example i's loss depends only on
# example i's activations); the clipped sum is then one more backward pass of
# (1/B) sum_i c_i l_i on the same tape, so norms and clipped gradient come from one forward
# pass. Recurrent layers (LSTM, GRU, SimpleRNN) are run, for the recorded pass only, by an
# equivalent implementation that computes the input projection X = x W + b outside the time
# loop: dL/dX_t is then the gate pre-activation gradient of every step, and the recurrent
# kernel's per-example gradient is sum_t h_{t-1}^T dX_t.
#
# Assumption (checked as far as possible): every trainable variable is read only by the layer
# that owns it (no weight tying through another layer's call), and examples do not interact
# (no batch normalisation in training mode), as for every exact per-example method.


def _layer_has_plain_call(layer: Any, cls: type) -> bool:
    return (
        type(layer).call is cls.call
        and getattr(layer, "_remat_mode", None) is None
        and getattr(layer, "quantization_mode", None) is None
        and not getattr(layer, "lora_enabled", False)
    )


def _owned(layer: Any, names: Sequence[str]) -> list[Any] | None:
    """The layer's variables ``names`` if they are all its trainable variables."""
    owned = [getattr(layer, n, None) for n in names]
    owned = [v for v in owned if v is not None]
    trainable = {id(v) for v in layer.trainable_variables}
    if not trainable <= {id(v) for v in owned}:
        return None  # e.g. LoRA factors: not handled
    return owned


def _tap_kind(layer: Any) -> tuple[str, list[Any]] | None:
    """(kind, owned variables) for a supported leaf layer, else ``None``."""
    L = keras.layers
    if isinstance(layer, L.Dense) and _layer_has_plain_call(layer, L.Dense):
        owned = _owned(layer, ["_kernel", "bias"])
        return ("dense", owned) if owned is not None else None
    if isinstance(layer, L.Embedding) and _layer_has_plain_call(layer, L.Embedding):
        owned = _owned(layer, ["_embeddings"]) if hasattr(layer, "_embeddings") else _owned(layer, ["embeddings"])
        return ("embedding", owned) if owned is not None else None
    for cls, kind, paddings in ((L.Conv2D, "conv2d", ("valid", "same")),
                                (L.Conv1D, "conv1d", ("valid", "same", "causal"))):
        if (
            type(layer) is cls
            and _layer_has_plain_call(layer, cls)
            and layer.data_format == "channels_last"
            and getattr(layer, "groups", 1) == 1
            and layer.padding in paddings
        ):
            owned = _owned(layer, ["_kernel", "bias"])
            return (kind, owned) if owned is not None else None
    for cls, cell_cls, kind in (
        (L.LSTM, L.LSTMCell, "lstm"),
        (L.GRU, L.GRUCell, "gru"),
        (L.SimpleRNN, L.SimpleRNNCell, "simple_rnn"),
    ):
        if type(layer) is cls and type(layer.cell) is cell_cls:
            cell = layer.cell
            if (
                layer.stateful
                or getattr(cell, "dropout", 0.0)
                or getattr(cell, "recurrent_dropout", 0.0)
                or getattr(cell, "_remat_mode", None) is not None
                or getattr(layer, "_remat_mode", None) is not None
            ):
                return None
            names = ["kernel", "recurrent_kernel", "bias"]
            owned = [getattr(cell, n) for n in names if getattr(cell, n, None) is not None]
            if {id(v) for v in layer.trainable_variables} - {id(v) for v in owned}:
                return None
            return kind, owned
    return None


def layerwise_unsupported(model: Any, variables: Sequence[Any] | None = None) -> str | None:
    """Why ``per_example_method="layerwise"`` cannot handle ``model``, or ``None`` if it can.

    Supported: ``Dense``, ``Embedding``, ``Conv1D`` / ``Conv2D`` (channels-last, no groups),
    ``LSTM`` / ``GRU`` / ``SimpleRNN`` without internal dropout and not stateful (also inside
    ``Bidirectional``); layers without trainable variables (pooling, dropout, flatten,
    activations, ...) may appear anywhere. Every trainable variable must belong to a
    supported layer, and the model must be Sequential or functional (not subclassed) with no
    Lambda layers: a variable read outside its own layer's call (tied weights) would escape
    the taps and its norm would come out too small.
    """
    from fdp_tf.introspection import iter_layers

    if model is None:
        return "no model given"
    variables = list(model.trainable_variables if variables is None else variables)
    covered: set[int] = set()
    unsupported: list[str] = []
    from fdp_tf.model import PrivateModel

    for layer in iter_layers(model):
        if isinstance(layer, keras.layers.Wrapper) and not isinstance(layer, keras.layers.Bidirectional):
            # e.g. TimeDistributed folds time into the batch: its inner layer would see
            # b*T rows, not b examples
            unsupported.append(f"wrapper {type(layer).__name__} ({layer.name!r})")
            continue
        kind = _tap_kind(layer)
        if kind is not None:
            covered.update(id(v) for v in kind[1])
            continue
        # The taps see a variable only where its own layer's call reads it. Code that
        # may read weights elsewhere (tied weights: a subclassed model's call, a Lambda,
        # an unknown layer holding variables) would make the norms too small.
        if isinstance(layer, keras.Model):
            if type(layer) not in (keras.Sequential, PrivateModel, _functional_class()):
                unsupported.append(f"subclassed model {type(layer).__name__} ({layer.name!r})")
        elif isinstance(layer, keras.layers.Lambda):
            unsupported.append(f"Lambda layer {layer.name!r}")
        elif layer.trainable_variables and not isinstance(layer, keras.layers.Bidirectional):
            unsupported.append(f"layer {type(layer).__name__} ({layer.name!r})")
    missing = [v for v in variables if id(v) not in covered]
    if missing:
        names = ", ".join(getattr(v, "path", getattr(v, "name", "?")) for v in missing[:4])
        unsupported.append(f"variables not owned by a supported layer: {names}")
    return "; ".join(unsupported) or None


def _functional_class() -> type:
    """The class of models built with keras.Model(inputs, outputs): their call only runs
    their layers."""
    from keras.src.models.functional import Functional

    return Functional


def _flatten_middle(t: tf.Tensor) -> tf.Tensor:
    """[b, ..., k] -> [b, n, k]."""
    shape = tf.shape(t)
    return tf.reshape(t, tf.stack([shape[0], -1, shape[-1]]))


def _sum_outer_sq(a: tf.Tensor, g: tf.Tensor) -> tf.Tensor:
    """||sum_n a_in^T g_in||_F^2 for a: [b, n, p], g: [b, n, q]; exact, shape [b].

    Materialises the [b, p, q] per-example gradients or uses the Gram form
    sum_{n,m} (a_n . a_m)(g_n . g_m), whichever costs fewer multiplications.
    """
    n = a.shape[1]
    p, q = a.shape[-1], g.shape[-1]
    if n == 1:
        return tf.reduce_sum(tf.square(a), axis=[1, 2]) * tf.reduce_sum(tf.square(g), axis=[1, 2])
    if n is not None and p is not None and q is not None and n * (p + q) < p * q:
        gram_a = tf.linalg.matmul(a, a, transpose_b=True)
        gram_g = tf.linalg.matmul(g, g, transpose_b=True)
        return tf.reduce_sum(gram_a * gram_g, axis=[1, 2])
    per_example = tf.linalg.matmul(a, g, transpose_a=True)  # [b, p, q]
    return tf.reduce_sum(tf.square(per_example), axis=[1, 2])


def _sq_rows(t: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(tf.reshape(tf.square(t), (tf.shape(t)[0], -1)), axis=1)


class _Tap:
    """One call of a supported layer in the recorded pass."""

    def __init__(self, kind: str, layer: Any, owned: list[Any]) -> None:
        self.kind, self.layer, self.owned = kind, layer, owned
        self.values: dict[str, tf.Tensor] = {}
        self.target: tf.Tensor | None = None  # the tensor whose gradient is needed

    def squared_norms(self, grad: tf.Tensor, wanted: set[int]) -> tf.Tensor | None:
        """sum over the owned variables in ``wanted`` of ||g_i(var)||^2, shape [b]."""
        layer, v = self.layer, self.values
        parts: list[tf.Tensor] = []

        def want(var: Any) -> bool:
            return var is not None and id(var) in wanted

        if self.kind == "dense":
            a, g = _flatten_middle(v["inputs"]), _flatten_middle(grad)
            if want(layer._kernel):
                parts.append(_sum_outer_sq(tf.cast(a, g.dtype), g))
            if want(layer.bias):
                parts.append(_sq_rows(tf.reduce_sum(g, axis=1)))
        elif self.kind == "conv2d":
            kh, kw = layer.kernel_size
            sh, sw = layer.strides
            dh, dw = layer.dilation_rate
            g = _flatten_middle(grad)
            if want(layer._kernel):
                patches = tf.image.extract_patches(
                    tf.cast(v["inputs"], grad.dtype), sizes=[1, kh, kw, 1], strides=[1, sh, sw, 1],
                    rates=[1, dh, dw, 1], padding=layer.padding.upper(),
                )
                parts.append(_sum_outer_sq(_flatten_middle(patches), g))
            if want(layer.bias):
                parts.append(_sq_rows(tf.reduce_sum(g, axis=1)))
        elif self.kind == "conv1d":  # as a conv2d of height 1; causal = left padding, then valid
            (k,), (stride,), (dilation,) = layer.kernel_size, layer.strides, layer.dilation_rate
            g = _flatten_middle(grad)
            if want(layer._kernel):
                x = tf.cast(v["inputs"], grad.dtype)
                padding = layer.padding.upper()
                if layer.padding == "causal":
                    x = tf.pad(x, [[0, 0], [dilation * (k - 1), 0], [0, 0]])
                    padding = "VALID"
                patches = tf.image.extract_patches(
                    x[:, None, :, :], sizes=[1, 1, k, 1], strides=[1, 1, stride, 1],
                    rates=[1, 1, dilation, 1], padding=padding,
                )
                parts.append(_sum_outer_sq(_flatten_middle(patches), g))
            if want(layer.bias):
                parts.append(_sq_rows(tf.reduce_sum(g, axis=1)))
        elif self.kind == "embedding":
            table = self.owned[0]
            if want(table):
                ids = tf.reshape(tf.cast(v["inputs"], tf.int64), (tf.shape(grad)[0], -1))
                g = _flatten_middle(grad)  # [b, n, d]
                b, n = tf.shape(ids)[0], tf.shape(ids)[1]
                rows = tf.constant(int(table.shape[0]), tf.int64)
                example = tf.repeat(tf.range(tf.cast(b, tf.int64)), n)
                keys = example * rows + tf.reshape(ids, (-1,))
                unique, index = tf.unique(keys)
                summed = tf.math.unsorted_segment_sum(
                    tf.reshape(g, (-1, tf.shape(g)[-1])), index, tf.shape(unique)[0]
                )
                parts.append(
                    tf.math.unsorted_segment_sum(
                        tf.reduce_sum(tf.square(summed), axis=1), tf.cast(unique // rows, tf.int32), b
                    )
                )
        else:  # recurrent: grad is dL/dX, X = x W + b in processing order, [b, T, G]
            cell = layer.cell
            x, h_prev = v["inputs"], v["h_prev"]
            if want(cell.kernel):
                parts.append(_sum_outer_sq(tf.cast(x, grad.dtype), grad))
            if self.kind == "gru":
                units = cell.units
                gz, gr, gh = tf.split(grad, 3, axis=-1)
                if cell.reset_after:
                    grad_rec = tf.concat([gz, gr, v["r"] * gh], axis=-1)
                    if want(cell.recurrent_kernel):
                        parts.append(_sum_outer_sq(h_prev, grad_rec))
                    if want(cell.bias):
                        parts.append(_sq_rows(tf.reduce_sum(grad, axis=1)))
                        parts.append(_sq_rows(tf.reduce_sum(grad_rec, axis=1)))
                else:
                    if want(cell.recurrent_kernel):
                        parts.append(_sum_outer_sq(h_prev, grad[..., : 2 * units]))
                        parts.append(_sum_outer_sq(v["r"] * h_prev, gh))
                    if want(cell.bias):
                        parts.append(_sq_rows(tf.reduce_sum(grad, axis=1)))
            else:
                if want(cell.recurrent_kernel):
                    parts.append(_sum_outer_sq(h_prev, grad))
                if want(cell.bias):
                    parts.append(_sq_rows(tf.reduce_sum(grad, axis=1)))
        return tf.add_n(parts) if parts else None


def _recurrent_forward(tap: _Tap, sequences: tf.Tensor, initial_state: Any, mask: Any) -> Any:
    """Keras LSTM / GRU / SimpleRNN ``call`` with the input projection outside the loop.

    Same equations, gate order, masking and output conventions as Keras 3's layers and
    ``backend.rnn`` (``go_backwards``, ``return_sequences``, ``return_state``,
    ``zero_output_for_mask``); records X, the inputs and the states h_{t-1} on ``tap``.
    """
    layer, cell, kind = tap.layer, tap.layer.cell, tap.kind
    dtype = layer.compute_dtype
    x = tf.cast(sequences, dtype)
    if layer.go_backwards:
        x = tf.reverse(x, axis=[1])
    kernel = tf.cast(tf.convert_to_tensor(cell.kernel), dtype)
    recurrent = tf.cast(tf.convert_to_tensor(cell.recurrent_kernel), dtype)
    bias = tf.cast(tf.convert_to_tensor(cell.bias), dtype) if cell.use_bias else None
    input_bias = recurrent_bias = None
    if bias is not None:
        if kind == "gru" and cell.reset_after:
            input_bias, recurrent_bias = bias[0], bias[1]
        else:
            input_bias = bias
    proj = tf.linalg.matmul(x, kernel)  # [b, T, G]
    if input_bias is not None:
        proj = proj + input_bias
    units = cell.units
    batch = tf.shape(x)[0]
    if initial_state is None:
        states = [tf.zeros((batch, units), dtype)] * (2 if kind == "lstm" else 1)
    else:
        states = [tf.cast(s, dtype) for s in tf.nest.flatten(initial_state)]
    h0 = states[0]
    c0 = states[1] if kind == "lstm" else tf.zeros_like(h0)
    if mask is not None:
        m = tf.cast(tf.nest.flatten(mask)[0], tf.bool)
        if layer.go_backwards:
            m = tf.reverse(m, axis=[1])
        m = tf.transpose(tf.reshape(m, (batch, -1)), [1, 0])[:, :, None]  # [T, b, 1]
    else:
        m = tf.ones((tf.shape(x)[1], batch, 1), tf.bool)
    act, ract = cell.activation, getattr(cell, "recurrent_activation", None)
    zero_output = bool(layer.zero_output_for_mask)

    def step(carry: tuple, elems: tuple) -> tuple:
        h, c, out, _h_prev, _r = carry
        x_t, m_t = elems
        r_aux = tf.zeros_like(h)
        if kind == "lstm":
            z = x_t + tf.linalg.matmul(h, recurrent)
            z0, z1, z2, z3 = tf.split(z, 4, axis=-1)
            i, f, o = ract(z0), ract(z1), ract(z3)
            c_new = f * c + i * act(z2)
            h_new = o * act(c_new)
        elif kind == "gru":
            xz, xr, xh = tf.split(x_t, 3, axis=-1)
            if cell.reset_after:
                inner = tf.linalg.matmul(h, recurrent)
                if recurrent_bias is not None:
                    inner = inner + recurrent_bias
                rz, rr, rh = tf.split(inner, 3, axis=-1)
                zg, r = ract(xz + rz), ract(xr + rr)
                hh = act(xh + r * rh)
            else:
                inner = tf.linalg.matmul(h, recurrent[:, : 2 * units])
                rz, rr = tf.split(inner, 2, axis=-1)
                zg, r = ract(xz + rz), ract(xr + rr)
                hh = act(xh + tf.linalg.matmul(r * h, recurrent[:, 2 * units :]))
            h_new = zg * h + (1 - zg) * hh
            c_new = c
            r_aux = r
        else:
            h_new = x_t + tf.linalg.matmul(h, recurrent)
            if act is not None:
                h_new = act(h_new)
            c_new = c
        out_new = tf.where(m_t, h_new, tf.zeros_like(h_new) if zero_output else out)
        h_next = tf.where(m_t, h_new, h)
        c_next = tf.where(m_t, c_new, c) if kind == "lstm" else c_new
        return h_next, c_next, out_new, h, r_aux

    init = (h0, c0, tf.zeros_like(h0), tf.zeros_like(h0), tf.zeros_like(h0))
    hs, cs, outs, h_prev, rs = tf.scan(
        step, (tf.transpose(proj, [1, 0, 2]), m), initializer=init
    )
    tap.values = {
        "inputs": x,
        "h_prev": tf.transpose(h_prev, [1, 0, 2]),
        "r": tf.transpose(rs, [1, 0, 2]),
    }
    tap.target = proj
    outputs = tf.transpose(outs, [1, 0, 2])
    output = outputs if layer.return_sequences else outs[-1]
    output = tf.cast(output, layer.compute_dtype)
    if layer.return_state:
        final = [hs[-1], cs[-1]] if kind == "lstm" else [hs[-1]]
        return (output, *final)
    return output


class _LayerTaps:
    """Context manager: while active, supported layers record what their norms need."""

    def __init__(self, model: Any, variables: Sequence[Any]) -> None:
        from fdp_tf.introspection import iter_layers

        self.variables = list(variables)
        wanted = {id(v) for v in self.variables}
        self.layers: list[tuple[Any, str, list[Any]]] = []
        for layer in iter_layers(model):
            kind = _tap_kind(layer)
            if kind is not None and any(id(v) in wanted for v in kind[1]):
                self.layers.append((layer, kind[0], kind[1]))
        self.taps: list[_Tap] = []
        self.failure: str | None = None
        self._saved: list[tuple[Any, Any]] = []

    def __enter__(self) -> "_LayerTaps":
        for layer, kind, owned in self.layers:
            self._saved.append((layer, layer.__dict__.get("call", _MISSING)))
            object.__setattr__(layer, "call", self._hook(layer, kind, owned, layer.call))
        return self

    def __exit__(self, *exc: Any) -> None:
        for layer, saved in reversed(self._saved):
            if saved is _MISSING:
                object.__delattr__(layer, "call")
            else:
                object.__setattr__(layer, "call", saved)
        self._saved = []

    def _hook(self, layer: Any, kind: str, owned: list[Any], original: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.failure is not None:
                return original(*args, **kwargs)
            if any(t.layer is layer for t in self.taps):
                self.failure = f"layer {layer.name!r} is called more than once"
                return original(*args, **kwargs)
            tap = _Tap(kind, layer, owned)
            if kind in ("dense", "conv2d", "conv1d"):
                activation = layer.activation
                object.__setattr__(layer, "activation", None)
                try:
                    pre = original(*args, **kwargs)
                finally:
                    object.__setattr__(layer, "activation", activation)
                tap.values = {"inputs": args[0] if args else kwargs["inputs"]}
                tap.target = pre
                self.taps.append(tap)
                return activation(pre) if activation is not None else pre
            if kind == "embedding":
                out = original(*args, **kwargs)
                tap.values = {"inputs": args[0] if args else kwargs["inputs"]}
                tap.target = out
                self.taps.append(tap)
                return out
            sequences = args[0] if args else kwargs.pop("sequences")
            rest = dict(zip(("initial_state", "mask", "training"), args[1:]))
            rest.update(kwargs)
            out = _recurrent_forward(tap, sequences, rest.get("initial_state"), rest.get("mask"))
            self.taps.append(tap)
            return out

        return call

    def squared_norms(self, recorded: RecordedForward) -> tf.Tensor | None:
        """sum over supported layers of ||g_i(layer)||^2, or ``None`` (then fall back)."""
        if self.failure is not None:
            return None
        wanted = {id(v) for v in self.variables}
        covered: set[int] = set()
        for tap in self.taps:
            covered.update(id(v) for v in tap.owned)
        # Owned variables of layers never called have zero gradient; anything else is missing.
        never_called = {id(v) for layer, _, owned in self.layers for v in owned
                        if not any(t.layer is layer for t in self.taps)}
        if wanted - covered - never_called:
            self.failure = "some trainable variables are not owned by a supported layer"
            return None
        losses = recorded.forward.per_example_losses
        if not self.taps:
            return tf.zeros_like(losses)
        grads = recorded.tape.gradient(
            losses, [t.target for t in self.taps], output_gradients=tf.ones_like(losses),
            unconnected_gradients=_ZERO,
        )
        parts = []
        for tap, grad in zip(self.taps, grads):
            part = tap.squared_norms(tf.convert_to_tensor(grad), wanted)
            if part is not None:
                # a layer that saw rows other than the b examples (batch folded with
                # another axis) would give wrong norms, and with b = 1 they would even
                # broadcast silently: refuse at run time
                tf.debugging.assert_equal(
                    tf.shape(part)[0], tf.shape(losses)[0],
                    message=f"per_example_method='layerwise': layer {tap.layer.name!r} did not "
                            "see one row per example; use per_example_method='vectorized'",
                )
                parts.append(tf.cast(part, losses.dtype))
        return tf.add_n(parts) if parts else tf.zeros_like(losses)


_MISSING = object()


def layerwise_norms(
    forward_fn: ForwardFn, variables: Sequence[Any], model: Any
) -> tuple[RecordedForward, tf.Tensor | None, str | None]:
    """Record one forward pass and compute the exact ||g_i|| layer by layer.

    Returns:
      ``(recorded, norms, reason)``: the recorded pass (persistent tape), the exact
      per-example gradient norms of shape ``[b]`` and ``None``; or norms ``None`` and the
      reason when the model cannot be handled this way (the caller falls back to
      :func:`per_example_gradients` on the same recorded pass).
    """
    reason = layerwise_unsupported(model, variables)
    if reason is not None:
        return record_forward(forward_fn, persistent=True), None, reason
    taps = _LayerTaps(model, variables)
    with taps:
        recorded = record_forward(forward_fn, persistent=True)
    squared = taps.squared_norms(recorded)
    if squared is None:
        return recorded, None, taps.failure
    return recorded, tf.sqrt(squared), None
