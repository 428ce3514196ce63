"""Validated, immutable settings of one differentially private optimizer.

Notation (Bu et al., "Fast and Memory Efficient Differentially Private-SGD via
JL Projections", arXiv:2102.03013v1, Algorithm 1):

    C      l2_norm_clip         clipping norm of each per-example gradient
    sigma  noise_multiplier     noise std on the *sum* of clipped gradients is sigma*C
    r      jl_projections       number of Gaussian directions v_1..v_r (JL only)
    B      expected_batch_size  the averaging constant; with Poisson sampling the
                                *expected* batch size p*N, never the realised one
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fdp._validation import check_integer, check_real

__all__ = [
    "JVP_METHODS",
    "PER_EXAMPLE_METHODS",
    "MAX_NESTED_FORWARD_PROJECTIONS",
    "DPConfig",
    "check_expected_batch_size",
]

JvpMethod = Literal["auto", "layerwise", "forward", "double_vjp", "loop"]
PerExampleMethod = Literal["auto", "layerwise", "vectorized", "loop"]

JVP_METHODS: tuple[str, ...] = ("auto", "layerwise", "forward", "double_vjp", "loop")
PER_EXAMPLE_METHODS: tuple[str, ...] = ("auto", "layerwise", "vectorized", "loop")

# r nested tf.autodiff.ForwardAccumulators share one forward pass, but the traced
# graph grows faster than 2**r (measured on a 2-layer MLP: 124, 278, 5065 ops for
# r = 1, 2, 4; r = 5 crashes the tracer). Above this the double-vjp path is used.
MAX_NESTED_FORWARD_PROJECTIONS = 2


@dataclass(frozen=True)
class DPConfig:
    """Clipping and noise of one DP optimizer; validated on construction.

    Args:
      l2_norm_clip: C > 0.
      noise_multiplier: sigma >= 0 (0 gives no privacy; useful for tests), or ``None``
        until :func:`fdp_tf.make_private` calibrates it to a privacy budget
        (``target_epsilon=``); no step runs while it is ``None``.
      jl_projections: r >= 1 for DP-SGD-JL / DP-Adam-JL; ``None`` for exact
        per-example clipping (DP-SGD of Abadi et al., the seed's Algorithm 4).
      jvp_method: how the JL projections P_ij = <grad l_i, v_j> are computed:
        ``"layerwise"`` (from the layers' inputs and backpropagated gradients, one
        forward and one backward pass for any r, through LSTM/GRU/SimpleRNN too),
        ``"forward"`` (forward-mode JVP, nested accumulators, r <= 2),
        ``"double_vjp"`` (reverse-over-reverse, any r, works through
        ``tf.while_loop``), ``"loop"`` (exact per-example gradients, one backward
        pass per example), or ``"auto"`` (decided per model).
      per_example_method: how exact per-example gradients are computed
        (``"layerwise"`` = exact norms layer by layer from activations and
        backpropagated gradients, then one reweighted backward pass;
        ``"vectorized"`` = ``GradientTape.jacobian`` with pfor, ``"loop"`` =
        one backward pass per example, ``"auto"``).

    Raises:
      ValueError: naming the argument, the value and the allowed range.
    """

    l2_norm_clip: float
    noise_multiplier: float | None
    jl_projections: int | None = None
    jvp_method: JvpMethod = "auto"
    per_example_method: PerExampleMethod = "auto"

    def __post_init__(self) -> None:
        clip = check_real("l2_norm_clip", self.l2_norm_clip, low=0.0, low_inclusive=False)
        object.__setattr__(self, "l2_norm_clip", clip)
        if self.noise_multiplier is not None:
            sigma = check_real("noise_multiplier", self.noise_multiplier, low=0.0)
            object.__setattr__(self, "noise_multiplier", sigma)
        if self.jl_projections is not None:
            r = check_integer("jl_projections", self.jl_projections, low=1)
            object.__setattr__(self, "jl_projections", r)
        _check_choice("jvp_method", self.jvp_method, JVP_METHODS)
        _check_choice("per_example_method", self.per_example_method, PER_EXAMPLE_METHODS)

    @property
    def uses_jl(self) -> bool:
        """True for DP-SGD-JL / DP-Adam-JL, False for exact clipping."""
        return self.jl_projections is not None


def check_expected_batch_size(value: object) -> int | None:
    """``None`` (not known yet: a step then refuses) or an integer B >= 1."""
    if value is None:
        return None
    return check_integer("expected_batch_size", value, low=1)


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}; got {value!r}")
