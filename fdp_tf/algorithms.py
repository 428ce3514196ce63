"""The four DP optimizers: DP-SGD-JL and DP-Adam-JL (seed, Algorithms 1 and 3), exact-clipping
DP-SGD and DP-Adam (seed, Algorithm 4; Abadi et al. 2016).

Each is a ``keras.optimizers.SGD`` / ``Adam`` with :class:`fdp_tf.optimizers.DPOptimizer`
(the private gradient path, the guard on ``apply``, the booking) and one mixin saying how
the per-example clipping factors are computed: from the JL estimates M_i of
:mod:`fdp_tf.jl`, or from exact per-example norms (:mod:`fdp_tf.per_example`).
"""

from __future__ import annotations

from typing import Any

import keras

from fdp_tf.jl import jl_private_gradient
from fdp_tf.ledger import Segment
from fdp_tf.methods import resolve_jvp_method, resolve_per_example_method
from fdp_tf.optimizers import DPOptimizer
from fdp_tf.per_example import vanilla_private_gradient
from fdp_tf.randomness import StepRandomness

__all__ = ["DPAdamJL", "DPAdamVanilla", "DPSGDJL", "DPSGDVanilla"]


class _JLMixin(DPOptimizer):
    """DP-SGD-JL / DP-Adam-JL gradient (seed, Algorithm 1 and Algorithm 3)."""

    def __init__(self, *, jl_projections: int | None = None, jvp_method: str = "auto", **kwargs: Any) -> None:
        kwargs.pop("per_example_method", None)
        super().__init__(jl_projections=jl_projections, jvp_method=jvp_method, **kwargs)

    @property
    def jl_projections(self) -> int | None:
        """r; ``None`` until :func:`fdp_tf.make_private` chooses the fewest for a budget."""
        return self.dp_config.jl_projections

    def missing_parameters(self) -> tuple[str, ...]:
        missing = super().missing_parameters()
        return missing + (("jl_projections",) if self.jl_projections is None else ())

    def _method_config(self) -> dict[str, Any]:
        return {"jl_projections": self.jl_projections, "jvp_method": self.dp_config.jvp_method}

    def mechanism(self, sampling_rate: float) -> Any:
        import fdp

        return fdp.JL(
            noise_multiplier=self.noise_multiplier,
            jl_projections=self.jl_projections,
            sampling_rate=sampling_rate,
        )

    def segment(self, sampling_rate: float, steps: int = 0) -> Segment:
        return Segment("jl", self.noise_multiplier, self.jl_projections, sampling_rate, steps)

    def resolve_jvp_method(self, model: keras.layers.Layer | None = None) -> str:
        """What ``jvp_method`` (``"auto"``: see :func:`fdp_tf.methods.resolve_jvp_method`)
        runs for ``model``: forward mode (``"auto"``), ``"layerwise"``, ``"double_vjp"`` or ``"loop"``."""
        return resolve_jvp_method(self.dp_config.jvp_method, self.jl_projections, model)

    def _private_gradient(self, forward_fn, variables, model, method=None):  # type: ignore[no-untyped-def]
        return jl_private_gradient(
            forward_fn,
            variables,
            l2_norm_clip=self.l2_norm_clip,
            noise_multiplier=self.noise_multiplier,
            jl_projections=self.jl_projections,
            expected_batch_size=self.expected_batch_size,
            rng=StepRandomness(self.rng, shared=(self._dp_directions_key.generator, self._dp_booking.counter)),
            jvp_method=method or self.resolve_jvp_method(model),
            model=model,
        )


class _VanillaMixin(DPOptimizer):
    """DP-SGD / DP-Adam with exact per-example clipping (seed, Algorithm 4)."""

    def __init__(self, *, per_example_method: str = "auto", **kwargs: Any) -> None:
        kwargs.pop("jl_projections", None)
        kwargs.pop("jvp_method", None)
        super().__init__(per_example_method=per_example_method, **kwargs)

    def _method_config(self) -> dict[str, Any]:
        return {"per_example_method": self.dp_config.per_example_method}

    def mechanism(self, sampling_rate: float) -> Any:
        import fdp

        return fdp.Gaussian(noise_multiplier=self.noise_multiplier, sampling_rate=sampling_rate)

    def segment(self, sampling_rate: float, steps: int = 0) -> Segment:
        return Segment("gaussian", self.noise_multiplier, 0, sampling_rate, steps)

    def resolve_per_example_method(self, model: keras.layers.Layer | None = None) -> str:
        """What ``per_example_method`` (``"auto"``: see
        :func:`fdp_tf.methods.resolve_per_example_method`) runs for ``model``."""
        return resolve_per_example_method(self.dp_config.per_example_method, model)

    def _private_gradient(self, forward_fn, variables, model, method=None):  # type: ignore[no-untyped-def]
        return vanilla_private_gradient(
            forward_fn,
            variables,
            l2_norm_clip=self.l2_norm_clip,
            noise_multiplier=self.noise_multiplier,
            expected_batch_size=self.expected_batch_size,
            rng=self.rng,
            per_example_method=method or self.resolve_per_example_method(model),
            model=model,
        )


@keras.saving.register_keras_serializable(package="fdp_tf")
class DPSGDJL(_JLMixin, keras.optimizers.SGD):
    """DP-SGD-JL (seed, Algorithm 1): SGD on g~ with JL-estimated clipping.

    Examples:

        opt = fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=1.1,
                             jl_projections=5, learning_rate=0.1)

    Keyword arguments: those of :class:`DPOptimizer`, ``jl_projections`` (r >= 1),
    ``jvp_method`` (``"auto"``, ``"layerwise"``, ``"forward"``, ``"double_vjp"``,
    ``"loop"``) and those of ``keras.optimizers.SGD`` (``learning_rate``, ``momentum``, ``nesterov``, ...).
    """


@keras.saving.register_keras_serializable(package="fdp_tf")
class DPAdamJL(_JLMixin, keras.optimizers.Adam):
    """DP-Adam-JL (seed, Algorithm 3): Adam on g~ with JL-estimated clipping.

    Keyword arguments: those of :class:`DPOptimizer`, ``jl_projections``,
    ``jvp_method`` and those of ``keras.optimizers.Adam`` (``learning_rate``,
    ``beta_1``, ``beta_2``, ``epsilon``, ...).
    """


@keras.saving.register_keras_serializable(package="fdp_tf")
class DPSGDVanilla(_VanillaMixin, keras.optimizers.SGD):
    """DP-SGD with exact per-example clipping (seed, Algorithm 4; Abadi et al. 2016).

    Keyword arguments: those of :class:`DPOptimizer`, ``per_example_method``
    (``"auto"``, ``"layerwise"``, ``"vectorized"``, ``"loop"``) and those of ``keras.optimizers.SGD``.
    """


@keras.saving.register_keras_serializable(package="fdp_tf")
class DPAdamVanilla(_VanillaMixin, keras.optimizers.Adam):
    """DP-Adam with exact per-example clipping (the seed's "DP-Adam-Vanilla").

    Keyword arguments: those of :class:`DPOptimizer`, ``per_example_method`` and
    those of ``keras.optimizers.Adam``.
    """
