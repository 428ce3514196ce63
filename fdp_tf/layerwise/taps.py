"""Exact per-example norms layer by layer: taps on the recorded forward pass.

While a :class:`LayerTaps` is active, every supported layer records, during the one
recorded forward pass, what its per-example gradients are made of (its input and
the tensor whose gradient is its pre-activation gradient). One backward pass of
sum_i l_i to those tensors then gives, for every layer at once, the pieces of
:mod:`fdp_tf.layerwise.pieces` (example i's loss depends only on example i's
activations), hence the exact ||g_i||.

What is released is the tap reconstruction sum_i c_i G_i / B: each G_i is computed
from example i's activations alone and has exactly the norm that was clipped, so
every example's contribution is at most C whatever the model does. Whether the
reconstruction is the true clipped gradient is checked at every step, exactly: inside
the tapped calls the layers read their weights as constants (``tf.stop_gradient``),
so the tape's gradient of a variable holds only the uses the taps did *not* see (a
weight read outside its layer, e.g. tied weights through ``keras.ops``). It must be
zero (:func:`escaped_gradients_vanish`); otherwise the step is recomputed on a fresh
pass with exact per-example gradients (see :func:`fdp_tf.vanilla_private_gradient`).
The check costs the backward pass of the escaped uses only: nothing on a model the
taps fully see. It decides only which exact gradient is used, never the privacy of
what is released.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import keras
import tensorflow as tf

from fdp_tf.forward import ZERO, ForwardFn, RecordedForward, check_forward, record_forward
from fdp_tf.introspection import iter_layers, seed_rewind
from fdp_tf.layerwise.pieces import (
    EmbeddingPiece,
    OuterPiece,
    SumPiece,
    VariableGradient,
    flatten_middle,
)
from fdp_tf.layerwise.recurrent import recurrent_forward, recurrent_gradients
from fdp_tf.layerwise.support import layerwise_unsupported, tap_kind
from fdp_tf.randomness import CHECK_STREAM, StepRandomness, step_randomness
from fdp_tf.refusals import gated, refuse_unless

__all__ = [
    "LayerTaps",
    "LayerwiseNorms",
    "LayerwisePieces",
    "escaped_gradients_vanish",
    "layerwise_norms",
    "layerwise_pieces",
    "layerwise_projections",
    "reconstructed_sum",
]


class _Tap:
    """One call of a supported layer in the recorded pass."""

    def __init__(self, kind: str, layer: Any, owned: list[Any], tape: tf.GradientTape | None) -> None:
        self.kind, self.layer, self.owned, self._tape = kind, layer, owned, tape
        self.values: dict[str, tf.Tensor] = {}
        self.target: tf.Tensor | None = None  # the tensor whose gradient is needed

    def set_target(self, target: tf.Tensor) -> None:
        """Record the target; the tape watches it (it is computed from constant weights,
        so on the first layer it would otherwise not be recorded at all)."""
        if self._tape is not None:
            self._tape.watch(target)
        self.target = target

    def gradients(self, grad: tf.Tensor) -> list[VariableGradient]:
        """The layer's variables' per-example gradients, from grad = dL/d(target)."""
        layer, inputs = self.layer, self.values.get("inputs")
        if self.kind == "embedding":
            rows = int(self.owned[0].shape[0])
            ids = _table_rows(tf.reshape(inputs, (tf.shape(grad)[0], -1)), rows, self.layer.name)
            return [VariableGradient(self.owned[0], (EmbeddingPiece(ids, flatten_middle(grad), rows),))]
        if self.kind in ("lstm", "gru", "simple_rnn"):
            return recurrent_gradients(self, grad)
        g = flatten_middle(grad)
        out = [VariableGradient(layer.kernel, (OuterPiece(_patches(self.kind, layer, inputs, g.dtype), g),))]
        if layer.bias is not None:
            out.append(VariableGradient(layer.bias, (SumPiece(g),)))
        return out


def _table_rows(ids: tf.Tensor, rows: int, name: str) -> tf.Tensor:
    """The table rows the layer read: Keras's ``take`` wraps a negative id (-1 is the last
    row). Ids outside [-rows, rows) refuse the step: on a GPU the lookup returns zeros for
    them, under XLA it reads a clamped row, and as keys they would land in another
    example's rows of the norm sum (under XLA, whose assertions are dropped, a removal term
    of 1.012 C). The refusal is noted, so the step's release is zeros
    (:func:`fdp_tf.verify.verified_private_gradient`); the rows returned are clamped to the
    table, so no key leaves its example's range whatever runs the graph."""
    ids = tf.cast(ids, tf.int64)
    in_range = tf.logical_and(tf.reduce_all(ids < rows), tf.reduce_all(ids >= -rows))
    checks = refuse_unless(in_range, f"embedding layer {name!r}: a token id is outside [-{rows}, {rows}) "
                                     f"(input_dim {rows}); fix the data or the layer's input_dim")
    (ids,) = gated([ids], checks)
    return tf.clip_by_value(tf.where(ids < 0, ids + rows, ids), 0, rows - 1)


