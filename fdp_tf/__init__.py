"""fdp_tf: DP-SGD-JL, DP-Adam-JL and exact-clipping DP-SGD / DP-Adam for Keras 3.

Bu et al., "Fast and Memory Efficient Differentially Private-SGD via JL
Projections", arXiv:2102.03013v1 (Algorithm 1: DP-SGD-JL; Algorithm 3:
DP-Adam-JL; Algorithm 4: DP-SGD). Privacy is accounted by ``fdp.PLDAccountant``
over the model's ledger (see :class:`PrivacyCallback`). See ``docs/training.md``.

Public API::

    fdp_tf.DPSGDJL, fdp_tf.DPAdamJL            # JL-estimated per-example clipping
    fdp_tf.DPSGDVanilla, fdp_tf.DPAdamVanilla  # exact per-example clipping
    fdp_tf.make_private(model, optimizer=..., loss=..., metrics=...)
    fdp_tf.PrivateModel(model)                 # .ledger, .epsilon(delta)
    fdp_tf.poisson_batches(x, y, expected_batch_size=B)
    fdp_tf.random_allocation_batches(x, y, steps_per_epoch=t)   # docs/sampling.md
    fdp_tf.without_replacement_batches(x, y, batch_size=B)      # (replace-one)
    fdp_tf.PrivacyCallback(delta=1e-5)
    fdp_tf.compute_epsilon(optimizer, delta=..., sampling_rate=...)

Module map (one concept each): ``randomness`` (OS-entropy noise), ``forward`` (the
recorded pass), ``clipping`` (clip factors, release with noise), ``jl`` (the JL
estimator), ``per_example`` (exact clipping), ``layerwise`` (exact norms layer by
layer), ``ledger`` (what ran, its epsilon), ``odometer`` (every release booked, no
restore unspends), ``guards`` (what is refused), ``verify`` / ``probes`` /
``refusals`` (what each step verifies before it releases: one loss per row, rows
independent, the per-example method right, no state changed), ``sampling`` (Poisson),
``batch_schemes`` (random allocation, without replacement),
``fit_inputs`` (how fit's input is sampled), ``losses``, ``optimizers``, ``model``,
``callbacks``.
"""

try:
    import keras as _keras
    import tensorflow as _tf  # noqa: F401  (fdp_tf runs on the TensorFlow backend only)
except ImportError as _err:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"fdp_tf needs TensorFlow and Keras 3 ({_err}); install them with: pip install \"fdp[tf]\" "
        "(or pip install -e \".[tf]\" in a checkout)"
    ) from _err

if _keras.backend.backend() != "tensorflow":  # pragma: no cover - depends on the environment
    raise ImportError(
        "fdp_tf needs Keras 3 with the TensorFlow backend; got backend "
        f"{_keras.backend.backend()!r}. Set KERAS_BACKEND=tensorflow before importing keras."
    )

from fdp_tf.algorithms import DPAdamJL, DPAdamVanilla, DPSGDJL, DPSGDVanilla
from fdp_tf.budget import Budget, jl_projections_for, noise_multiplier_for
from fdp_tf.callbacks import PrivacyCallback
from fdp_tf.clipping import clip_factors, clipped_gradient
from fdp_tf.config import DPConfig
from fdp_tf.forward import ForwardPass, PrivateGradient, RecordedForward, record_forward
from fdp_tf.introspection import looped_rnn_layers
from fdp_tf.jl import jl_norm_estimates, jl_norms, jl_private_gradient, sample_directions
from fdp_tf.jl_projections import double_vjp_projections, forward_mode_projections
from fdp_tf.ledger import PrivacyLedger, Segment, compute_epsilon
from fdp_tf.losses import per_example_loss_fn
from fdp_tf.model import PrivateModel, make_private
from fdp_tf.optimizers import DPOptimizer
from fdp_tf.per_example import per_example_gradients, per_example_norms, vanilla_private_gradient
from fdp_tf.probes import one_loss_per_row
from fdp_tf.randomness import NotPrivateWarning, add_gaussian_noise
from fdp_tf.sampling import PoissonSampling, SamplingWarning, poisson_batches, poisson_sampling_of, sampling_of
from fdp_tf.batch_schemes import (RandomAllocationSampling, WithoutReplacementSampling, random_allocation_batches,
                                  without_replacement_batches)

__all__ = [
    "Budget",
    "DPAdamJL",
    "DPAdamVanilla",
    "DPConfig",
    "DPOptimizer",
    "DPSGDJL",
    "DPSGDVanilla",
    "ForwardPass",
    "NotPrivateWarning",
    "PoissonSampling",
    "PrivacyCallback",
    "PrivacyLedger",
    "PrivateGradient",
    "PrivateModel",
    "RandomAllocationSampling",
    "RecordedForward",
    "SamplingWarning",
    "Segment",
    "WithoutReplacementSampling",
    "add_gaussian_noise",
    "clip_factors",
    "clipped_gradient",
    "compute_epsilon",
    "double_vjp_projections",
    "forward_mode_projections",
    "jl_norm_estimates",
    "jl_norms",
    "jl_private_gradient",
    "looped_rnn_layers",
    "make_private",
    "jl_projections_for",
    "noise_multiplier_for",
    "one_loss_per_row",
    "per_example_gradients",
    "per_example_loss_fn",
    "per_example_norms",
    "poisson_batches",
    "poisson_sampling_of",
    "random_allocation_batches",
    "record_forward",
    "sample_directions",
    "sampling_of",
    "vanilla_private_gradient",
    "without_replacement_batches",
]
