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
reconstruction equals the true clipped gradient (no use of a variable escaped the
taps: a weight read outside its layer, a property that transforms the variable) is
proven at every step by :func:`reconcile` against the tape's gradient of the same
recorded pass; on a mismatch the step is recomputed with exact per-example
gradients (see :func:`fdp_tf.vanilla_private_gradient`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from fdp_tf.forward import ZERO, ForwardFn, RecordedForward, record_forward
from fdp_tf.introspection import iter_layers
from fdp_tf.layerwise.pieces import (
    EmbeddingPiece,
    OuterPiece,
    SumPiece,
    VariableGradient,
    flatten_middle,
)
from fdp_tf.layerwise.recurrent import recurrent_forward, recurrent_gradients
from fdp_tf.layerwise.support import layerwise_unsupported, tap_kind

__all__ = ["LayerTaps", "layerwise_norms", "reconcile", "reconstructed_sum"]

# relative tolerance of the reconciliation: float32 sums in another order differ by
# ~1e-6 relative; a missed use of a variable changes its gradient by far more
RECONCILE_RTOL = 1e-3


class _Tap:
    """One call of a supported layer in the recorded pass."""

    def __init__(self, kind: str, layer: Any, owned: list[Any]) -> None:
        self.kind, self.layer, self.owned = kind, layer, owned
        self.values: dict[str, tf.Tensor] = {}
        self.target: tf.Tensor | None = None  # the tensor whose gradient is needed

    def gradients(self, grad: tf.Tensor) -> list[VariableGradient]:
        """The layer's variables' per-example gradients, from grad = dL/d(target)."""
        layer, inputs = self.layer, self.values.get("inputs")
        if self.kind == "embedding":
            ids = tf.reshape(inputs, (tf.shape(grad)[0], -1))
            return [VariableGradient(self.owned[0], (EmbeddingPiece(ids, flatten_middle(grad), int(self.owned[0].shape[0])),))]
        if self.kind in ("lstm", "gru", "simple_rnn"):
            return recurrent_gradients(self, grad)
        g = flatten_middle(grad)
        out = [VariableGradient(layer.kernel, (OuterPiece(_patches(self.kind, layer, inputs, g.dtype), g),))]
        if layer.bias is not None:
            out.append(VariableGradient(layer.bias, (SumPiece(g),)))
        return out


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


class LayerTaps:
    """Context manager: while active, supported layers record what their norms need."""

    def __init__(self, model: Any, variables: Sequence[Any]) -> None:
        self.variables = list(variables)
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
            out = recurrent_forward(tap, sequences, rest.get("initial_state"), rest.get("mask"))
            self.taps.append(tap)
            return out

        return call

    def variable_gradients(self, recorded: RecordedForward) -> list[VariableGradient] | None:
        """Per-example gradients of every wanted variable as pieces, or ``None`` (fall back).

        A wanted variable owned by a layer that was never called has gradient 0 (no
        pieces); a variable no tap owns makes the taps unusable.
        """
        if self.failure is not None:
            return None
        wanted = {id(v) for v in self.variables}
        covered = {id(v) for layer, _, owned in self.layers for v in owned}
        if wanted - covered:
            self.failure = "some trainable variables are not owned by a supported layer"
            return None
        losses = recorded.forward.per_example_losses
        if not self.taps:
            return []
        grads = recorded.tape.gradient(
            losses, [t.target for t in self.taps], output_gradients=tf.ones_like(losses),
            unconnected_gradients=ZERO,
        )
        out = []
        for tap, grad in zip(self.taps, grads):
            # a layer that saw rows other than the b examples (batch folded with another
            # axis) would give wrong norms, and with b = 1 they would broadcast silently
            tf.debugging.assert_equal(
                tf.shape(grad)[0], tf.shape(losses)[0],
                message=f"per_example_method='layerwise': layer {tap.layer.name!r} did not "
                        "see one row per example; use per_example_method='vectorized'",
            )
            out.extend(vg for vg in tap.gradients(tf.convert_to_tensor(grad)) if id(vg.variable) in wanted)
        return out


def layerwise_norms(
    forward_fn: ForwardFn, variables: Sequence[Any], model: Any
) -> tuple[RecordedForward, tf.Tensor | None, list[VariableGradient] | None, str | None]:
    """Record one forward pass and compute the exact ||g_i|| layer by layer.

    Returns:
      ``(recorded, norms, pieces, reason)``: the recorded pass (persistent tape), the
      exact per-example gradient norms of shape ``[b]``, the per-variable pieces (for
      the released sum) and ``None``; or norms and pieces ``None`` and the reason when
      the model cannot be handled this way (the caller falls back to exact per-example
      gradients on the same recorded pass).
    """
    reason = layerwise_unsupported(model, variables)
    if reason is not None:
        return record_forward(forward_fn, persistent=True), None, None, reason
    taps = LayerTaps(model, variables)
    with taps:
        recorded = record_forward(forward_fn, persistent=True)
    pieces = taps.variable_gradients(recorded)
    if pieces is None:
        return recorded, None, None, taps.failure
    losses = recorded.forward.per_example_losses
    squared = tf.zeros_like(losses)
    for vg in pieces:
        squared = squared + tf.cast(vg.squared_norms(), losses.dtype)
    return recorded, tf.sqrt(squared), pieces, None


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


def reconcile(
    recorded: RecordedForward,
    variables: Sequence[Any],
    reconstructed: Sequence[tf.Tensor],
    weights: tf.Tensor,
) -> tf.Tensor:
    """True iff, for every variable, the taps' sum_i w_i G_i equals the tape's gradient of
    sum_i w_i l_i on the same recorded pass (within ``RECONCILE_RTOL``).

    The tape sees every use of every variable, the taps only the uses inside their
    layers' calls; equality proves that nothing escaped them at this step.
    """
    losses = recorded.forward.per_example_losses
    w = tf.stop_gradient(tf.cast(weights, losses.dtype))
    truth = recorded.tape.gradient(losses, list(variables), output_gradients=w, unconnected_gradients=ZERO)
    ok = tf.constant(True)
    for mine, true in zip(reconstructed, truth):
        true = tf.cast(tf.convert_to_tensor(true), mine.dtype)
        diff = tf.norm(tf.reshape(mine - true, (-1,)))
        scale = tf.norm(tf.reshape(mine, (-1,))) + tf.norm(tf.reshape(true, (-1,)))
        ok = tf.logical_and(ok, diff <= RECONCILE_RTOL * scale + tf.cast(1e-30, mine.dtype))
    return ok
