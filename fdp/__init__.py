"""fdp: exact, fast f-DP and privacy-loss-distribution accounting.

Tradeoff curves (Dong-Roth-Su f-DP), mechanisms (Gaussian, Laplace, randomized
response, generic, and the JL mechanism of DP-SGD-JL), and a PLD accountant that
composes them by FFT with certified lower and upper bounds.
"""

__version__ = "0.1.0"

from fdp.accountant import PLDAccountant
from fdp.mechanisms.base import Mechanism
from fdp.mechanisms.gaussian import Gaussian
from fdp.pld.cells import Direction
from fdp.tradeoff import (
    GaussianCurve,
    ParametricCurve,
    PiecewiseLinearCurve,
    TradeoffCurve,
    epsilon_delta_curve,
    from_delta,
    gaussian_curve,
    identity_curve,
)
from fdp.mechanisms.jl import JL, RandomSensitivityGaussian
from fdp.budget import fewest_jl_projections, most_steps
from fdp.calibration import calibrate_noise_multiplier
from fdp.epochs import dpsgd, epochs_to_steps, steps_per_epoch
from fdp.curves import epsilon_curve
from fdp.risk import AttackRisk, attack_risk
from fdp.interop import from_dp_event
from fdp.mechanisms.laplace import Laplace, LaplaceCurve, laplace_curve
from fdp.mechanisms.discrete import FromDistributions, RandomizedResponse
from fdp.mechanisms.from_delta import FromDelta
from fdp.mechanisms.random_allocation import RandomAllocation
from fdp.mechanisms.without_replacement import SampledWithoutReplacement
from fdp.shuffling import shuffled_lower_bound
