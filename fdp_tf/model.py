"""``PrivateModel``: any Keras model, trained with a DP optimizer via public hooks.

The wrapper overrides ``Model.train_step`` (and ``test_step`` / ``compute_loss``
for a consistent per-example loss): the forward pass runs inside the
optimizer's :meth:`~fdp_tf.DPOptimizer.compute_private_gradients`, which
returns the clipped and noised gradient, and the ordinary ``apply_gradients``
applies it. ``compile``, ``fit``, ``evaluate``, ``predict``, callbacks and
saving are Keras's own. Every private step is written into the model's privacy
ledger (:mod:`fdp_tf.ledger`), saved with its weights.

Typical use::

    model = fdp_tf.make_private(
        model,
        optimizer=fdp_tf.DPAdamJL(l2_norm_clip=1.0, noise_multiplier=0.6,
                                  jl_projections=30, learning_rate=1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                        reduction=None),
        metrics=["accuracy"],
    )
    data = fdp_tf.poisson_batches(x, y, expected_batch_size=256)
    history = model.fit(data, epochs=15,
                        callbacks=[fdp_tf.PrivacyCallback(delta=1e-5)])
    history.history["epsilon"]
"""

from __future__ import annotations

import warnings
from typing import Any

import keras
import tensorflow as tf

from fdp_tf.forward import ForwardPass
from fdp_tf.guards import NonTrainableWatch, ReportFallbacks, WatchFirstStep, refuse_unsupported_layers
from fdp_tf.ledger import FIELDS, MAX_SEGMENTS, PrivacyLedger, Segment, empty_table, table_with
from fdp_tf.losses import PerExampleLoss, per_example_loss_fn
from fdp_tf.optimizers import DPOptimizer
from fdp_tf.sampling import PoissonSampling, SamplingWarning, pad_to_replicas, sampling_for_fit

__all__ = ["PrivateModel", "make_private", "per_example_loss_fn"]


#: keras.Model.fit's parameters after (x, y, batch_size), in order.
_FIT_POSITIONAL = ("epochs", "verbose", "callbacks", "validation_split", "validation_data", "shuffle",
                   "class_weight", "sample_weight", "initial_epoch", "steps_per_epoch",
                   "validation_steps", "validation_batch_size", "validation_freq")


