"""``PrivateModel``: any Keras model, trained with a DP optimizer via public hooks.

The wrapper overrides ``Model.train_step`` (and ``test_step`` / ``compute_loss``
for a consistent per-example loss): the forward pass runs inside the
optimizer's :meth:`~fdp_tf.DPOptimizer.compute_private_gradients`, which
returns the clipped and noised gradient, and the ordinary ``apply_gradients``
applies it. ``compile``, ``fit``, ``evaluate``, ``predict``, callbacks and
saving are Keras's own.

Typical use::

    model = fdp_tf.make_private(
        model,
        optimizer=fdp_tf.DPAdamJL(l2_norm_clip=1.0, noise_multiplier=0.6,
                                  jl_projections=5, learning_rate=1e-3),
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
from typing import Any, Callable

import keras
import tensorflow as tf

from fdp_tf.gradients import ForwardPass
from fdp_tf.optimizers import DPOptimizer
from fdp_tf.sampling import SamplingWarning, poisson_sampling_of

__all__ = ["PrivateModel", "make_private", "per_example_loss_fn"]

PerExampleLoss = Callable[[Any, Any, Any], tf.Tensor]


def per_example_loss_fn(loss: Any) -> PerExampleLoss:
    """Check ``loss`` gives one value per example; return ``f(y, y_pred, w) -> [b]``.

    Accepted: a ``keras.losses.Loss`` with ``reduction=None`` (or ``"none"``), a
    loss function such as ``keras.losses.sparse_categorical_crossentropy`` or
    its string name. Losses with non-batch axes left (e.g. per time step) are
    averaged over those axes. Sample weights multiply each example's loss.

    Raises:
      ValueError: naming the loss, if it reduces over the batch (DP needs
        l_1..l_b to clip each example), is missing, or is a dict/list.
    """
    if loss is None:
        raise ValueError(
            "loss must be given: a per-example loss such as "
            "keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)"
        )
    if isinstance(loss, (dict, list, tuple)):
        raise ValueError(
            f"loss must be a single per-example loss; got {type(loss).__name__} "
            "(multi-output losses are not supported by PrivateModel)"
        )
    resolved = keras.losses.get(loss) if isinstance(loss, str) else loss
    if isinstance(resolved, keras.losses.Loss):
        if resolved.reduction not in (None, "none"):
            raise ValueError(
                f"loss {_loss_name(loss)} has reduction={resolved.reduction!r}, which "
                "averages over the batch; differentially private training clips each "
                "example's gradient and needs one loss per example. Pass reduction=None, "
                f"e.g. keras.losses.{type(resolved).__name__}(..., reduction=None)."
            )
    elif not callable(resolved):
        raise ValueError(f"loss must be a Keras loss or a callable; got {loss!r}")
    name = _loss_name(loss)

    def compute(y: Any, y_pred: Any, sample_weight: Any = None) -> tf.Tensor:
        if isinstance(resolved, keras.losses.Loss):
            values = resolved(y, y_pred, sample_weight=sample_weight)
            weighted = True
        else:
            values = resolved(y, y_pred)
            weighted = False
        values = tf.convert_to_tensor(values)
        if values.shape.rank == 0:
            raise ValueError(
                f"loss {name} returned a scalar (a loss reduced over the batch); "
                "differentially private training needs one loss per example, shape "
                "[batch]. Use a Keras loss with reduction=None."
            )
        if values.shape.rank > 1:
            values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
        if sample_weight is not None and not weighted:
            values = values * tf.cast(tf.reshape(sample_weight, (-1,)), values.dtype)
        return values

    return compute


def _loss_name(loss: Any) -> str:
    if isinstance(loss, str):
        return repr(loss)
    if isinstance(loss, keras.losses.Loss):
        return f"{type(loss).__name__}(name={loss.name!r})"
    return getattr(loss, "__name__", repr(loss))


@keras.saving.register_keras_serializable(package="fdp_tf")
class PrivateModel(keras.Model):
    """Wrap a Keras model so that ``fit`` runs DP-SGD(-JL) with a DP optimizer.

    With a :class:`fdp_tf.DPOptimizer` each training step computes
    g~ = (1/B) sum_i c_i grad l_i + (sigma C / B) N(0, I) from one forward
    pass; with any other Keras optimizer it trains without privacy on the mean
    per-example loss (for comparison runs).

    Args:
      model: the Keras model (any architecture; must have trainable variables).
      **kwargs: ``keras.Model`` arguments such as ``name``.

    Attributes:
      base_model: the wrapped model.
      sampling_rate: p = B / N of the data seen by the last ``fit`` when it is
        known (a :func:`fdp_tf.poisson_batches` dataset, or arrays with
        ``batch_size``); read by :class:`fdp_tf.PrivacyCallback`.
    """

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
        self.sampling_rate: float | None = None
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
        """Keras ``compile``; ``loss`` must give one value per example (reduction=None)."""
        self._per_example_loss = per_example_loss_fn(loss)
        from fdp_tf.introspection import iter_layers

        policies = {getattr(layer.dtype_policy, "name", "float32") for layer in iter_layers(self)}
        policy = next((p for p in sorted(policies) if p.startswith("mixed_")), "float32")
        if isinstance(optimizer, DPOptimizer) and policy.startswith("mixed_"):
            # Keras would wrap the optimizer in a LossScaleOptimizer, which applies
            # gradients that did not go through the private clipping and noise
            raise ValueError(
                f"mixed precision (dtype policy {policy!r}) is not supported with the DP "
                "optimizers: loss scaling wraps the optimizer and bypasses its clipping and "
                "noise. Build the model under keras.mixed_precision.set_global_policy('float32')"
            )
        if isinstance(optimizer, DPOptimizer) and kwargs.get("jit_compile", "auto") == "auto":
            # XLA support of forward-mode accumulators and while-loop jacobians
            # is not tested here; opt in with jit_compile=True.
            kwargs["jit_compile"] = False
        super().compile(optimizer, loss, *args, **kwargs)

    def get_compile_config(self) -> dict[str, Any]:
        return super().get_compile_config()

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
        data_losses = [loss for layer in self._flatten_layers(include_self=True)
                       for loss in layer._get_own_losses()]
        if data_losses:
            raise ValueError(
                "the model adds losses with add_loss or activity_regularizer; they depend on the "
                "examples, and their gradient would not be clipped per example. Put such terms "
                "into the per-example loss, or use weight regularizers (kernel_regularizer, ...)"
            )
        extra = self._get_regularization_losses()
        return tf.add_n([tf.cast(v, "float32") for v in extra]) if extra else None

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
        optimizer = self.optimizer
        if isinstance(optimizer, DPOptimizer):
            result = optimizer.compute_private_gradients(
                lambda: self.forward_pass(x, y, sample_weight), variables, model=self
            )
            grads, forward = result.gradients, result.forward
        else:
            with tf.GradientTape() as tape:
                forward = self.forward_pass(x, y, sample_weight)
                total = tf.reduce_mean(forward.per_example_losses)
                if forward.regularization is not None:
                    total = total + forward.regularization
            grads = tape.gradient(total, variables)
        optimizer.apply_gradients(zip(grads, variables))
        self._track_loss(forward)
        return self.compute_metrics(x, y, forward.outputs, sample_weight=sample_weight)

    def test_step(self, data: Any) -> dict[str, Any]:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = self(x, training=False)
        losses = self.per_example_loss(y, y_pred, sample_weight)
        self._track_loss(ForwardPass(losses, self._regularization(), y_pred))
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _track_loss(self, forward: ForwardPass) -> None:
        losses = forward.per_example_losses
        count = tf.cast(tf.shape(losses)[0], losses.dtype)
        mean = tf.math.divide_no_nan(tf.reduce_sum(losses), count)
        if forward.regularization is not None:
            mean = mean + tf.cast(forward.regularization, mean.dtype)
        self.loss_tracker.update_state(mean, sample_weight=count)

    # -- fit: sampling bookkeeping -------------------------------------------------

    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, *args: Any,
            **kwargs: Any) -> Any:
        """Keras ``fit``, after recording how the data are sampled.

        * A :func:`fdp_tf.poisson_batches` dataset: p = B / N is recorded and a
          DP optimizer without ``expected_batch_size`` gets B.
        * Anything else (arrays, other datasets, generators): a
          :class:`fdp_tf.SamplingWarning` is issued once, because the
          accountant assumes Poisson sampling. For arrays, p = batch_size / N
          is recorded and used as the (approximate) sampling rate.
        """
        self._record_sampling(x, batch_size)
        if isinstance(x, tf.data.Dataset) and len(args) < 6:  # shuffle is the 6th after batch_size
            kwargs.setdefault("shuffle", False)  # a dataset is not reshuffled by Keras anyway
        return super().fit(x, y, batch_size, *args, **kwargs)

    def _record_sampling(self, x: Any, batch_size: int | None) -> None:
        spec = poisson_sampling_of(x)
        optimizer = getattr(self, "optimizer", None)
        if spec is not None:
            self._set_sampling_rate(spec.sampling_rate, optimizer)
            self._set_expected_batch_size(optimizer, spec.expected_batch_size, strict=True)
            return
        if isinstance(optimizer, DPOptimizer):
            self._warn_sampling()
        n = _array_rows(x)
        if n is not None:
            size = min(batch_size or 32, n)
            self._set_sampling_rate(size / n, optimizer)
            self._set_expected_batch_size(optimizer, size, strict=False)

    def _set_sampling_rate(self, rate: float, optimizer: Any) -> None:
        """Record p for the accountant. The optimizer counts steps, not their rates, so once
        steps have been taken at another rate every step is charged at the largest rate
        seen (epsilon grows with p: an upper bound), with a warning."""
        previous = self.sampling_rate
        taken = optimizer.steps if isinstance(optimizer, DPOptimizer) else 0
        if previous is not None and taken > 0 and rate != previous:
            warnings.warn(
                f"this fit samples at rate {rate:.6g}, earlier steps at {previous:.6g}; epsilon "
                f"now charges all steps at the larger rate {max(rate, previous):.6g} (an upper "
                "bound). For exact accounting of phases compose them in an fdp.PLDAccountant",
                UserWarning,
                stacklevel=4,
            )
            rate = max(rate, previous)
        self.sampling_rate = rate

    def _set_expected_batch_size(self, optimizer: Any, size: int, *, strict: bool) -> None:
        if not isinstance(optimizer, DPOptimizer):
            return
        current = optimizer.expected_batch_size
        if current is None:
            optimizer.expected_batch_size = size
            if getattr(self, "train_function", None) is not None:
                self.make_train_function(force=True)
        elif strict and current != size:
            raise ValueError(
                f"expected_batch_size of the optimizer is {current} but the Poisson "
                f"dataset was built with expected_batch_size={size}; they must agree "
                "(the noise scale sigma*C/B uses B)"
            )

    def _warn_sampling(self) -> None:
        if self._sampling_warned:
            return
        self._sampling_warned = True
        warnings.warn(
            "PrivateModel.fit got data that is not from fdp_tf.poisson_batches (e.g. "
            "fixed-size shuffled batches). The privacy accountant assumes Poisson "
            "sampling with rate p = B/N, so the reported epsilon is only an "
            "approximation for this data pipeline. Use "
            "fdp_tf.poisson_batches(x, y, expected_batch_size=B) for a certified bound.",
            SamplingWarning,
            stacklevel=3,
        )


def _array_rows(x: Any) -> int | None:
    """Number of rows of array-like ``x`` (or a nest of arrays); None for datasets etc."""
    if x is None or isinstance(x, tf.data.Dataset):
        return None
    leaves = tf.nest.flatten(x)
    try:
        return int(leaves[0].shape[0]) if leaves and hasattr(leaves[0], "shape") else None
    except (TypeError, IndexError):
        return None


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