def _patches(kind: str, layer: Any, inputs: tf.Tensor, dtype: Any) -> tf.Tensor:
    """The layer input at each output position, [b, n, fan_in], in the kernel's order."""
    x = tf.cast(inputs, dtype)
    if kind == "dense":
        return flatten_middle(x)
    if kind == "conv2d":
        (kh, kw), (sh, sw), (dh, dw) = layer.kernel_size, layer.strides, layer.dilation_rate
        patches = tf.image.extract_patches(
            x, sizes=[1, kh, kw, 1], strides=[1, sh, sw, 1], rates=[1, dh, dw, 1],
            padding=layer.padding.upper(),
        )
        return flatten_middle(patches)
    # conv1d as a conv2d of height 1; causal = left padding, then valid
    (k,), (stride,), (dilation,) = layer.kernel_size, layer.strides, layer.dilation_rate
    padding = layer.padding.upper()
    if layer.padding == "causal":
        x = tf.pad(x, [[0, 0], [dilation * (k - 1), 0], [0, 0]])
        padding = "VALID"
    patches = tf.image.extract_patches(
        x[:, None, :, :], sizes=[1, 1, k, 1], strides=[1, 1, stride, 1],
        rates=[1, 1, dilation, 1], padding=padding,
    )
    return flatten_middle(patches)


_MISSING = object()


def _constant_weights(owned: Sequence[Any]) -> Any:
    """Inside, reading one of ``owned`` gives its value as a constant (no gradient to it)."""
    return keras.StatelessScope(state_mapping=[(v, tf.stop_gradient(v.value)) for v in owned])


