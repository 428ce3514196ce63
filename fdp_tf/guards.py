"""What cannot be trained privately is refused, with what to do instead.

Per-example clipping bounds each example's influence on the *gradient*. A layer
that also releases data another way breaks the guarantee:

* ``BatchNormalization`` in training mode normalises each example by statistics of
  the whole batch (examples interact, so no per-example gradient exists) and
  updates its moving mean and variance from raw batch data with no noise;
* a stateful RNN carries batch t's state into batch t+1;
* any non-trainable variable that a private step changes (e.g. a running statistic
  updated from the data): :class:`StateGuard` compares it before and after *every*
  step, inside the step, restores it and refuses the step before its gradient is
  released (the release depends on the check);
* mixed precision: Keras wraps the optimizer in a ``LossScaleOptimizer``, whose apply
  bypasses the private clipping and noise; float16 / bfloat16 layers: per-example
  norms overflow at 65504 (float16) or lose all but 8 bits, so the clipping is not C;
* a model with several outputs: one per-example loss of one output is what is clipped;
* XLA (``jit_compile=True``) for a private step through a looped recurrent layer:
  TensorFlow 2.21's XLA compiler crashes the whole process in some runs (a failed shape
  check or a segmentation fault) compiling it on a batch of dynamic size, as Poisson
  batches are.
"""

from __future__ import annotations

import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from fdp_tf.introspection import iter_layers, looped_rnn_layers
from fdp_tf.refusals import refuse_unless

__all__ = [
    "MULTI_OUTPUT",
    "NonTrainableWatch",
    "ReportFallbacks",
    "StateGuard",
    "WatchFirstStep",
    "refuse_xla_through_loops",
    "refuse_multiple_outputs",
    "refuse_unsupported_layers",
]

_HALF = ("float16", "bfloat16")


def refuse_unsupported_layers(model: Any) -> None:
    """Raise ``ValueError`` naming the first layer of ``model`` that cannot be private."""
    for layer in iter_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            raise ValueError(
                f"layer {layer.name!r} ({type(layer).__name__}) cannot be trained with "
                "differential privacy: in training mode it normalises each example with "
                "statistics of the whole batch and updates its moving mean and variance from "
                "the raw data, with no noise. Use keras.layers.LayerNormalization or "
                "keras.layers.GroupNormalization (per example) instead."
            )
        if isinstance(layer, keras.layers.RNN) and getattr(layer, "stateful", False):
            raise ValueError(
                f"layer {layer.name!r} ({type(layer).__name__}) is stateful: the state left by "
                "one batch's examples flows into the next batch, outside the per-example "
                "clipping. Build it with stateful=False."
            )
    policies = {getattr(layer.dtype_policy, "name", "float32") for layer in iter_layers(model)}
    policy = next((p for p in sorted(policies) if p.startswith("mixed_")), None)
    if policy is not None:
        raise ValueError(
            f"mixed precision (dtype policy {policy!r}) is not supported with the DP "
            "optimizers: loss scaling wraps the optimizer and bypasses its clipping and "
            "noise. Build the model under keras.mixed_precision.set_global_policy('float32')"
        )
    for layer in iter_layers(model):
        half = [str(layer.compute_dtype), str(layer.variable_dtype)]
        if any(d in _HALF for d in half):
            raise ValueError(
                f"layer {layer.name!r} ({type(layer).__name__}) computes or stores weights in "
                f"half precision ({', '.join(sorted(set(d for d in half if d in _HALF)))}): "
                "per-example gradient norms overflow (float16 tops out at 65504) or keep 8 "
                "bits (bfloat16), so the clipping would not bound each example by C. Build "
                "the layer in float32 (drop dtype='float16' / 'bfloat16')."
            )


def refuse_xla_through_loops(model: Any, optimizer: Any, jit_compile: Any) -> None:
    """Refuse XLA for a private step that runs through a looped recurrent layer.

    The privacy fuzzer found it: compiling the step (the JL double vjp, or exact clipping)
    through ``tf.while_loop`` on a batch of dynamic size aborts the process in some runs
    and not in others (a failed shape check in XLA's value inference, or a segmentation
    fault), so no first-step check can vouch for it.
    """
    if jit_compile is not True or getattr(optimizer, "dp_config", None) is None:
        return
    loops = looped_rnn_layers(model)
    if loops:
        raise ValueError(
            f"jit_compile=True with a DP optimizer through the recurrent layer {loops[0].name!r}: "
            "TensorFlow's XLA compiler crashes the process in some runs on this private step (its "
            "while loop on batches of varying size). Compile with jit_compile=False"
        )


