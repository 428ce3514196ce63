"""Both discretisations bracket the truth for random discrete pairs (hypothesis).

A random pair (P, Q) on a few outcomes with likelihood ratios anywhere (off the
grid, between, below and above it) is discretised on a random grid: connect-the-dots
must give delta(eps) >= the exact one and merging (sweeps, junction balancing,
rounding down) <= it, for one step and for the exact T-fold composition, computed
here by enumerating all T-tuples of outcomes.
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fdp
from fdp.pld.cells import Direction, Grid
from fdp.pld.compose import compose
from fdp.pld.discretise import discretise_optimistic, discretise_pessimistic

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EPS = np.linspace(-1.0, 6.0, 57)


@st.composite
def pairs(draw):
    k = draw(st.integers(min_value=2, max_value=6))
    weights = st.floats(min_value=1e-3, max_value=1.0)
    p = np.array(draw(st.lists(weights, min_size=k, max_size=k)))
    q = np.array(draw(st.lists(weights, min_size=k, max_size=k)))
    return p / p.sum(), q / q.sum()


def exact_delta(p: np.ndarray, q: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """delta(eps) = sum_i max(0, p_i - e^eps q_i)."""
    return np.maximum(p[None, :] - np.exp(eps)[:, None] * q[None, :], 0.0).sum(axis=1)


def product(p: np.ndarray, q: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    idx = list(itertools.product(range(p.size), repeat=steps))
    return np.array([np.prod(p[list(t)]) for t in idx]), np.array([np.prod(q[list(t)]) for t in idx])


@PROPS
@given(pair=pairs(), h=st.floats(min_value=0.02, max_value=1.5), steps=st.integers(min_value=1, max_value=4),
       shift=st.floats(min_value=0.0, max_value=1.0), rate=st.sampled_from([1.0, 0.3, 0.01]),
       direction=st.sampled_from(list(Direction)))
def test_discretisations_bracket_exact_delta(pair, h, steps, shift, rate, direction):
    p1, p0 = pair
    mech = fdp.FromDistributions(p1, p0, sampling_rate=rate)
    mixture = (1.0 - rate) * p0 + rate * p1  # Poisson subsampling (DESIGN.md)
    p, q = (mixture, p0) if direction is Direction.REMOVE else (p0, mixture)
    losses = np.log(p / q)
    # a grid that may cut off either end of the support (tails handled as tails)
    lo, hi = losses.min() + shift * h, losses.max() - shift * h
    grid = Grid.covering(min(lo, hi), max(lo, hi), h)
    cells = mech.loss_cells(direction, grid, pessimistic=True)
    upper = discretise_pessimistic(cells)
    lower = discretise_optimistic(cells)
    if steps > 1:
        upper = compose([(upper, steps)], pessimistic=True, tail_mass=1e-14)
        lower = compose([(lower, steps)], pessimistic=False, tail_mass=1e-14)
    pt, qt = product(p, q, steps)
    truth = exact_delta(pt, qt, EPS)
    assert np.all(upper.delta(EPS) >= truth - 1e-12)
    assert np.all(lower.delta(EPS) <= truth + 1e-12)