class LayerTaps:
    """Context manager: while active, supported layers record what their norms need."""

    def __init__(self, model: Any, variables: Sequence[Any], tape: tf.GradientTape | None = None) -> None:
        self.variables = list(variables)
        self.tape = tape  # the recording tape: it must watch the targets
        wanted = {id(v) for v in self.variables}
        self.layers: list[tuple[Any, str, list[Any]]] = []
        for layer in iter_layers(model):
            kind = tap_kind(layer)
            if kind is not None and any(id(v) in wanted for v in kind[1]):
                self.layers.append((layer, kind[0], kind[1]))
        self.taps: list[_Tap] = []
        self.failure: str | None = None
        self._saved: list[tuple[Any, Any]] = []

    def __enter__(self) -> "LayerTaps":
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
            tap = _Tap(kind, layer, owned, self.tape)
            if kind in ("dense", "conv2d", "conv1d"):
                activation = layer.activation
                object.__setattr__(layer, "activation", None)
                try:
                    with _constant_weights(owned):
                        pre = original(*args, **kwargs)
                finally:
                    object.__setattr__(layer, "activation", activation)
                tap.values = {"inputs": args[0] if args else kwargs["inputs"]}
                tap.set_target(pre)
                self.taps.append(tap)
                return activation(pre) if activation is not None else pre
            if kind == "embedding":
                with _constant_weights(owned):
                    out = original(*args, **kwargs)
                tap.values = {"inputs": args[0] if args else kwargs["inputs"]}
                tap.set_target(out)
                self.taps.append(tap)
                return out
            sequences = args[0] if args else kwargs.pop("sequences")
            rest = dict(zip(("initial_state", "mask", "training"), args[1:]))
            rest.update(kwargs)
            out = recurrent_forward(tap, sequences, rest.get("initial_state"), rest.get("mask"))
            self.taps.append(tap)
            return out

        return call

    def variable_gradients(
        self, recorded: RecordedForward, draws: StepRandomness | None = None
    ) -> tuple[list[VariableGradient] | None, tf.Tensor]:
        """Per-example gradients of every wanted variable as pieces, and the coverage check.

        ``draws=None`` skips the check (it then reads ``True``). Returns ``(None, False)``
        (fall back) when the taps cannot be used. A wanted variable owned by a layer that
        was never called has gradient 0 (no pieces); a variable no tap owns makes the
        taps unusable.
        """
        if self.failure is not None:
            return None, tf.constant(False)
        wanted = {id(v) for v in self.variables}
        owned = {id(v) for layer, _, owned in self.layers for v in owned}
        if wanted - owned:
            self.failure = "some trainable variables are not owned by a supported layer"
            return None, tf.constant(False)
        losses = recorded.forward.per_example_losses
        covered = tf.constant(True) if draws is None else escaped_gradients_vanish(recorded, self.variables, draws)
        if not self.taps:
            return [], covered
        grads = recorded.tape.gradient(
            losses, [t.target for t in self.taps], output_gradients=tf.ones_like(losses),
            unconnected_gradients=ZERO,
        )
        out = []
        for tap, grad in zip(self.taps, grads):
            # a layer that saw rows other than the b examples (batch folded with another
            # axis) would give wrong norms, and with b = 1 they would broadcast silently
            one_row_each = tf.equal(tf.shape(grad)[0], tf.shape(losses)[0])
            tf.debugging.Assert(one_row_each, [
                f"per_example_method='layerwise': layer {tap.layer.name!r} did not "
                "see one row per example (it folds another axis into the batch, "
                "e.g. a reshape; with a loss of one entry per row, 'loop' is exact "
                "for such a model)"])
            # XLA drops the assertion: the step then takes the loop, as for an unseen use
            covered = tf.logical_and(covered, one_row_each)
            out.extend(vg for vg in tap.gradients(tf.convert_to_tensor(grad)) if id(vg.variable) in wanted)
        return out, covered


def escaped_gradients_vanish(
    recorded: RecordedForward, variables: Sequence[Any], draws: StepRandomness
) -> tf.Tensor:
    """True iff the tape's gradient of sum_i r_i l_i is exactly 0 for every variable.

    Inside the tapped calls the weights are constants, so this gradient is
    sum_i r_i Delta_i with Delta_i the part of example i's gradient that the taps
    missed. The weights r_i >= 1 are random and drawn after the pass: a miss that
    cancels across examples (sum_i Delta_i = 0, which weights 1 would not see) still
    gives a non-zero sum with probability 1. So True means Delta_i = 0 for every i
    (up to that null event): the taps' sum_i w_i G_i is the true gradient for every
    weighting w, in particular the clip factors. A model the taps fully see has no
    path from the losses to its variables: the tape returns ``None`` and nothing is
    computed. A NaN in a missed part reads as not 0 (the step falls back).
    """
    losses = recorded.forward.per_example_losses
    r = 1.0 + tf.abs(draws.normal(tf.shape(losses), losses.dtype, CHECK_STREAM))
    # unconnected: None (TF cannot zero-fill Keras variables, whose dtype is a string)
    escaped = recorded.tape.gradient(losses, list(variables), output_gradients=tf.stop_gradient(r))
    ok = tf.constant(True)
    for g in escaped:
        if g is not None:
            ok = tf.logical_and(ok, tf.reduce_all(tf.equal(tf.convert_to_tensor(g), 0)))
    return ok


class LayerwisePieces(NamedTuple):
    """What :func:`layerwise_pieces` found."""

    recorded: RecordedForward  # the recorded pass (persistent tape)
    pieces: list[VariableGradient] | None  # per-variable pieces; None: the taps cannot be used
    reason: str | None  # why the taps cannot be used
    covered: tf.Tensor  # bool: the taps saw every use of every variable


class LayerwiseNorms(NamedTuple):
    """What :func:`layerwise_norms` found."""

    recorded: RecordedForward  # the recorded pass (persistent tape)
    norms: tf.Tensor | None  # exact ||g_i||, [b]; None: the taps cannot be used
    pieces: list[VariableGradient] | None  # per-variable pieces (for the released sum)
    reason: str | None  # why the taps cannot be used
    covered: tf.Tensor  # bool: the taps saw every use of every variable


