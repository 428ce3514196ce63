"""The (Poisson-subsampled) Gaussian mechanism.

One step adds N(0, sigma^2) noise to a sum of sensitivity 1; after scaling by
sigma its output laws are P0 = N(0, 1) and P1 = N(mu, 1) with mu = 1 / sigma.
With sampling rate p the two directions are (see :mod:`fdp.mechanisms.base`)

    remove: L(x) =  log(1 - p + p e^{mu x - mu^2/2}),  X ~ (1-p) N(0,1) + p N(mu,1)
    add:    L(x) = -log(1 - p + p e^{mu x - mu^2/2}),  X ~ N(0,1)

Both losses are monotone in x, so the cells of a loss grid are intervals of x
and their masses are differences of Phi, computed in log space
(:func:`fdp._numerics.log_norm_cells`). The threshold where the remove loss
crosses ell is

    x(ell) = (log((e^ell - (1-p)) / p) + mu^2/2) / mu     for ell > log(1-p),   (1)

and the add loss crosses ell at x(-ell).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

from fdp._numerics import log_norm_cells, logsubexp
from fdp._validation import check_real, check_sampling_rate
from fdp.mechanisms.base import MAX_STEP_LOSS, Mechanism, register_mechanism
from fdp.pld.cells import Direction, Grid, LossCells

__all__ = ["Gaussian", "NOISE_MULTIPLIER_FLOOR", "subsampled_gaussian_cells", "subsampled_gaussian_delta"]

#: Smallest noise multiplier: the loss's scale mu^2 / 2 = 5e299 <= MAX_STEP_LOSS
#: (below 7e-155, mu^2 overflows float64 and the loss range is nan).
NOISE_MULTIPLIER_FLOOR = 1e-150


def _log_excess(ell: np.ndarray, p: float) -> np.ndarray:
    """log(e^ell - (1 - p)); -inf where e^ell <= 1 - p."""
    ell = np.asarray(ell, dtype=np.float64)
    if p == 1.0:
        return ell.copy()
    log_q = np.log1p(-p)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = logsubexp(ell, np.full_like(ell, log_q))
    return np.where(ell > log_q, out, -np.inf)


def _threshold(ell: np.ndarray, mu: float, p: float) -> np.ndarray:
    """x(ell) of equation (1); -inf below the smallest loss log(1-p)."""
    return (_log_excess(ell, p) - np.log(p) + 0.5 * mu * mu) / mu


def _remove_loss(x: np.ndarray, mu: float, p: float) -> np.ndarray:
    a = np.log(p) + mu * x - 0.5 * mu * mu
    return a if p == 1.0 else np.logaddexp(np.log1p(-p), a)


def _signed_exp_mul(log_scale: np.ndarray, sign: np.ndarray, log_mass: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        v = sign * np.exp(log_scale + log_mass)
    return np.where(np.isneginf(log_mass), 0.0, v)


def subsampled_gaussian_cells(
    mu: float, p: float, direction: Direction, grid: Grid
) -> LossCells:
    """Cells (see :mod:`fdp.pld.cells`) of the subsampled Gaussian PLD, exactly."""
    ell = grid.points
    log1mp = np.log1p(-p) if p < 1.0 else -np.inf
    if direction is Direction.REMOVE:
        # cell k <-> x in (x(ell_k), x(ell_{k+1})]; P = (1-p) N(0,1) + p N(mu,1), Q = N(0,1)
        t = _threshold(ell, mu, p)
        lq = log_norm_cells(t)  # log Q(cell): x in (t_k, t_{k+1}]
        l1 = log_norm_cells(t - mu)  # log N(mu,1)(cell)
        log_p_cell = np.logaddexp(log1mp + lq, np.log(p) + l1)
        # u = p * N(mu,1)(cell) - (e^ell - (1-p)) * Q(cell); e^ell - (1-p) may be <= 0
        exc = _log_excess(ell[:-1], p)
        with np.errstate(over="ignore", divide="ignore"):  # only used below log(1-p)
            neg = np.log(np.abs(np.expm1(np.minimum(ell[:-1], 0.0)) + p)) if p < 1.0 else ell[:-1]
        sign = np.where(np.isfinite(exc), 1.0, -1.0)
        log_scale = np.where(np.isfinite(exc), exc, neg)
        u_cell = np.exp(np.log(p) + l1) - _signed_exp_mul(log_scale, sign, lq)
        p_cell = np.exp(log_p_cell)
        # tails
        a0, bn = t[0], t[-1]
        phi_a0, phi_a0m = special.ndtr(a0), special.ndtr(a0 - mu)
        p_left = (1.0 - p) * phi_a0 + p * phi_a0m
        d_left = np.expm1(ell[0]) * phi_a0 + p * (phi_a0 - phi_a0m)  # e^ell Q - P >= 0
        sf_b, sf_bm = special.ndtr(-bn), special.ndtr(mu - bn)
        p_right = (1.0 - p) * sf_b + p * sf_bm
        log_exc_n = float(_log_excess(ell[-1:], p)[0])
        if np.isfinite(log_exc_n):  # u = p N(mu,1)(X > b) - (e^ell - (1-p)) Q(X > b)
            u_right = p * sf_bm - float(np.exp(log_exc_n + special.log_ndtr(-bn)))
        else:  # the whole support lies above ell_n
            u_right = -np.expm1(ell[-1])
    else:
        # cell k <-> x in [x(-ell_{k+1}), x(-ell_k)); P = N(0,1), Q = (1-p) N(0,1) + p N(mu,1)
        t = _threshold(-ell, mu, p)  # decreasing in k; -inf where ell >= -log(1-p)
        lp = log_norm_cells(t)  # x in [t_{k+1}, t_k)
        l1 = log_norm_cells(t - mu)
        p_cell = np.exp(lp)
        # u = P - e^ell Q = P (1 - (1-p) e^ell) - p e^ell N(mu,1)(cell)
        with np.errstate(over="ignore", invalid="ignore"):
            one_minus = -np.expm1(log1mp + ell[:-1]) if p < 1.0 else np.ones(ell.size - 1)
            u_cell = p_cell * one_minus - np.exp(np.log(p) + ell[:-1] + l1)
        # a cell without P-mass has no excess; far above the support e^ell overflows and
        # 0 * inf was nan, which crashed the optimistic merge (red team, a grid of h = 15)
        u_cell = np.where(p_cell > 0.0, u_cell, 0.0)
        b0, an = t[0], t[-1]
        p_left = special.ndtr(-b0)
        q_left = (1.0 - p) * p_left + p * special.ndtr(mu - b0)
        p_right = special.ndtr(an)
        q_right = (1.0 - p) * p_right + p * special.ndtr(an - mu)
        # a tail without Q-mass: -p_left and p_right, not inf * 0 = nan (grid ends beyond
        # loss 709); else an overflowing e^ell overstates the deficit and understates the
        # excess, which the optimistic merge rounds down (safe)
        with np.errstate(over="ignore"):
            d_left = np.exp(ell[0]) * q_left - p_left if q_left > 0.0 else -p_left
            u_right = p_right - np.exp(ell[-1]) * q_right if q_right > 0.0 else p_right
    return LossCells(
        grid=grid,
        p_cell=p_cell,
        u_cell=np.clip(u_cell, 0.0, None),
        p_left=float(p_left),
        d_left=max(float(d_left), 0.0),
        p_right=float(p_right),
        u_right=max(float(u_right), 0.0),
        p_inf=0.0,
    )


def subsampled_gaussian_delta(
    epsilon: np.ndarray, mu: float, p: float, direction: Direction
) -> np.ndarray:
    """Exact delta(eps) = P(L > eps) - e^eps Q(L > eps) of one step, in log space."""
    eps = np.asarray(epsilon, dtype=np.float64)
    if direction is Direction.REMOVE:
        x = _threshold(eps, mu, p)
        log_sp = np.logaddexp(np.log1p(-p) + special.log_ndtr(-x) if p < 1 else -np.inf,
                              np.log(p) + special.log_ndtr(mu - x))
        log_sq = eps + special.log_ndtr(-x)
    else:
        x = _threshold(-eps, mu, p)  # L > eps <=> X < x
        log_sp = special.log_ndtr(x)
        log_sq = eps + np.logaddexp(np.log1p(-p) + special.log_ndtr(x) if p < 1 else -np.inf,
                                    np.log(p) + special.log_ndtr(x - mu))
    with np.errstate(invalid="ignore"):
        out = np.exp(logsubexp(log_sp, np.minimum(log_sq, log_sp)))
    return np.clip(np.nan_to_num(out, nan=0.0), 0.0, 1.0)


@register_mechanism
@dataclass(frozen=True)
class Gaussian(Mechanism):
    """Gaussian mechanism with noise ``noise_multiplier`` * sensitivity, Poisson-subsampled.

    Its unsubsampled tradeoff curve is mu-GDP with mu = 1 / noise_multiplier
    (Dong-Roth-Su, arXiv:1905.02383v3, Thm 2.7): f(a) = Phi(Phi^{-1}(1 - a) - mu).

    Args:
      noise_multiplier: sigma in [1e-150, inf) (the loss mu^2 / 2 stays within float64).
      sampling_rate: Poisson sampling rate p in (0, 1].
    """

    noise_multiplier: float
    sampling_rate: float = 1.0
    kind = "gaussian"
    exact_cells = True

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "noise_multiplier",
            check_real("noise_multiplier", self.noise_multiplier, low=NOISE_MULTIPLIER_FLOOR),
        )
        object.__setattr__(self, "sampling_rate", check_sampling_rate(self.sampling_rate))

    @property
    def mu(self) -> float:
        return 1.0 / self.noise_multiplier

    def is_symmetric(self) -> bool:
        return True

    def loss_cells(self, direction: Direction, grid: Grid, *, pessimistic: bool,
                   focus: tuple[float, float] | None = None) -> LossCells:
        return subsampled_gaussian_cells(self.mu, self.sampling_rate, Direction(direction), grid)

    def loss_range(self, direction: Direction, tail_mass: float) -> tuple[float, float]:
        mu, p = self.mu, self.sampling_rate
        z = float(special.ndtri(tail_mass))  # negative
        x_lo, x_hi = z, mu - z
        lo, hi = float(_remove_loss(np.array(x_lo), mu, p)), float(_remove_loss(np.array(x_hi), mu, p))
        if Direction(direction) is Direction.ADD:
            lo, hi = -float(_remove_loss(np.array(-z), mu, p)), -float(_remove_loss(np.array(z), mu, p))
        return lo, hi

    def delta(self, epsilon, direction: Direction = Direction.REMOVE) -> np.ndarray:
        """Exact delta(eps) of ONE subsampled step in ``direction``."""
        return subsampled_gaussian_delta(epsilon, self.mu, self.sampling_rate, Direction(direction))

    def tradeoff(self):
        from fdp.tradeoff import gaussian_curve

        return gaussian_curve(mu=self.mu)