@keras.saving.register_keras_serializable(package="fdp_tf")
class PrivateModel(keras.Model):
    """Wrap a Keras model so that ``fit`` runs DP-SGD(-JL) with a DP optimizer.

    With a :class:`fdp_tf.DPOptimizer` each training step computes
    g~ = (1/B) sum_i c_i grad l_i + (sigma C / B) N(0, I) from one forward
    pass; with any other Keras optimizer it trains without privacy on the mean
    per-example loss (for comparison runs; the ledger then records a non-private
    segment and epsilon is infinite).

    Args:
      model: the Keras model (any architecture; must have trainable variables).
      **kwargs: ``keras.Model`` arguments such as ``name``.

    Attributes:
      base_model: the wrapped model.
      ledger: the :class:`fdp_tf.PrivacyLedger` of everything trained so far.
    """

    calls_only_base_model = True  # its call runs base_model and nothing else (layer taps)

    def __init__(self, model: keras.Model, **kwargs: Any) -> None:
        if not isinstance(model, keras.layers.Layer):
            raise ValueError(f"model must be a Keras model; got {type(model).__name__}")
        if model.built and not model.trainable_variables:
            raise ValueError(
                f"model {model.name!r} has no trainable variables; nothing to train privately"
            )
        super().__init__(**kwargs)
        self.base_model = model
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.dropped_tracker = keras.metrics.Sum(name="dropped_examples")
        # layer-wise steps that fell back to per-example gradients (warned after fit)
        self.fallback_tracker = keras.metrics.Sum(name="layerwise_fallbacks")
        # the ledger: one row per segment (kind, sigma, r, rate, steps); saved as a weight
        self.dp_ledger = self.add_weight(
            shape=(MAX_SEGMENTS, FIELDS), dtype="float64", trainable=False, name="dp_ledger",
            initializer=keras.initializers.Constant(empty_table()),
            aggregation="only_first_replica",
        )
        self.dp_ledger_row = self.add_weight(
            shape=(), dtype="int32", trainable=False, name="dp_ledger_row",
            initializer="zeros", aggregation="only_first_replica",
        )
        self._ledger_open = False
        self._per_example_loss: PerExampleLoss | None = None
        self._sampling_warned = False

    # -- Keras plumbing --------------------------------------------------------

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        return self.base_model(inputs, training=training)

    def build(self, input_shape: Any = None) -> None:
        if not self.base_model.built and input_shape is not None:
            self.base_model.build(input_shape)
        self.built = True

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["model"] = keras.saving.serialize_keras_object(self.base_model)
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> "PrivateModel":
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(
            config.pop("model"), custom_objects=custom_objects
        )
        config.pop("trainable", None)
        config.pop("dtype", None)
        return cls(inner, **config)

    @property
    def metrics(self) -> list[Any]:
        # One "loss" entry: this model's per-example-mean tracker replaces
        # Keras's compiled-loss tracker (which PrivateModel never updates).
        others = [m for m in super().metrics if m.name != "loss"]
        return [self.loss_tracker, *others]

    def compile(self, optimizer: Any = "rmsprop", loss: Any = None, *args: Any, **kwargs: Any) -> None:
        """Keras ``compile``; ``loss`` must give one value per example (reduction=None).

        Raises:
          ValueError: for a DP optimizer, if the model has a layer that cannot be
            trained privately (BatchNormalization, a stateful RNN, mixed precision),
            naming it and the alternative.
        """
        self._per_example_loss = per_example_loss_fn(loss)
        # a new optimizer is a new segment of the ledger: steps after this compile must
        # not be booked against the previous fit's row (fit or open_segment reopens it)
        self._ledger_open = False
        if isinstance(optimizer, DPOptimizer):
            refuse_unsupported_layers(self)
            if kwargs.get("jit_compile", "auto") == "auto":
                # XLA support of forward-mode accumulators and while-loop jacobians
                # is not tested here; opt in with jit_compile=True.
                kwargs["jit_compile"] = False
        super().compile(optimizer, loss, *args, **kwargs)

    def compile_from_config(self, config: dict[str, Any]) -> None:
        """Re-compile on ``keras.models.load_model`` (restores the DP optimizer state)."""
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if self.built:
            self.optimizer.build(self.trainable_variables)

    # -- losses ----------------------------------------------------------------

    def per_example_loss(self, y: Any, y_pred: Any, sample_weight: Any = None) -> tf.Tensor:
        """l_1..l_b of the compiled loss, shape ``[b]``."""
        if self._per_example_loss is None:
            raise ValueError("loss is not set: compile the model with a per-example loss first")
        return self._per_example_loss(y, y_pred, sample_weight)

    def _regularization(self) -> tf.Tensor | None:
        """Sum of the weight regularizers (data-independent: added unclipped, no privacy cost).

        Losses from ``add_loss`` or ``activity_regularizer`` depend on the examples; their
        gradient would bypass the per-example clipping, so they are refused.
        """
        # public API only: Layer.losses holds the add_loss / activity losses of every layer
        # and, after them, one penalty per regularized trainable weight
        extra = [v.regularizer(v) for v in self.trainable_weights if v.regularizer is not None]
        if len(self.losses) > len(extra):
            raise ValueError(
                "the model adds losses with add_loss or activity_regularizer; they depend on the "
                "examples, and their gradient would not be clipped per example. Put such terms "
                "into the per-example loss, or use weight regularizers (kernel_regularizer, ...)"
            )
        if not extra:
            return None
        # gradients of all replicas are summed: each adds its share of the penalty
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        return tf.add_n([tf.cast(v, "float32") for v in extra]) / float(replicas)

    def compute_loss(
        self, x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None,
        training: bool = True,
    ) -> tf.Tensor:
        """Mean per-example loss plus regularization (what the progress bar shows)."""
        del x, training
        total = tf.reduce_mean(self.per_example_loss(y, y_pred, sample_weight))
        reg = self._regularization()
        return total if reg is None else total + tf.cast(reg, total.dtype)

    def forward_pass(self, x: Any, y: Any, sample_weight: Any = None) -> ForwardPass:
        """Run the model in training mode and return per-example losses (one pass)."""
        y_pred = self(x, training=True)
        losses = self.per_example_loss(y, y_pred, sample_weight)
        return ForwardPass(losses, self._regularization(), y_pred)

    # -- steps -------------------------------------------------------------------

    def train_step(self, data: Any) -> dict[str, Any]:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        variables = self.trainable_variables
        if not variables:
            raise ValueError("model has no trainable variables; nothing to train privately")
        if not self._ledger_open:
            raise ValueError(
                "the sampling of this training step is unknown, so its privacy cannot be "
                "accounted: train with PrivateModel.fit (which reads it from the data), or "
                "call model.open_segment(fdp_tf.PoissonSampling(...)) before a custom loop"
            )
        optimizer = self.optimizer
        if isinstance(optimizer, DPOptimizer):
            result = optimizer.compute_private_gradients(
                lambda: self.forward_pass(x, y, sample_weight), variables, model=self.base_model,
                forward_on_rows=lambda keep: self._forward_on_rows(keep, x, y, sample_weight),
            )
            grads, forward = result.gradients, result.forward
            if result.dropped is not None:
                self.dropped_tracker.update_state(tf.cast(result.dropped, "float32"))
            if result.fallbacks is not None:
                self.fallback_tracker.update_state(tf.cast(result.fallbacks, "float32"))
        else:
            with tf.GradientTape() as tape:
                forward = self.forward_pass(x, y, sample_weight)
                total = tf.reduce_mean(forward.per_example_losses)
                if forward.regularization is not None:
                    total = total + forward.regularization
            grads = tape.gradient(total, variables)
        optimizer.apply_gradients(zip(grads, variables))
        self._count_step()
        self._track_loss(forward)
        logs = self.compute_metrics(x, y, forward.outputs, sample_weight=sample_weight)
        logs.pop(self.fallback_tracker.name, None)  # reported by ReportFallbacks instead
        return logs

    def _forward_on_rows(self, keep: tf.Tensor, x: Any, y: Any, sample_weight: Any) -> ForwardPass:
        pick = lambda t: None if t is None else tf.boolean_mask(t, keep)  # noqa: E731
        return self.forward_pass(
            tf.nest.map_structure(pick, x), tf.nest.map_structure(pick, y), pick(sample_weight)
        )

    def _count_step(self) -> None:
        """One more step in the current ledger row (in the graph, saved with the weights)."""
        index = tf.stack([tf.convert_to_tensor(self.dp_ledger_row), tf.constant(FIELDS - 1, tf.int32)])[None, :]
        self.dp_ledger.assign(
            tf.tensor_scatter_nd_add(tf.convert_to_tensor(self.dp_ledger), index, tf.ones([1], tf.float64))
        )

    def test_step(self, data: Any) -> dict[str, Any]:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = self(x, training=False)
        losses = self.per_example_loss(y, y_pred, sample_weight)
        self._track_loss(ForwardPass(losses, self._regularization(), y_pred))
        result = self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        result.pop(self.dropped_tracker.name, None)  # training-only counts
        result.pop(self.fallback_tracker.name, None)
        return result

    def _track_loss(self, forward: ForwardPass) -> None:
        losses = forward.per_example_losses
        finite = tf.math.is_finite(losses)  # dropped examples do not make the loss NaN
        losses = tf.boolean_mask(losses, finite)
        count = tf.cast(tf.shape(losses)[0], losses.dtype)
        mean = tf.math.divide_no_nan(tf.reduce_sum(losses), count)
        if forward.regularization is not None:
            mean = mean + tf.cast(forward.regularization, mean.dtype)
        self.loss_tracker.update_state(mean, sample_weight=count)

    # -- fit: sampling and the ledger -------------------------------------------

    @property
    def ledger(self) -> PrivacyLedger:
        """Everything trained so far (restored with the weights)."""
        return PrivacyLedger.from_table(keras.ops.convert_to_numpy(self.dp_ledger))

    def epsilon(self, delta: float, accountant: Any = None) -> float:
        """Certified upper bound on epsilon at ``delta`` of all training in the ledger
        (``accountant``: an :class:`fdp.PLDAccountant` whose settings to use)."""
        return self.ledger.epsilon(delta, accountant)

    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, *args: Any,
            sampling: PoissonSampling | None = None, **kwargs: Any) -> Any:
        """Keras ``fit``, after opening the ledger segment of how the data are sampled.

        * A :func:`fdp_tf.poisson_batches` dataset: p = B / N is read from it and a
          DP optimizer without ``expected_batch_size`` gets B.
        * ``sampling=fdp_tf.PoissonSampling(num_examples=N, expected_batch_size=B)``:
          for any other input that is Poisson-sampled (e.g. a ``poisson_batches``
          dataset after ``.map``); you vouch for the sampling.
        * Arrays: fixed-size shuffled batches, accounted as Poisson at
          p = batch_size / N_train (N_train: the rows left after
          ``validation_split``), with a :class:`fdp_tf.SamplingWarning`.

        Raises:
          ValueError: for a DP optimizer when neither B nor p can be known (a
            dataset or generator without ``sampling=``), or when B disagrees with the
            optimizer's ``expected_batch_size``.
        """
        # Keras's positional arguments after batch_size, by name (callbacks, validation_split
        # and shuffle are read below)
        if len(args) > len(_FIT_POSITIONAL):
            raise TypeError(f"fit takes at most {3 + len(_FIT_POSITIONAL)} positional arguments")
        for name, value in zip(_FIT_POSITIONAL, args):
            if name in kwargs:
                raise TypeError(f"fit got multiple values for argument {name!r}")
            kwargs[name] = value
        split = kwargs.get("validation_split", 0.0) or 0.0
        spec, poisson = sampling_for_fit(x, batch_size, split, sampling)
        optimizer = getattr(self, "optimizer", None)
        self._open_ledger(spec, poisson, optimizer)
        replicas = self.distribute_strategy.num_replicas_in_sync
        if isinstance(x, tf.data.Dataset):
            kwargs.setdefault("shuffle", False)  # a dataset is not reshuffled by Keras anyway
            if replicas > 1:
                x = pad_to_replicas(x, replicas)
        watch = NonTrainableWatch(self.base_model) if isinstance(optimizer, DPOptimizer) else None
        callbacks = list(kwargs.pop("callbacks", None) or [])
        if watch is not None and watch.variables:
            callbacks.append(WatchFirstStep(watch))
        if watch is not None:
            callbacks.append(ReportFallbacks(self.fallback_tracker))
        return super().fit(x, y, batch_size, callbacks=callbacks, **kwargs)

    def open_segment(self, sampling: PoissonSampling) -> None:
        """Open (or continue) the ledger segment for steps at ``sampling`` (custom loops)."""
        self._open_ledger(sampling, True, getattr(self, "optimizer", None))

    def _open_ledger(self, spec: PoissonSampling | None, poisson: bool, optimizer: Any) -> None:
        if isinstance(optimizer, DPOptimizer):
            if spec is None:
                raise ValueError(
                    "fit cannot know how this input is sampled, so neither the expected batch "
                    "size B (the noise std is sigma*C/B) nor the sampling rate can be known. "
                    "Train on fdp_tf.poisson_batches(x, y, expected_batch_size=B), or pass "
                    "fit(..., sampling=fdp_tf.PoissonSampling(num_examples=N, "
                    "expected_batch_size=B)) for a Poisson-sampled pipeline of your own"
                )
            if not poisson:
                self._warn_sampling()
            self._set_expected_batch_size(optimizer, spec.expected_batch_size, strict=poisson)
            segment = optimizer.segment(spec.sampling_rate)
        else:
            rate = spec.sampling_rate if spec is not None else 1.0
            segment = Segment("non_private", 0.0, 0, rate, 0)
        table, row = table_with(keras.ops.convert_to_numpy(self.dp_ledger), segment)
        self.dp_ledger.assign(table)
        self.dp_ledger_row.assign(row)
        self._ledger_open = True

    def _set_expected_batch_size(self, optimizer: Any, size: int, *, strict: bool) -> None:
        current = optimizer.expected_batch_size
        if current is None:
            optimizer.expected_batch_size = size
            if getattr(self, "train_function", None) is not None:
                self.make_train_function(force=True)
        elif current != size and (strict or current > size):  # a larger B: too little noise
            raise ValueError(
                f"expected_batch_size of the optimizer is {current} but the data are "
                f"sampled with expected batch size {size}; they must agree (the noise std "
                "sigma*C/B uses B)"
            )

    def _warn_sampling(self) -> None:
        if self._sampling_warned:
            return
        self._sampling_warned = True
        warnings.warn(
            "PrivateModel.fit got arrays, which Keras cuts into shuffled fixed-size batches. "
            "The privacy accountant assumes Poisson sampling with rate p = B/N, so the "
            "reported epsilon is only an approximation for this data pipeline. Use "
            "fdp_tf.poisson_batches(x, y, expected_batch_size=B) for a certified bound.",
            SamplingWarning,
            stacklevel=4,
        )


def make_private(
    model: keras.Model, *, optimizer: Any = None, loss: Any = None, **compile_kwargs: Any
) -> PrivateModel:
    """Wrap ``model`` in a :class:`PrivateModel`; compile it if an optimizer is given.

    Args:
      model: any Keras model with trainable variables.
      optimizer: a DP optimizer (:class:`fdp_tf.DPAdamJL`, ...) or, for a
        non-private comparison run, any Keras optimizer. ``None`` leaves the
        model uncompiled.
      loss: a per-example loss (``reduction=None``).
      **compile_kwargs: passed to ``compile`` (``metrics``, ``jit_compile``, ...).
    """
    private = PrivateModel(model)
    if optimizer is not None:
        private.compile(optimizer=optimizer, loss=loss, **compile_kwargs)
    elif loss is not None or compile_kwargs:
        raise ValueError("optimizer must be given when loss or compile arguments are")
    return private
