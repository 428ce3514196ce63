"""What every DP optimizer of fdp_tf adds to a Keras 3 optimizer (:class:`DPOptimizer`).

The four optimizers, DP-SGD-JL, DP-Adam-JL and exact-clipping DP-SGD / DP-Adam, are in
:mod:`fdp_tf.algorithms`. Each is an ordinary ``keras.optimizers.SGD`` / ``Adam`` (same
arguments, same update rule, same saved state) plus

* a gradient path, :meth:`DPOptimizer.compute_private_gradients`, that turns a
  forward function into the clipped and noised gradient g~ (seed, Algorithm 1 /
  Algorithm 3 for JL, Algorithm 4 for exact clipping);
* a guard: :meth:`apply` (and therefore ``apply_gradients``) refuses gradients
  that did not come out of that path, so a model whose ``train_step`` skips it
  fails at the first step instead of training without privacy (the failure
  mode TF Privacy also guards against);
* a step counter ``dp_steps``: a Keras variable in the optimizer state, saved
  with the model and restored with it, which the accountant reads;
* a booking (:mod:`fdp_tf.odometer`): every noised gradient
  :meth:`compute_private_gradients` releases is counted, in the graph, in a counter
  that no checkpoint holds and no restore writes; the model's ledger reads it;
* :meth:`mechanism`: the ``fdp`` mechanism of one step, for accounting.

Keras hooks used: the public constructor, ``apply`` and ``get_config``, and one private
method of Keras's TensorFlow optimizer, ``_all_reduce_sum_gradients``, which on one
replica is skipped (see :meth:`DPOptimizer._all_reduce_sum_gradients`: otherwise every
traced step would stay in memory for the rest of the process).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import keras
import tensorflow as tf

from fdp_tf.clipping import check_batch_size
from fdp_tf.config import DPConfig, check_expected_batch_size
from fdp_tf.fallback import retried_after_crash
from fdp_tf.forward import ForwardPass, PrivateGradient
from fdp_tf.ledger import Segment
from fdp_tf.odometer import Booking
from fdp_tf.randomness import _Holder, os_entropy_generator, secret_key, seeded_generator
from fdp_tf.second_order import first_order_if_needed
from fdp_tf.verify import verified_private_gradient

__all__ = ["check_calibrated", "DPOptimizer"]


class DPOptimizer:
    """Mixin that makes a Keras optimizer differentially private.

    Subclasses combine it with a Keras optimizer class, e.g.
    ``class DPAdamJL(DPOptimizer, keras.optimizers.Adam)``.

    Args (keyword-only, besides the Keras optimizer's own):
      l2_norm_clip: C > 0, per-example clipping norm.
      noise_multiplier: sigma >= 0; the noise on the average gradient has std
        sigma * C / B. Leave it out (``None``) to have :func:`fdp_tf.make_private`
        choose it for a privacy budget (``target_epsilon=``); no step runs without it.
      expected_batch_size: B, the *expected* batch size p*N of the Poisson sampling
        (global, over all replicas). ``None`` until known: ``PrivateModel.fit`` fills
        it in from the data; a step with B unknown is refused (dividing by the
        realised batch size would make the noise scale depend on the data).
      seed: ``None`` (the default, and the only private choice): the noise and the JL
        directions come from a generator seeded by OS entropy, independent of every
        global seed. An int makes them reproducible for tests and warns
        :class:`fdp_tf.NotPrivateWarning`.

    Gradient accumulation (Keras ``gradient_accumulation_steps=k``): every
    ``apply`` is one noisy release and is counted as one step. The applied
    update averages k noisy gradients, so its noise std relative to the
    averaged signal is sigma * C / (B * sqrt(k)), while the accountant charges k
    steps at sampling rate B / N.
    """

    dp_config: DPConfig

    def __init__(
        self,
        *,
        l2_norm_clip: float,
        noise_multiplier: float | None = None,
        jl_projections: int | None = None,
        expected_batch_size: int | None = None,
        seed: int | None = None,
        jvp_method: str = "auto",
        per_example_method: str = "auto",
        **kwargs: Any,
    ) -> None:
        config = DPConfig(
            l2_norm_clip=l2_norm_clip,
            noise_multiplier=noise_multiplier,
            jl_projections=jl_projections,
            jvp_method=jvp_method,  # type: ignore[arg-type]
            per_example_method=per_example_method,  # type: ignore[arg-type]
        )
        batch = check_expected_batch_size(expected_batch_size)
        super().__init__(**kwargs)
        self.dp_config = config
        self.expected_batch_size = batch
        self.seed = seed
        # out of TF's object tracking: a checkpoint must never hold the generator state
        self._dp_rng = _Holder(
            os_entropy_generator() if seed is None else seeded_generator(seed, stacklevel=4)
        )
        self.dp_steps = keras.Variable(
            0, dtype="int64", trainable=False, name="dp_steps", aggregation="only_first_replica"
        )
        self._dp_booking = Booking(self)  # what the ledger reads: never saved, never restored
        # the JL directions' key under tf.distribute, alike on every replica (untracked)
        self._dp_directions_key = _Holder(secret_key(self._dp_rng.generator))
        self._dp_pending: tuple[Any, ...] | None = None

    # -- configuration -------------------------------------------------------

    @property
    def l2_norm_clip(self) -> float:
        return self.dp_config.l2_norm_clip

    @property
    def noise_multiplier(self) -> float | None:
        """sigma; ``None`` until :func:`fdp_tf.make_private` calibrates it to a budget."""
        return self.dp_config.noise_multiplier

    def missing_parameters(self) -> tuple[str, ...]:
        """The constructor arguments left out for :func:`fdp_tf.make_private` to choose
        (``noise_multiplier``; ``jl_projections`` of a JL optimizer); no step runs until
        they are set."""
        return ("noise_multiplier",) if self.noise_multiplier is None else ()

    def calibrated(self, noise_multiplier: float | None = None, *, jl_projections: int | None = None) -> None:
        """Set a parameter left out at construction (what :func:`fdp_tf.make_private` does
        with ``target_epsilon=``): the noise multiplier, or r of a JL optimizer.

        Raises:
          ValueError: if that parameter is already set or a step has run: a step traced
            with one value keeps it, and its steps would be booked at the other.
        """
        given = {name: value for name, value in (("noise_multiplier", noise_multiplier),
                                                  ("jl_projections", jl_projections)) if value is not None}
        missing = self.missing_parameters()
        if not given or self._dp_booking.released or any(name not in missing for name in given):
            raise ValueError(
                f"{type(self).__name__} can have only what was left out at construction "
                f"({', '.join(missing) or 'nothing'}) calibrated, once and before its first step; got "
                f"{given or 'nothing'}{' after steps ran' if self._dp_booking.released else ''}. Create a new "
                "optimizer without the parameter to have it chosen"
            )
        self.dp_config = dataclasses.replace(self.dp_config, **given)
        self._dp_booking = Booking(self)  # its segments carry the new values

    @property
    def expected_batch_size(self) -> int | None:
        return self._expected_batch_size

    @expected_batch_size.setter
    def expected_batch_size(self, value: int | None) -> None:
        self._expected_batch_size = check_expected_batch_size(value)

    @property
    def steps(self) -> int:
        """Number of private steps applied so far (restored with the optimizer)."""
        return int(keras.ops.convert_to_numpy(self.dp_steps))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            l2_norm_clip=self.dp_config.l2_norm_clip,
            noise_multiplier=self.dp_config.noise_multiplier,
            expected_batch_size=self.expected_batch_size,
            seed=self.seed,
        )
        config.update(self._method_config())
        return config

    def _method_config(self) -> dict[str, Any]:
        raise NotImplementedError

    # -- accounting ----------------------------------------------------------

    def mechanism(self, sampling_rate: float) -> Any:
        """The ``fdp`` mechanism of one step at Poisson sampling rate p = B / N."""
        raise NotImplementedError

    def segment(self, sampling_rate: float, steps: int = 0) -> Segment:
        """The ledger entry of ``steps`` steps of this optimizer at rate p."""
        raise NotImplementedError

    def epsilon(self, delta: float, sampling_rate: float, steps: int | None = None) -> float:
        """Upper bound on epsilon after ``steps`` (default: :attr:`steps`) steps at one rate.

        Computed by ``fdp.PLDAccountant().compose(self.mechanism(p), steps=n)``.
        """
        from fdp_tf.ledger import compute_epsilon

        return compute_epsilon(self, delta=delta, sampling_rate=sampling_rate, steps=steps)

    @property
    def rng(self) -> tf.random.Generator:
        """The generator of the noise and directions (OS entropy unless seeded)."""
        return self._dp_rng.generator

    # -- the private gradient path -------------------------------------------

    def compute_private_gradients(
        self,
        forward_fn: Callable[[], ForwardPass],
        variables: Sequence[Any],
        *,
        model: keras.layers.Layer | None = None,
        forward_on_rows: Callable[[tf.Tensor], ForwardPass] | None = None,
        forward_on_indices: Callable[[tf.Tensor], ForwardPass] | None = None,
    ) -> PrivateGradient:
        """Clipped, noised gradient g~ for one batch; arms :meth:`apply`.

        Args:
          forward_fn: runs the model on the batch (``training=True``) and
            returns a :class:`fdp_tf.ForwardPass` with one loss per example.
            It is called exactly once, so every quantity (norm estimates and
            the clipped gradient) comes from the same pass.
          variables: the trainable variables to differentiate.
          model: the model, used to choose the differentiation strategy
            (``jvp_method="auto"``, ``per_example_method="auto"``).
          forward_on_rows: the same forward pass on the rows where a boolean mask is
            true; lets a step be recomputed without the examples whose loss or
            gradient is not finite (see :func:`fdp_tf.nonfinite.without_nonfinite_examples`).
          forward_on_indices: the same forward pass on the batch whose row j is row
            ``indices[j]`` (``tf.gather``); lets the first step of every trace verify
            that examples do not interact and that the per-example method is right
            (:mod:`fdp_tf.verify`). Required: without it the step is refused
            (:meth:`fdp_tf.PrivateModel.private_gradients` passes all three).

        Raises:
          ValueError: if ``expected_batch_size`` or ``forward_on_indices`` is missing; eagerly, if a run-time check
            refuses the step (in a graph: ``tf.errors.InvalidArgumentError`` with the
            same message, and the gradients are not released).

        Returns:
          The ``PrivateGradient``; pass exactly its ``gradients`` to
          ``apply_gradients``.
        """
        variables = list(variables)
        if not variables:
            raise ValueError(
                "variables must be a non-empty list of trainable variables; got none "
                "(the model has no trainable variables)"
            )
        check_batch_size(self.expected_batch_size)
        check_calibrated(self)
        # a trace that meets a gradient TensorFlow lacks is traced again with first-order
        # methods; eagerly, a first choice that crashed inside TensorFlow runs its fallback
        result = first_order_if_needed(lambda: retried_after_crash(lambda: verified_private_gradient(
            self, forward_fn, variables, model, forward_on_rows, forward_on_indices), self, model), model)
        # the noised gradient leaves here: booked, however it is applied (before arming
        # apply: under MirroredStrategy the booking's merge_call lets the other replicas run)
        self._dp_booking.release()
        self._dp_pending = tuple(result.gradients)
        return result

    def _private_gradient(
        self,
        forward_fn: Callable[[], ForwardPass],
        variables: list[Any],
        model: keras.layers.Layer | None,
        method: str | None = None,
    ) -> PrivateGradient:
        """The step with ``method`` (default: what "auto" resolves to for ``model``)."""
        raise NotImplementedError

    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> Any:
        """Apply g~ from :meth:`compute_private_gradients`; refuse anything else.

        Raises:
          RuntimeError: if the gradients were not produced by
            :meth:`compute_private_gradients` since the last ``apply`` (e.g. a
            plain ``keras.Model`` computed ordinary gradients).
        """
        pending, self._dp_pending = self._dp_pending, None
        grads = list(grads)
        if pending is None or len(pending) != len(grads) or any(
            g is not p for g, p in zip(grads, pending)
        ):
            raise RuntimeError(
                f"{type(self).__name__}.apply_gradients() was called with gradients that "
                "did not come from compute_private_gradients(): the differentially "
                "private clipping and noise were skipped. Wrap the model with "
                "fdp_tf.make_private(model, ...) / fdp_tf.PrivateModel(model), or in a "
                "custom loop pass optimizer.compute_private_gradients(...).gradients."
            )
        self.dp_steps.assign_add(1)
        return super().apply(grads, trainable_variables)  # type: ignore[misc]

    def _all_reduce_sum_gradients(self, grads_and_vars: Any) -> Any:
        """Keras's sum of the gradients over replicas; with one replica, the gradients as they are.

        Keras calls ``ReplicaContext.all_reduce`` even with one replica, where the sum is the
        identity. In a graph that call wraps the gradients in a ``tf.custom_gradient``, which
        registers a gradient function in TensorFlow's process-wide gradient registry and never
        unregisters it; the function's closure holds the step's tensors, so every traced step
        (the whole private step: probe, ``tf.cond`` branches, per-example gradients) could
        never be freed, 60-90 MiB per model (``benchmarks/model_memory.py``). Skipping the
        identity changes no value. With several replicas the gradients (each replica's noise
        share included) are summed by Keras as before; that trace stays pinned, as in Keras.

        Keras's private method, overridden on purpose: the public alternative tried (Keras's
        ``apply`` in a ``tf.function`` of its own, so only that small graph is pinned) fails
        under a one-replica ``MultiWorkerMirroredStrategy`` ("merge_call called while
        defining a new graph") and still pins one graph per model. If Keras renames this
        method the override stops running and ``tests/tf/test_tf_model_memory.py`` fails.
        """
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return list(grads_and_vars)
        return super()._all_reduce_sum_gradients(grads_and_vars)  # type: ignore[misc]


def check_calibrated(optimizer: DPOptimizer) -> None:
    """Refuse an optimizer with a parameter left out and never calibrated (no step may run
    with an unknown noise multiplier or r)."""
    missing = optimizer.missing_parameters()
    if missing:
        words = " and ".join(missing)
        raise ValueError(
            f"{words} of {type(optimizer).__name__} {'is' if len(missing) == 1 else 'are'} None: give "
            f"{' and '.join(f'{name}=...' for name in missing)}, or let fdp_tf.make_private(model, "
            "optimizer=..., loss=..., target_epsilon=..., delta=..., epochs=..., data=...) choose "
            + ("the smallest noise multiplier" if "noise_multiplier" in missing else "the fewest projections r")
            + " that keeps the run within that budget"
            + (" (it chooses one of the two: give the other)" if len(missing) == 2 else "")
        )
