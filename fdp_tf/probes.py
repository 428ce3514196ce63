"""Per-example independence, verified at run time instead of assumed.

Per-example clipping bounds example i's contribution by C only if its loss l_i and
gradient g_i depend on example i alone, and if the per-example method computes g_i
(or <g_i, v>) correctly. Neither is known from the model's code: a built-in layer with
``axis=0``, ``keras.ops`` on the batch axis or a user's layer mixes rows, and pfor and
forward mode compute wrong per-example gradients through grouped convolutions. So on
the first step of every trace (:mod:`fdp_tf.verify` decides when) this module checks,
on that step's batch:

* **one loss per input row** (:func:`one_loss_per_row`, on every step);
* **row independence**: the batch is run again with some rows replaced by copies of
  others, and every kept row's *signature* s_i = (l_i, q_i) must not change. q_i is
  per-example gradient information: the exact norm ||g_i|| from the layer taps where
  they handle the model (first order: cheap to trace), else P_i = <g_i, v> for a
  fixed direction v by the double vjp (the one jvp that TensorFlow computes right
  through grouped convolutions and loops), or the exact ||g_i|| by the per-example
  loop where TensorFlow cannot differentiate the backward pass
  (:mod:`fdp_tf.second_order`). Both are computed row by row, so a row
  whose gradient is not finite does not spoil the others. For every bit k of the row
  index, rows with bit k = 0 are kept and the others replaced, then the reverse:
  every pair of rows differs in some bit, so every row is compared with every other
  row changed. With the reference and its repetition: 2 + 2 ceil(log2 b) passes.
* **the per-example method**: sum_i w_i g_i = grad sum_i w_i l_i with random weights
  w_i >= 1 (w = 1 is sum_i g_i = grad sum_i l_i; random weights also catch an error
  that cancels across rows), for pfor, the layer taps and the JL projections
  (sum_i w_i P_i = <grad sum_i w_i l_i, v>). The per-example loop is the reference.

Like with like: every pass has the batch's shape and starts from the same state of
every Keras ``SeedGenerator`` of the model, so dropout (and any ``keras.random`` draw)
gives each row position the same mask in every pass: a kept row sees exactly the
randomness it saw in the reference. The comparison therefore runs in training mode,
where a layer may behave differently (``training=False`` would miss a layer that mixes
rows only while training). Randomness drawn outside ``keras.random`` (e.g.
``tf.random.uniform``) cannot be replayed: the reference pass, repeated, differs, and
the step is refused saying so.

Rows whose loss or signature is not finite are left out of every pass (they are
dropped from the step, see :mod:`fdp_tf.nonfinite`). The probe's random direction and
weights come from a fixed public seed: they are not a privacy mechanism, and a model
written to defeat a known check is out of scope, as is one that mixes rows only on
rare inputs.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import tensorflow as tf

from fdp_tf.forward import ZERO, ForwardFn, ForwardPass, record_forward
from fdp_tf.introspection import looped_rnn_layers, seed_states
from fdp_tf.jl import jl_norm_estimates
from fdp_tf.layerwise import (
    layerwise_norms,
    layerwise_pieces,
    layerwise_projections,
    layerwise_unsupported,
    reconstructed_sum,
)
from fdp_tf.per_example import per_example_gradients
from fdp_tf.refusals import gated, refuse_unless
from fdp_tf.second_order import without_second_order

__all__ = [
    "ONE_LOSS_PER_ROW",
    "Verdict",
    "method_check",
    "one_loss_per_row",
    "probe",
    "seed_states",
    "signature_fn",
]

IndexForward = Callable[[tf.Tensor], ForwardPass]

#: Relative tolerance of a kept row's signature (same rows, same randomness: the
#: passes agree to round-off, a row-mixing layer changes them by far more).
ROW_RTOL = 1e-4
#: Relative tolerance of sum_i w_i g_i against the batch gradient (float32 sums of up
#: to millions of terms; the wrong methods it catches are off by tens of percent).
METHOD_RTOL = 1e-3
_SEED = (0x5EED, 0x0FD9)  # public: see the module docstring

ONE_LOSS_PER_ROW = (
    "the loss must have one entry per input row (shape (batch,)); this one has another "
    "number of entries, so it reduces or mixes over the batch axis and no example's "
    "contribution can be clipped. Return one value per example: a Keras loss with "
    "reduction=None, or a function that reduces every axis but the first"
)


def one_loss_per_row(losses: tf.Tensor, inputs: Any) -> tf.Tensor:
    """``losses``, refused unless it has one entry per row of ``inputs`` (every step).

    A static mismatch raises ``ValueError`` while tracing; a dynamic batch (Poisson
    batches) is checked in the graph, and the returned losses depend on the check, so
    nothing computed from them is released before it passed.
    """
    leaves = [t for t in tf.nest.flatten(inputs, expand_composites=False) if t is not None]
    if not leaves:
        return losses
    first = leaves[0]
    if isinstance(first, tf.RaggedTensor):
        rows, static = first.nrows(), first.shape[0]
    elif isinstance(first, tf.SparseTensor):
        rows, static = first.dense_shape[0], first.shape[0]
    else:
        first = tf.convert_to_tensor(first)
        rows, static = tf.shape(first)[0], first.shape[0]
    entries = losses.shape[0] if losses.shape.rank else None
    if static is not None and entries is not None:
        refuse_unless(static == entries, ONE_LOSS_PER_ROW + f" (got {entries} for {static} rows)")
        return losses
    return gated([losses], refuse_unless(tf.equal(tf.shape(losses, out_type=tf.int64)[0], tf.cast(rows, tf.int64)),
                                         ONE_LOSS_PER_ROW))[0]


class Signature(NamedTuple):
    losses: tf.Tensor  # [m]
    values: tf.Tensor  # [m, k]: per-example gradient information


class Verdict(NamedTuple):
    """What one probe found (boolean scalars)."""

    deterministic: tf.Tensor  # the reference pass repeated itself
    independent: tf.Tensor  # no kept row's signature changed
    method_ok: tf.Tensor  # the per-example method in use agreed with the batch gradient
    primary_ok: tf.Tensor  # the optimizer's first-choice method agreed
    complete: tf.Tensor  # independence was tested (at least two usable rows)

    @staticmethod
    def passed() -> "Verdict":
        yes = tf.constant(True)
        return Verdict(yes, yes, yes, yes, tf.constant(False))


def _direction(variables: Sequence[Any]) -> list[tf.Tensor]:
    """A fixed v ~ N(0, I), as JL directions with r = 1: ``[1, *shape]`` per variable."""
    return [tf.random.stateless_normal((1, *tuple(v.shape)), seed=[_SEED[0], _SEED[1] + k], dtype=v.dtype)
            for k, v in enumerate(variables)]


def _weights(losses: tf.Tensor) -> tf.Tensor:
    """w_i = 1 + |N(0, 1)|, one per row."""
    draw = tf.random.stateless_normal(tf.shape(losses), seed=[_SEED[1], _SEED[0]], dtype=losses.dtype)
    return tf.stop_gradient(1.0 + tf.abs(draw))


def signature_fn(variables: Sequence[Any], model: Any) -> Callable[[ForwardFn], Signature]:
    """s_i = (l_i, q_i) for a forward pass: q_i = ||g_i|| from the layer taps when they
    handle the model (first order, each row from its own activations), else
    P_i = <g_i, v> by the double vjp (also row by row), whatever the step's method, or
    where nothing can differentiate the backward pass (:mod:`fdp_tf.second_order`)
    ||g_i|| by the per-example loop (one backward pass per row).
    Both read the backward pass, which is what a step releases: a tangent pass would
    not see rows that interact only through their gradients (a custom gradient)."""
    direction = _direction(variables)
    taps = model is not None and layerwise_unsupported(model, variables) is None

    def signature(forward_fn: ForwardFn) -> Signature:
        if taps:
            found = layerwise_norms(forward_fn, variables, model, check=False)
            if found.norms is not None:
                return Signature(found.recorded.forward.per_example_losses, found.norms[:, None])
        if without_second_order(model) is not None:  # no double vjp: exact norms, one backward pass per row
            recorded = record_forward(forward_fn, persistent=True)
            per_example = per_example_gradients(recorded, variables, vectorized=False)
            squares = tf.add_n([tf.reduce_sum(tf.reshape(tf.square(tf.cast(g, tf.float64)), [tf.shape(g)[0], -1]),
                                              axis=1) for g in per_example])
            return Signature(recorded.forward.per_example_losses, tf.sqrt(squares)[:, None])
        recorded, _ = jl_norm_estimates(forward_fn, variables, 1, jvp_method="double_vjp", directions=direction)
        return Signature(recorded.forward.per_example_losses, recorded.projections)

    return signature


def _vectors_agree(mine: Sequence[Any], truth: Sequence[Any]) -> tf.Tensor:
    """||mine - truth|| <= METHOD_RTOL (||mine|| + ||truth||), over all variables."""
    diff = tf.zeros([], tf.float64)
    size = tf.zeros([], tf.float64)
    for a, b in zip(mine, truth):
        a, b = tf.cast(tf.convert_to_tensor(a), tf.float64), tf.cast(tf.convert_to_tensor(b), tf.float64)
        diff += tf.reduce_sum(tf.square(a - b))
        size += tf.reduce_sum(tf.square(a)) + tf.reduce_sum(tf.square(b))
    return tf.sqrt(diff) <= METHOD_RTOL * 2.0 * tf.sqrt(size) + 1e-30


def method_check(kind: str, method: str, variables: Sequence[Any], model: Any) -> Callable[[ForwardFn], tf.Tensor]:
    """A check of the per-example method on a forward pass: True when it agrees with the
    batch gradient (always for the per-example loop, the reference).

    Args:
      kind: ``"jl"`` or ``"exact"``.
      method: the jvp method (``"layerwise"``, ``"auto"`` = forward mode, ``"forward"``,
        ``"double_vjp"``)
        or the per-example method (``"layerwise"``, ``"vectorized"``, ``"loop"``).
    """
    variables = list(variables)
    direction = _direction(variables)

    def weighted_truth(recorded: Any, w: tf.Tensor) -> list[tf.Tensor]:
        losses = recorded.forward.per_example_losses
        return list(recorded.tape.gradient(losses, variables, output_gradients=w, unconnected_gradients=ZERO))

    def jl_layerwise(forward_fn: ForwardFn) -> tf.Tensor:
        # the projections are what the released pieces' norms are estimated from, so both
        # must hold: sum_i w_i P_i = <sum_i w_i G_i, v> (the projections are those of the
        # pieces) and the pieces plus the uses the taps did not see give the model's gradient
        found = layerwise_pieces(forward_fn, variables, model, check=False)
        if found.pieces is None:  # the step falls back to the double vjp, the reference
            return tf.constant(True)
        losses = found.recorded.forward.per_example_losses
        w = _weights(losses)
        projected = layerwise_projections(found.pieces, variables, direction, losses)[:, 0]
        mine = tf.reduce_sum(tf.cast(w * projected, tf.float64))
        scale = tf.reduce_sum(tf.abs(tf.cast(w * projected, tf.float64)))
        summed = reconstructed_sum(found.pieces, variables, w)
        of_sum = tf.add_n([tf.reduce_sum(tf.cast(g * d[0], tf.float64)) for g, d in zip(summed, direction)])
        consistent = tf.abs(mine - of_sum) <= METHOD_RTOL * (scale + tf.abs(of_sum)) + 1e-30
        escaped = found.recorded.tape.gradient(losses, variables, output_gradients=w)
        total = [t if e is None else t + tf.cast(tf.convert_to_tensor(e), t.dtype) for t, e in zip(summed, escaped)]
        return tf.logical_and(consistent, _vectors_agree(total, weighted_truth(record_forward(forward_fn), w)))

    def jl(forward_fn: ForwardFn) -> tf.Tensor:
        recorded, _ = jl_norm_estimates(forward_fn, variables, 1, jvp_method=method, directions=direction,
                                         model=model)
        w = _weights(recorded.forward.per_example_losses)
        mine = tf.reduce_sum(tf.cast(w * recorded.projections[:, 0], tf.float64))
        scale = tf.reduce_sum(tf.abs(tf.cast(w * recorded.projections[:, 0], tf.float64)))
        truth = tf.add_n([tf.reduce_sum(tf.cast(g * d[0], tf.float64))
                          for g, d in zip(weighted_truth(recorded, w), direction)])
        return tf.abs(mine - truth) <= METHOD_RTOL * (scale + tf.abs(truth)) + 1e-30

    def exact(forward_fn: ForwardFn) -> tf.Tensor:
        vectorized = method == "vectorized"
        if method == "layerwise":
            found = layerwise_norms(forward_fn, variables, model, check=False)
            if found.norms is not None:
                losses = found.recorded.forward.per_example_losses
                w = _weights(losses)
                # the taps' sum plus the uses they did not see (the per-step coverage check
                # handles those): together the model's gradient, if the taps are right
                escaped = found.recorded.tape.gradient(losses, variables, output_gradients=w)
                mine = [t if e is None else t + tf.cast(tf.convert_to_tensor(e), t.dtype)
                        for t, e in zip(reconstructed_sum(found.pieces, variables, w), escaped)]
                return _vectors_agree(mine, weighted_truth(record_forward(forward_fn), w))
            recorded = found.recorded  # the step falls back as vanilla_private_gradient does
            vectorized = not looped_rnn_layers(model)
        else:
            recorded = record_forward(forward_fn, persistent=True)
        if not vectorized:
            return tf.constant(True)
        w = _weights(recorded.forward.per_example_losses)
        per_example = per_example_gradients(recorded, variables, vectorized=True)
        mine = [tf.tensordot(tf.cast(w, g.dtype), g, axes=1) for g in per_example]
        return _vectors_agree(mine, weighted_truth(recorded, w))

    if kind == "jl":
        if method == "loop":  # exact per-example gradients: the reference
            return lambda forward_fn: tf.constant(True)
        return jl_layerwise if method == "layerwise" else jl
    if method == "loop":
        return lambda forward_fn: tf.constant(True)
    return exact


def _close(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """Row-wise agreement of two signatures' values, [m, k] -> [m]."""
    a, b = tf.cast(a, tf.float64), tf.cast(b, tf.float64)
    size = tf.reshape(tf.where(tf.math.is_finite(b), tf.abs(b), tf.zeros_like(b)), [-1])  # rows left out: NaN
    floor = 1e-6 * tf.reduce_max(tf.concat([size, tf.zeros([1], tf.float64)], 0))
    ok = tf.abs(a - b) <= ROW_RTOL * (tf.abs(a) + tf.abs(b)) + floor + 1e-30
    return tf.reduce_all(ok, axis=1)


