"""Elementwise integer power of a complex spectrum (self-composition by FFT).

T-fold composition raises every Fourier coefficient to the power T. NumPy's
complex ``power`` goes through the complex exp/log of each element (~0.18 s per
million coefficients at T = 1,470 on the development machine); repeated squaring
needs ceil(log2 T) + popcount(T) complex multiplications per coefficient, 10x
faster, with the same round-off order (each multiplication adds at most 4 ulps of
relative error; :mod:`fdp.pld.roundoff` bounds what the squarings make of it).
It runs on the nonzero coefficients only: after many steps the caller has set most
of them to 0 (their T-th power underflows), and 0 ** T = 0. Plain NumPy, not a Numba
kernel: as fast here, and nothing to compile on a fresh install's first query.
"""

from __future__ import annotations

import numpy as np

__all__ = ["complex_power"]


def complex_power(values: np.ndarray, n: int) -> np.ndarray:
    """``values ** n`` in place (complex128, 1-D, contiguous), n >= 1, by repeated squaring."""
    if n < 1:
        raise ValueError(f"n must be an integer >= 1; got {n}")
    live = np.flatnonzero(values)
    x = values[live]
    result = np.ones_like(x)
    k = int(n)
    while k:
        if k & 1:
            result *= x
        k >>= 1
        if k:
            x *= x
    values[live] = result
    return values
