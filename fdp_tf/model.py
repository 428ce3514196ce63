"""``PrivateModel``: any Keras model, trained with a DP optimizer via public hooks.

The wrapper overrides ``Model.train_step`` (and ``test_step`` / ``compute_loss``
for a consistent per-example loss): the forward pass runs inside the
optimizer's :meth:`~fdp_tf.DPOptimizer.compute_private_gradients`, which
returns the clipped and noised gradient, and the ordinary ``apply_gradients``
applies it. ``compile``, ``fit``, ``evaluate``, ``predict``, callbacks and
saving are Keras's own. Every private step is booked where the optimizer releases
it, in the model's privacy odometer (:mod:`fdp_tf.odometer`); its ledger is saved
with the weights, and no restore lowers it.

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

import sys
from typing import Any

import keras
import tensorflow as tf

from fdp_tf.fallback import guarded_train_function
from fdp_tf.fit_booking import armed_step, booked_as_fit
from fdp_tf.forward import ForwardPass, PrivateGradient, stand_in_row, trim_to_rows
from fdp_tf.guards import refuse_multiple_outputs, refuse_unsupported_layers, refuse_xla_through_loops
from fdp_tf.ledger import FIELDS, MAX_SEGMENTS, empty_table
from fdp_tf.losses import PerExampleLoss, per_example_loss_fn
from fdp_tf.model_fit import LedgerFit
from fdp_tf.odometer import Odometer
from fdp_tf.optimizers import DPOptimizer, check_calibrated
from fdp_tf.probes import one_loss_per_row

__all__ = ["PrivateModel", "make_private", "per_example_loss_fn"]


@keras.saving.register_keras_serializable(package="fdp_tf")
class PrivateModel(LedgerFit, keras.Model):
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
        # what files carry: a copy of the odometer, written before every save and merged
        # into it after every restore (see fdp_tf.odometer)
        self.dp_ledger = self.add_weight(
            shape=(MAX_SEGMENTS, FIELDS), dtype="float64", trainable=False, name="dp_ledger",
            initializer=keras.initializers.Constant(empty_table()),
            aggregation="only_first_replica",
        )
        self._odometer = Odometer()  # not a weight: no restore writes it
        self.budget: Any = None  # an fdp_tf.Budget when make_private chose the noise for one
        self._per_example_loss: PerExampleLoss | None = None

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
        if isinstance(optimizer, DPOptimizer):
            check_calibrated(optimizer)
            refuse_unsupported_layers(self)
            refuse_multiple_outputs(self.base_model)
            if kwargs.get("jit_compile", "auto") == "auto":
                # XLA support of forward-mode accumulators and while-loop jacobians
                # is not tested here; opt in with jit_compile=True.
                kwargs["jit_compile"] = False
        super().compile(optimizer, loss, *args, **kwargs)
        self._odometer.attach(self.optimizer)  # every step it releases from now on is booked

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

    def forward_pass(self, x: Any, y: Any, sample_weight: Any = None,
                     rows: tf.Tensor | None = None) -> ForwardPass:
        """Run the model in training mode and return per-example losses (one pass).

        ``rows``: the batch's row count before :func:`fdp_tf.forward.stand_in_row`; with 0,
        the row of zeros standing in gets loss 0 (so gradient 0, released as nothing)."""
        y_pred = self(x, training=True)
        refuse_multiple_outputs(self.base_model, y_pred)
        losses = one_loss_per_row(self.per_example_loss(y, y_pred, sample_weight), x)
        if rows is not None:
            losses = tf.where(rows > 0, losses, tf.zeros_like(losses))
        return ForwardPass(losses, self._regularization(), y_pred)

    # -- steps -------------------------------------------------------------------

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's own ``train_step`` is armed like this one (:func:`fdp_tf.fit_booking.armed_step`)."""
        super().__init_subclass__(**kwargs)
        if "train_step" in cls.__dict__:
            cls.train_step = armed_step(cls.__dict__["train_step"])  # type: ignore[method-assign]

    @armed_step
    def train_step(self, data: Any) -> dict[str, Any]:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        self._build_from(x)
        variables = self.trainable_variables
        if not variables:
            raise ValueError("model has no trainable variables; nothing to train privately")
        optimizer = self.optimizer
        if isinstance(optimizer, DPOptimizer):
            result = self.private_gradients(x, y, sample_weight)
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
        self._track_loss(forward)
        logs = self.compute_metrics(x, y, forward.outputs, sample_weight=sample_weight)
        logs.pop(self.fallback_tracker.name, None)  # reported by ReportFallbacks instead
        return logs

    def private_gradients(self, x: Any, y: Any, sample_weight: Any = None) -> PrivateGradient:
        """The DP optimizer's private gradient for one batch, with every run-time check.

        What a custom ``train_step`` calls: it passes the optimizer the forward pass and
        the batch's row-wise variants it verifies and drops rows with
        (:meth:`fdp_tf.DPOptimizer.compute_private_gradients`); apply exactly
        ``result.gradients`` with ``self.optimizer.apply_gradients``.
        """
        optimizer = self.optimizer
        if not isinstance(optimizer, DPOptimizer):
            raise ValueError(f"private_gradients needs a DP optimizer; compiled with {type(optimizer).__name__}")
        # an empty batch runs the model on a row of zeros whose loss is multiplied by 0:
        # the step releases the noise alone (some CPU kernels crash on zero rows). XLA runs
        # zero rows itself, and aborts on the stand-in's value-dependent shape.
        rows = None
        if not getattr(self, "jit_compile", False):
            x, y, sample_weight, rows = stand_in_row(x, y, sample_weight)
        result = optimizer.compute_private_gradients(
            lambda: self.forward_pass(x, y, sample_weight, rows), self.trainable_variables, model=self.base_model,
            forward_on_rows=lambda keep: self._forward_on_rows(keep, x, y, sample_weight, rows),
            forward_on_indices=lambda picked: self._forward_on_indices(picked, x, y, sample_weight, rows),
        )
        return trim_to_rows(result, rows)

    def _forward_on_indices(self, picked: tf.Tensor, x: Any, y: Any, sample_weight: Any,
                            rows: tf.Tensor | None = None) -> ForwardPass:
        pick = lambda t: None if t is None else tf.gather(t, picked)  # noqa: E731
        return self.forward_pass(
            tf.nest.map_structure(pick, x), tf.nest.map_structure(pick, y), pick(sample_weight), rows
        )

    def _build_from(self, x: Any) -> None:
        """Build a model whose variables do not exist yet (an unbuilt Sequential, a
        subclassed model before its first call) by a symbolic call on the first batch's
        shapes: Keras's TF trainer builds it only as the step traces, after the trainable
        variables were read. A symbolic call adds no op to the step."""
        if self.base_model.built and self.base_model.trainable_variables:
            return
        spec = tf.nest.map_structure(
            lambda t: keras.KerasTensor((None, *tuple(t.shape)[1:]), tf.as_dtype(t.dtype).name), x)
        try:
            self.base_model(spec, training=False)
        except Exception as err:  # noqa: BLE001 - whatever fails, the advice is the same
            raise ValueError(
                f"model {self.base_model.name!r} is not built and could not be built from the "
                f"first batch ({type(err).__name__}: {err}); start it with keras.Input(shape) or "
                "call model.build(input_shape) / run it on one batch before fit"
            ) from err

    def make_train_function(self, force: bool = False) -> Any:
        """Keras's training function, raising a run-time refusal of a private step as the
        ``ValueError`` it is, and retrying once a first step that crashed inside an
        unverified per-example method (:func:`fdp_tf.fallback.guarded_train_function`).

        Raises:
          ValueError: for ``jit_compile=True`` with a DP optimizer through a looped
            recurrent layer (XLA crashes on it; checked here, since ``jit_compile``
            can be set after ``compile``)."""
        refuse_xla_through_loops(self.base_model, getattr(self, "optimizer", None), self.jit_compile)
        super().make_train_function(force)
        if self.train_function is not None and not getattr(self.train_function, "_fdp_guarded", False):
            # fit vouches for one release per step of its own loop
            self.train_function = booked_as_fit(guarded_train_function(self.train_function, self), self)
        return self.train_function

    def _forward_on_rows(self, keep: tf.Tensor, x: Any, y: Any, sample_weight: Any,
                         rows: tf.Tensor | None = None) -> ForwardPass:
        pick = lambda t: None if t is None else tf.boolean_mask(t, keep)  # noqa: E731
        return self.forward_pass(
            tf.nest.map_structure(pick, x), tf.nest.map_structure(pick, y), pick(sample_weight), rows
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
        # no boolean mask: its data-dependent size crashes XLA's compiler in some runs
        count = tf.reduce_sum(tf.cast(finite, losses.dtype))
        mean = tf.math.divide_no_nan(tf.reduce_sum(tf.where(finite, losses, tf.zeros_like(losses))), count)
        if forward.regularization is not None:
            mean = mean + tf.cast(forward.regularization, mean.dtype)
        self.loss_tracker.update_state(mean, sample_weight=count)

def make_private(
    model: keras.Model, *, optimizer: Any = None, loss: Any = None, target_epsilon: float | None = None,
    delta: float | None = None, epochs: int | None = None, data: Any = None, verbose: bool = True,
    **compile_kwargs: Any,
) -> PrivateModel:
    """Wrap ``model`` in a :class:`PrivateModel`; compile it if an optimizer is given.

    Budget first: give ``target_epsilon``, ``delta``, ``epochs`` and the training
    ``data`` with a DP optimizer created *without* ``noise_multiplier``, and the
    smallest noise multiplier whose certified epsilon after ``epochs`` passes over
    ``data`` is at most ``target_epsilon`` is chosen before the first step
    (:func:`fdp_tf.noise_multiplier_for`). A JL optimizer created with
    ``noise_multiplier`` but *without* ``jl_projections`` gets the fewest projections r
    that meet the budget instead (:func:`fdp_tf.jl_projections_for`; fewer directions,
    a cheaper step). The choice is printed (``verbose``) and kept in ``model.budget``;
    ``fit`` warns if it is asked to run past the plan.

    Args:
      model: any Keras model with trainable variables.
      optimizer: a DP optimizer (:class:`fdp_tf.DPAdamJL`, ...) or, for a
        non-private comparison run, any Keras optimizer. ``None`` leaves the
        model uncompiled.
      loss: a per-example loss (``reduction=None``).
      target_epsilon: the privacy budget eps* > 0 (with ``delta``, ``epochs``, ``data``).
      delta: delta of the budget, in (0, 1); below 1 / N.
      epochs: the passes ``fit`` will run, >= 1.
      data: the dataset ``fit`` will train on, from :func:`fdp_tf.poisson_batches`,
        :func:`fdp_tf.random_allocation_batches` or
        :func:`fdp_tf.without_replacement_batches` (or its spec): how batches are
        drawn decides what a step costs.
      verbose: print what was chosen and what it is for (and, on a terminal, the search's
        progress).
      **compile_kwargs: passed to ``compile`` (``metrics``, ``jit_compile``, ...).

    Raises:
      ValueError: a budget with a missing part, with an optimizer that has nothing left
        to choose (or both sigma and r left out) or is not a DP optimizer, or that no
        noise multiplier (no r) meets.

    Examples:

        optimizer = fdp_tf.DPAdamJL(l2_norm_clip=1.0, jl_projections=30, learning_rate=1e-3)
        batches = fdp_tf.poisson_batches(x_train, y_train, expected_batch_size=256)
        model = fdp_tf.make_private(model, optimizer=optimizer, loss=loss,
                                    target_epsilon=8.0, delta=1e-5, epochs=15, data=batches)
        model.fit(batches, epochs=15,
                  callbacks=[fdp_tf.PrivacyCallback(delta=1e-5, stop_at_epsilon=8.0)])

        # or sigma fixed and the fewest projections chosen:
        optimizer = fdp_tf.DPAdamJL(l2_norm_clip=1.0, noise_multiplier=0.8, learning_rate=1e-3)
    """
    from fdp_tf.budget import calibrate_optimizer

    budget = None
    if target_epsilon is not None:
        budget = calibrate_optimizer(optimizer, target_epsilon, delta, epochs, data,
                                     progress=verbose and sys.stderr.isatty())
        if verbose:
            print(f"fdp_tf.make_private: {budget.describe()}")
    elif (delta, epochs, data) != (None, None, None):
        raise ValueError("delta, epochs and data are for a privacy budget: give target_epsilon with them "
                         "(or leave all four out and set the optimizer's noise_multiplier)")
    private = PrivateModel(model)
    private.budget = budget
    if optimizer is not None:
        private.compile(optimizer=optimizer, loss=loss, **compile_kwargs)
    elif loss is not None or compile_kwargs:
        raise ValueError("optimizer must be given when loss or compile arguments are")
    return private