def _same_rows(sig: Signature, ref: Signature) -> tf.Tensor:
    return tf.logical_and(_close(sig.losses[:, None], ref.losses[:, None]), _close(sig.values, ref.values))


def _bits(m: tf.Tensor) -> tf.Tensor:
    """ceil(log2 m) for m >= 1 (the bits of the row indices 0..m-1), 0 for m <= 1."""
    return tf.reduce_sum(tf.cast(tf.bitwise.right_shift(m - 1, tf.range(31)) > 0, tf.int32))


def probe(
    forward_fn: ForwardFn,
    forward_on_indices: IndexForward,
    signature: Callable[[ForwardFn], Signature],
    checks: Sequence[Callable[[ForwardFn], tf.Tensor]],
    seeds: Sequence[Any],
    *,
    check_primary: tf.Tensor,
    probing: Any = None,
) -> Verdict:
    """Run the independence probe and the method checks on one batch.

    Args:
      forward_fn: the step's training forward pass on its batch (b rows).
      forward_on_indices: the same on the batch whose row j is row ``indices[j]`` of the
        step's batch (checked to give one loss per index).
      signature: from :func:`signature_fn`.
      checks: :func:`method_check` of the first-choice method and, if any, of the
        method used when it fails.
      seeds: :func:`seed_states` of the model, reset before every pass.
      check_primary: False when the first-choice method already failed (it is not run).
      probing: a variable set to 1 just before the first choice's check runs and to 0 just
        after it: a crash inside TensorFlow leaves it at 1 (:mod:`fdp_tf.fallback`).
    """
    start = [tf.identity(tf.convert_to_tensor(s)) for s in seeds]

    def on(indices: tf.Tensor | None) -> ForwardFn:
        def run() -> ForwardPass:
            for s, value in zip(seeds, start):
                s.assign(value)
            if indices is None:
                return forward_fn()
            forward = forward_on_indices(indices)
            losses = forward.per_example_losses
            ok = refuse_unless(tf.equal(tf.shape(losses)[0], tf.size(indices)), ONE_LOSS_PER_ROW)
            return ForwardPass(gated([losses], ok)[0], forward.regularization, forward.outputs)

        return run

    ref = signature(on(None))
    b = tf.shape(ref.losses)[0]
    usable = tf.logical_and(tf.math.is_finite(ref.losses), tf.reduce_all(tf.math.is_finite(ref.values), axis=1))
    base = tf.boolean_mask(tf.range(b), usable)  # the method is checked where it can be
    m = tf.size(base)

    def run_check(check: Callable[[ForwardFn], tf.Tensor]) -> Callable[[], tf.Tensor]:
        return lambda: tf.convert_to_tensor(check(on(base)))

    def run_primary() -> tf.Tensor:
        if probing is None:
            return run_check(checks[0])()
        marked = probing.assign(1.0)
        with tf.control_dependencies(_graph_only([marked])):  # the check's ops run after the mark
            ok = run_check(checks[0])()
        with tf.control_dependencies(_graph_only([ok])):
            cleared = probing.assign(0.0)
        with tf.control_dependencies(_graph_only([cleared])):
            return tf.identity(ok)

    yes = tf.constant(True)
    # a first choice that already failed is not run again (pfor may crash): its fallback is
    check_primary = tf.convert_to_tensor(check_primary)
    primary_ok = tf.cond(tf.logical_and(m > 0, check_primary), run_primary, lambda: check_primary)
    method_ok = primary_ok
    if len(checks) > 1:
        method_ok = tf.cond(primary_ok, lambda: yes, lambda: tf.cond(m > 0, run_check(checks[1]), lambda: yes))

    # pass 0: the same rows again (the pass must repeat itself); then, for every bit of
    # the row index, the rows with that bit 0 kept and the others replaced, and the reverse
    passes = tf.where(b > 0, 1 + 2 * _bits(b), 0)

    def body(p: tf.Tensor, deterministic: tf.Tensor, independent: tf.Tensor) -> tuple[tf.Tensor, ...]:
        q = tf.maximum(p - 1, 0)
        bit, side = q // 2, q % 2
        i = tf.range(b)
        kept = tf.logical_or(tf.equal(p, 0), tf.equal(tf.bitwise.bitwise_and(tf.bitwise.right_shift(i, bit), 1), side))
        partner = tf.bitwise.bitwise_xor(i, tf.bitwise.left_shift(1, bit))  # on the kept side
        source = tf.where(kept, i, tf.where(partner < b, partner, side * tf.bitwise.left_shift(1, bit)))
        same = tf.reduce_all(tf.logical_or(tf.logical_not(tf.logical_and(kept, usable)),
                                           _same_rows(signature(on(source)), ref)))
        return (p + 1, tf.logical_and(deterministic, tf.logical_or(same, p > 0)),
                tf.logical_and(independent, tf.logical_or(same, tf.equal(p, 0))))

    _, deterministic, independent = tf.while_loop(
        lambda p, d, i: tf.logical_and(p < passes, tf.logical_and(d, i)), body, (tf.constant(0), yes, yes))
    for s, value in zip(seeds, start):  # the step's own pass draws what it would have drawn
        s.assign(value)
    return Verdict(deterministic, independent, method_ok, primary_ok, m >= 2)


def _graph_only(ops: list[Any]) -> list[Any]:
    """Control inputs in a graph; none eagerly (the ops ran in order)."""
    return [] if tf.executing_eagerly() else ops
