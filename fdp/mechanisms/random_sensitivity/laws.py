"""Laws of the random sensitivity Z >= 0: cdf, sf, ppf and isf with accurate tails.

``ChiLaw`` is JL's Z = 1/sqrt(chi2_r / r); ``ScipyLaw`` wraps any frozen
``scipy.stats`` distribution of Z >= 0, and for a discrete one lists its atoms, so
that quadrature and cells can treat it exactly as a finite mixture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special  # scipy.stats is imported only where needed (0.4 s)

__all__ = ["Atoms", "ChiLaw", "MAX_ATOMS", "ScipyLaw", "ZLaw"]

#: A discrete law with more atoms than this between its 1e-30 quantiles is treated
#: like a continuous one (cells: sound, not exact).
MAX_ATOMS = 100_000
#: Mass of each tail of a discrete law that the listed atoms may leave out.
_TAIL = 1e-30


@dataclass(frozen=True, eq=False)
class Atoms:
    """A discrete law of Z as a finite list: P(Z = z_k) = w_k, plus the mass left out
    below ``z[0]`` (``below``) and above ``z[-1]`` (``above``), as the law's cdf and sf
    report them (about 1e-30, more where scipy's ppf is coarse in the tail)."""

    z: np.ndarray
    w: np.ndarray
    below: float
    above: float


class ZLaw:
    """A law of Z >= 0 with accurate tails: cdf/sf/ppf/isf, vectorised."""

    lower: float = 0.0
    upper: float = math.inf

    def atoms(self) -> Atoms | None:
        """The law as a finite list of atoms, or ``None`` (not discrete, or too many)."""
        return None

    def cdf(self, z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def sf(self, z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def ppf(self, q: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def isf(self, q: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def mass(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """P(lo < Z <= hi), by differences of whichever tail is smaller."""
        lo = np.asarray(lo, dtype=np.float64)
        hi = np.asarray(hi, dtype=np.float64)
        c_lo, c_hi = self.cdf(lo), self.cdf(hi)
        s_lo, s_hi = self.sf(lo), self.sf(hi)
        return np.clip(np.where(c_hi <= 0.5, c_hi - c_lo, s_lo - s_hi), 0.0, 1.0)

    def mesh_mass(self, z: np.ndarray) -> np.ndarray:
        """P(z_i < Z <= z_{i+1}) between consecutive points of each row of ``z``
        (increasing along the last axis): :meth:`mass` with cdf and sf evaluated once
        per point instead of twice."""
        z = np.asarray(z, dtype=np.float64)
        c, s = self.cdf(z), self.sf(z)
        return np.clip(np.where(c[..., 1:] <= 0.5, np.diff(c, axis=-1), -np.diff(s, axis=-1)), 0.0, 1.0)


@dataclass(frozen=True)
class ChiLaw(ZLaw):
    """Z = 1 / sqrt(chi2_r / r): P(Z <= z) = P(chi2_r >= r / z^2)."""

    r: int

    def cdf(self, z):
        z = np.asarray(z, dtype=np.float64)
        with np.errstate(divide="ignore"):
            return np.where(z <= 0, 0.0, _chi2_sf(self.r / (z * z), self.r))

    def sf(self, z):
        z = np.asarray(z, dtype=np.float64)
        with np.errstate(divide="ignore"):
            return np.where(z <= 0, 1.0, _chi2_cdf(self.r / (z * z), self.r))

    def ppf(self, q):
        with np.errstate(divide="ignore"):
            # chi2_r isf(q) = 2 gammainccinv(r/2, q): accurate in the upper tail
            return np.sqrt(self.r / (2.0 * special.gammainccinv(0.5 * self.r, np.asarray(q, dtype=np.float64))))

    def isf(self, q):
        with np.errstate(divide="ignore"):
            # chi2_r ppf(q) = 2 gammaincinv(r/2, q): accurate in the lower tail
            return np.sqrt(self.r / (2.0 * special.gammaincinv(0.5 * self.r, np.asarray(q, dtype=np.float64))))


def _chi2_sf(x: np.ndarray, r: int) -> np.ndarray:
    """P(chi2_r > x). r = 1, 2 in closed form, erfc(sqrt(x/2)) and exp(-x/2): both
    accurate to a few ulps in every tail, like scipy's incomplete gamma, and ~40x
    faster for r = 1 (the cells evaluate it at ~1e6 points)."""
    if r == 1:
        return special.erfc(np.sqrt(0.5 * x))
    if r == 2:
        return np.exp(-0.5 * x)
    return special.chdtrc(r, x)


def _chi2_cdf(x: np.ndarray, r: int) -> np.ndarray:
    """P(chi2_r <= x): erf(sqrt(x/2)) and -expm1(-x/2) for r = 1, 2 (see :func:`_chi2_sf`)."""
    if r == 1:
        return special.erf(np.sqrt(0.5 * x))
    if r == 2:
        return -np.expm1(-0.5 * x)
    return special.chdtr(r, x)


@dataclass(frozen=True, eq=False)
class ScipyLaw(ZLaw):
    """A frozen scipy.stats distribution of Z >= 0."""

    dist: Any

    def __post_init__(self) -> None:
        lo, hi = self.dist.support()
        object.__setattr__(self, "lower", float(lo))
        object.__setattr__(self, "upper", float(hi))
        object.__setattr__(self, "_atoms", _discrete_atoms(self.dist))

    def atoms(self) -> Atoms | None:
        return self._atoms  # type: ignore[attr-defined]

    def cdf(self, z):
        return np.asarray(self.dist.cdf(z), dtype=np.float64)

    def sf(self, z):
        return np.asarray(self.dist.sf(z), dtype=np.float64)

    def ppf(self, q):
        return np.asarray(self.dist.ppf(q), dtype=np.float64)

    def isf(self, q):
        return np.asarray(self.dist.isf(q), dtype=np.float64)


def _discrete_atoms(dist: Any) -> Atoms | None:
    """The atoms of a frozen ``scipy.stats`` discrete distribution between its 1e-30
    quantiles: the listed values of ``rv_discrete(values=...)``, else the integers
    (shifted by ``loc``) of the lattice that ``rv_discrete`` lives on."""
    from scipy import stats

    base = dist if isinstance(dist, stats.rv_discrete) else getattr(dist, "dist", None)
    if not isinstance(base, stats.rv_discrete):
        return None
    xk = getattr(base, "xk", None)
    if xk is not None:
        z = np.asarray(xk, dtype=np.float64) + float(getattr(dist, "kwds", {}).get("loc", 0.0))
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            lo, hi = float(dist.ppf(_TAIL)), _upper_atom(dist)
        if not (math.isfinite(lo) and math.isfinite(hi)) or hi - lo + 1 > MAX_ATOMS:
            return None
        z = np.arange(lo, hi + 1.0)
    if z.size > MAX_ATOMS:
        return None
    w = np.asarray(dist.pmf(z), dtype=np.float64)
    keep = w > 0
    z, w = z[keep], w[keep]
    if z.size == 0:
        return None
    if xk is not None:  # every atom is listed
        return Atoms(z=z, w=w, below=0.0, above=0.0)
    # the lattice point below z[0] holds all the mass below it (cdf(z0) - pmf(z0) would
    # be a difference of rounded numbers, 7e-16 for binom(10, 1e-3) where the truth is 0)
    below = float(dist.cdf(z[0] - 1.0))
    above = float(dist.sf(z[-1]))
    return Atoms(z=z, w=w, below=min(max(below, 0.0), 1.0), above=min(max(above, 0.0), 1.0))


def _upper_atom(dist: Any) -> float:
    """The smallest lattice point k with P(Z > k) <= 1e-30, by doubling then bisection on
    ``sf``; inf if beyond MAX_ATOMS. (scipy's discrete ``isf`` returns NaN that far out,
    and for heavy tails such as zipf(2.5) takes minutes before doing so.)"""
    start = float(dist.ppf(0.5))
    step = 1.0
    while float(dist.sf(start + step)) > _TAIL:
        step *= 2.0
        if step > 2 * MAX_ATOMS:
            return math.inf
    lo, hi = start + step / 2.0, start + step
    while hi - lo > 1.0:
        mid = math.floor(0.5 * (lo + hi))
        lo, hi = (lo, mid) if float(dist.sf(mid)) <= _TAIL else (mid, hi)
    return hi