def refuse_multiple_outputs(model: Any, outputs: Any = None) -> None:
    """Raise ``ValueError`` if ``model`` (or the given outputs of one call) has several
    output tensors; a functional model's outputs are known before any step."""
    if outputs is None:
        try:
            outputs = model.outputs
        except (AttributeError, ValueError):  # subclassed, or a Sequential not built yet
            return
    if isinstance(outputs, dict) or isinstance(outputs, (list, tuple)) and len(outputs) > 1:
        raise ValueError(MULTI_OUTPUT.format(name=getattr(model, "name", "?")))


#: Refusal of a model with several outputs (at compile, or at the first step).
MULTI_OUTPUT = (
    "model {name!r} has several outputs; differentially private training clips one "
    "per-example loss of one output tensor. Combine the outputs inside the model (e.g. "
    "keras.layers.Concatenate) and write one per-example loss for the combined output"
)


class StateGuard:
    """Refuses a step during which a non-trainable weight of the model changed.

    A running statistic (``BatchNormalization``'s moving mean, a custom layer's) would
    release raw batch data with no clipping and no noise, and it may change only on rare
    batches (a layer that updates when a batch holds an outlier), so the check runs on
    *every* step, in the step: the weights are read before the step (a snapshot, not a
    copy: a resource variable's read is unaffected by later writes) and compared after
    it; if any changed, all are restored and the step is refused. The caller gates the
    release on :meth:`check`, so the gradient of a refused step never reaches
    ``apply_gradients``. Seed states are not weights (dropout does not count).
    Cost: reading and comparing the non-trainable weights, nothing for a model without.
    """

    def __init__(self, model: Any, variables: Any = None, message: str | None = None) -> None:
        if variables is None:
            variables = [] if model is None else model.non_trainable_weights
        self.variables = list(variables)
        self._message = message
        self.before = [tf.identity(tf.convert_to_tensor(v)) for v in self.variables]
        self._put_back: Any = None
        self._read_all: Any = None

    def check(self) -> list[Any]:
        """Compare, restore if changed, and refuse (eagerly: raise ``ValueError``)."""
        if not self.variables:
            return []
        changed = tf.reduce_any(tf.stack([
            tf.reduce_any(tf.not_equal(_bits(tf.convert_to_tensor(v)), _bits(old)))
            for v, old in zip(self.variables, self.before)
        ]))

        if tf.executing_eagerly():
            if bool(changed):
                self._restore()
            return refuse_unless(not bool(changed), self.message())
        with tf.control_dependencies([self.restore_unless(tf.logical_not(changed))]):
            return refuse_unless(tf.logical_not(changed), self.message(), restore=False)

    def restore_unless(self, ok: tf.Tensor) -> Any:
        """In a graph: the op that puts every variable back to its snapshot unless ``ok``
        (before a refusal's assertion: :func:`fdp_tf.refusals.guarding`)."""
        return tf.cond(ok, lambda: tf.constant(False), self._restore)

    def fence(self) -> list[Any]:
        """A read of every variable, in one call (TensorFlow orders a variable's later writes
        after it, so after whatever it depends on)."""
        if self._read_all is None:
            variables = self.variables

            @tf.function(autograph=False)
            def read_all() -> tf.Tensor:
                return tf.add_n([tf.cast(tf.size(tf.convert_to_tensor(v)), tf.int64) for v in variables])

            self._read_all = read_all
        return [self._read_all()]

    def _restore(self) -> tf.Tensor:
        if tf.executing_eagerly():
            for v, old in zip(self.variables, self.before):
                v.assign(old)
            return tf.constant(True)
        if self._put_back is None:
            # one function, traced once and called from every check site: a site adds a call,
            # not one assignment per weight (a frozen backbone has hundreds)
            variables = self.variables

            @tf.function(autograph=False)
            def put_back(*values: tf.Tensor) -> tf.Tensor:
                for v, value in zip(variables, values):
                    v.assign(value)
                return tf.constant(True)

            self._put_back = put_back
        return self._put_back(*self.before)

    def message(self) -> str:
        if self._message is not None:
            return self._message
        names = ", ".join(getattr(v, "path", v.name) for v in self.variables[:4])
        more = f" and {len(self.variables) - 4} more" if len(self.variables) > 4 else ""
        return (
            f"a training step updated non-trainable weights of the model (among {names}{more}); "
            "they would carry information about the examples outside the per-example clipping "
            "and noise, so differentially private training refuses them (their values were "
            "restored and the step's gradient was not applied). Remove the layer, or make it "
            "update nothing in training mode (e.g. LayerNormalization instead of a running "
            "normalisation)."
        )