def layerwise_pieces(
    forward_fn: ForwardFn, variables: Sequence[Any], model: Any, rng: Any = None, *,
    check: bool = True,
) -> LayerwisePieces:
    """Record one forward pass with taps and return every variable's per-example pieces.

    On success: the pieces and whether they cover every use of every variable (on a
    pass whose tapped layers read their weights as constants: its tape must not be used
    for per-example gradients). Otherwise pieces ``None``, the reason, and a fresh pass
    recorded without taps on which the caller falls back. ``check=False`` skips the
    coverage check (benchmarks measure what it costs).
    """
    reason = layerwise_unsupported(model, variables)
    if reason is not None:
        return LayerwisePieces(record_forward(forward_fn, persistent=True), None, reason, tf.constant(False))
    rewind = seed_rewind(model)
    with tf.GradientTape(persistent=True) as tape:
        taps = LayerTaps(model, variables, tape)
        with taps:
            forward = forward_fn()
    check_forward(forward)
    recorded = RecordedForward(tape=tape, forward=forward)
    pieces, covered = taps.variable_gradients(recorded, step_randomness(rng) if check else None)
    if pieces is None:  # this pass's tape lacks the tapped uses: record another, alike
        rewind()
        return LayerwisePieces(record_forward(forward_fn, persistent=True), None, taps.failure, tf.constant(False))
    return LayerwisePieces(recorded, pieces, None, covered)


def layerwise_norms(
    forward_fn: ForwardFn, variables: Sequence[Any], model: Any, rng: Any = None, *,
    check: bool = True,
) -> LayerwiseNorms:
    """Record one forward pass and compute the exact ||g_i|| layer by layer.

    Returns a :class:`LayerwiseNorms`: the exact per-example gradient norms of shape
    ``[b]`` with the pieces and coverage of :func:`layerwise_pieces`, or norms and
    pieces ``None``, the reason, and a fresh pass recorded without taps, on which the
    caller falls back to exact per-example gradients.
    """
    found = layerwise_pieces(forward_fn, variables, model, rng, check=check)
    if found.pieces is None:
        return LayerwiseNorms(found.recorded, None, None, found.reason, found.covered)
    losses = found.recorded.forward.per_example_losses
    squared = tf.zeros_like(losses)
    for vg in found.pieces:
        squared = squared + tf.cast(vg.squared_norms(), losses.dtype)
    return LayerwiseNorms(found.recorded, tf.sqrt(squared), found.pieces, None, found.covered)


def layerwise_projections(
    pieces: Sequence[VariableGradient], variables: Sequence[Any], directions: Sequence[tf.Tensor],
    losses: tf.Tensor,
) -> tf.Tensor:
    """P_ij = <G_i, v_j> from the pieces, shape [b, r] (seed, Algorithm 1, line 7).

    ``directions`` holds one ``[r, *variable.shape]`` tensor per variable; a variable
    no tap saw used has G_i = 0 and adds nothing. Each piece's projection pairs the
    tangent of its pre-activation with its adjoint (:mod:`fdp_tf.layerwise.pieces`).
    """
    by_variable = {id(vg.variable): vg for vg in pieces}
    r = int(directions[0].shape[0])
    total = tf.zeros(tf.stack([tf.shape(losses)[0], r]), losses.dtype)
    for v, d in zip(variables, directions):
        vg = by_variable.get(id(v))
        if vg is not None:
            total = total + tf.cast(vg.projections(d), losses.dtype)
    return total


def reconstructed_sum(
    pieces: Sequence[VariableGradient], variables: Sequence[Any], weights: tf.Tensor
) -> list[tf.Tensor]:
    """sum_i w_i G_i per variable from the pieces (zero for a variable no tap saw used);
    examples with weight 0 are excluded, so their inf or NaN cannot reach the sum."""
    keep = weights > 0
    by_variable = {id(vg.variable): vg for vg in pieces}
    out = []
    for v in variables:
        vg = by_variable.get(id(v))
        out.append(tf.zeros(tuple(v.shape), v.dtype) if vg is None
                   else tf.cast(vg.weighted_sum(weights, keep), v.dtype))
    return out
