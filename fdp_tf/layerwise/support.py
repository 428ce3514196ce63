"""Which layers the layer-wise norms handle, decided before any step runs.

This is a first, static filter; the run-time coverage check in
:mod:`fdp_tf.layerwise.taps` proves at every step that the taps saw every use of
every variable (a weight read outside its layer is caught there).
"""

from __future__ import annotations

from typing import Any, Sequence

import keras

from fdp_tf.introspection import iter_layers

__all__ = ["layerwise_unsupported", "tap_kind"]


def _layer_has_plain_call(layer: Any, cls: type) -> bool:
    """The layer runs ``cls.call`` on its own variables: no override of ``call`` or of the
    properties through which ``call`` reads the variables (a subclass whose ``kernel``
    transforms the variable would make the tapped gradient that of another tensor)."""
    return (
        type(layer).call is cls.call
        and all(getattr(type(layer), p, None) is getattr(cls, p, None)
                for p in ("kernel", "bias", "embeddings", "activation"))
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


def tap_kind(layer: Any) -> tuple[str, list[Any]] | None:
    """(kind, owned variables) for a supported leaf layer, else ``None``."""
    L = keras.layers
    if isinstance(layer, L.Dense) and _layer_has_plain_call(layer, L.Dense):
        owned = _owned(layer, ["kernel", "bias"])
        return ("dense", owned) if owned is not None else None
    if isinstance(layer, L.Embedding) and _layer_has_plain_call(layer, L.Embedding):
        owned = _owned(layer, ["embeddings"])
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
            owned = _owned(layer, ["kernel", "bias"])
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
    if model is None:
        return "no model given"
    variables = list(model.trainable_variables if variables is None else variables)
    covered: set[int] = set()
    unsupported: list[str] = []
    for layer in iter_layers(model):
        if isinstance(layer, keras.layers.Wrapper) and not isinstance(layer, keras.layers.Bidirectional):
            # e.g. TimeDistributed folds time into the batch: its inner layer would see
            # b*T rows, not b examples
            unsupported.append(f"wrapper {type(layer).__name__} ({layer.name!r})")
            continue
        kind = tap_kind(layer)
        if kind is not None:
            covered.update(id(v) for v in kind[1])
            continue
        # The taps see a variable only where its own layer's call reads it. Code that
        # may read weights elsewhere (tied weights: a subclassed model's call, a Lambda,
        # an unknown layer holding variables) would make the norms too small.
        if isinstance(layer, keras.Model):
            if not (_is_graph_model(layer) or getattr(type(layer), "calls_only_base_model", False)):
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


def _is_graph_model(model: Any) -> bool:
    """A Sequential or functional model (``keras.Model(inputs, outputs)``) of the plain
    class: its call only runs its layers. Found through the public ``keras.Function``
    base of functional models, not by importing Keras internals."""
    if type(model) is keras.Sequential:
        return True
    if not isinstance(model, keras.Function):
        return False
    functional = next(c for c in type(model).__mro__ if keras.Function in c.__bases__)
    return type(model) is functional