def _bits(t: tf.Tensor) -> tf.Tensor:
    """The value's bits as integers: equal for an unchanged NaN, unlike the floats."""
    if not t.dtype.is_floating:
        return t
    return tf.bitcast(t, {2: tf.int16, 4: tf.int32, 8: tf.int64}[t.dtype.size])


class NonTrainableWatch:
    """Detects non-trainable weights that a training step changed (e.g. running statistics
    of a custom layer): snapshot before the first step, :meth:`check` after it.

    Random-seed states are not weights (``Layer.weights`` excludes them), so dropout and
    other data-independent randomness do not count.
    """

    def __init__(self, model: Any) -> None:
        self.variables = list(model.non_trainable_weights)
        self.before = [np.array(v.numpy(), copy=True) for v in self.variables]

    def check(self) -> None:
        """Raise ``ValueError`` (after restoring the values) if any weight changed."""
        changed = [
            v for v, old in zip(self.variables, self.before)
            if not np.array_equal(np.asarray(v.numpy()), old, equal_nan=True)
        ]
        if not changed:
            return
        for v, old in zip(self.variables, self.before):
            v.assign(old)
        names = ", ".join(getattr(v, "path", v.name) for v in changed[:4])
        raise ValueError(
            f"a training step updated non-trainable weights from the data ({names}); they "
            "would carry information about the examples outside the per-example clipping and "
            "noise, so differentially private training refuses them (their values were "
            "restored). Remove the layer, or make it update nothing in training mode "
            "(e.g. LayerNormalization instead of a running normalisation)."
        )


class WatchFirstStep(keras.callbacks.Callback):
    """Runs :class:`NonTrainableWatch` after the first training step."""

    def __init__(self, watch: NonTrainableWatch) -> None:
        super().__init__()
        self.watch = watch
        self.done = False

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if not self.done:
            self.done = True
            self.watch.check()


class ReportFallbacks(keras.callbacks.Callback):
    """Warns after ``fit`` if layer-wise steps fell back to per-example gradients.

    Such a step is exact and private, only slower: some weight is read outside its
    own layer's call (e.g. a tied embedding used through ``keras.ops``), so the
    layer taps could not give the model's gradient. The count is a metric summed
    over the epoch, read once per epoch before Keras resets it (the validation of
    the epoch resets it right after ``on_test_begin``).
    """

    def __init__(self, tracker: Any) -> None:
        super().__init__()
        self.tracker, self.total, self.steps, self.pending = tracker, 0, 0, False

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.pending = True

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.steps += 1

    def on_test_begin(self, logs: Any = None) -> None:
        self._collect()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._collect()

    def _collect(self) -> None:
        if self.pending:
            self.pending = False
            self.total += int(round(float(keras.ops.convert_to_numpy(self.tracker.result()))))

    def on_train_end(self, logs: Any = None) -> None:
        if self.total:
            warnings.warn(
                f"{self.total} of {self.steps} layer-wise steps fell back to exact per-example "
                "gradients (a weight is read outside its own layer's call, e.g. tied weights "
                "through keras.ops, so the layer taps cannot give the model's gradient). The "
                "steps are exact and private, only slower; per_example_method='vectorized' or "
                "'loop' skips the layer taps",
                RuntimeWarning,
                stacklevel=2,
            )

