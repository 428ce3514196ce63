"""Elementwise integer power of a complex spectrum (self-composition by FFT).

T-fold composition raises every Fourier coefficient to the power T. NumPy's
complex ``power`` goes through the complex exp/log of each element (~0.18 s per
million coefficients at T = 1,470 on the development machine); repeated squaring
needs ceil(log2 T) + popcount(T) complex multiplications per coefficient, 10x
faster, with the same round-off order (each multiplication adds at most 4 ulps of
relative error; :mod:`fdp.pld.roundoff` bounds what the squarings make of it).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["complex_power"]


@njit(cache=True)
def complex_power_inplace(values, n):  # pragma: no cover - numba
    """values[i] <- values[i] ** n for an integer n >= 1, by repeated squaring."""
    for i in range(values.shape[0]):
        x = values[i]
        if x == 0.0:  # flushed by the caller: 0 ** n
            continue
        result = 1.0 + 0.0j
        k = n
        while k > 0:
            if k & 1:
                result *= x
            k >>= 1
            if k > 0:
                x *= x
        values[i] = result
    return values


def complex_power(values: np.ndarray, n: int) -> np.ndarray:
    """``values ** n`` in place (complex128, 1-D, contiguous), n >= 1."""
    if n < 1:
        raise ValueError(f"n must be an integer >= 1; got {n}")
    return complex_power_inplace(values, np.int64(n))
