"""Width and time of fdp.PLDAccountant's JL bracket on the settings of benchmarks/RESULTS.md.

Usage: python benchmarks/jl_brackets.py [index ...]   (no index: all settings)
Prints one line per setting: the certified [lower, upper] epsilon, the relative
width and the wall time of get_epsilon_bounds (cells cached per process).
"""

from __future__ import annotations

import sys
import time
import warnings

import fdp

SEED_P = 256 / 25000
SETTINGS = [(0.6, r, SEED_P, 1465, 1e-5) for r in (5, 10, 20, 30)] + [
    (1.0, 10, 0.01, 1000, 1e-5), (0.8, 20, 0.02, 500, 1e-6), (1.5, 5, 0.004, 3000, 1e-5),
    (0.6, 3, SEED_P, 1465, 1e-5), (0.6, 2, SEED_P, 1465, 1e-5),
]


def main() -> None:
    warnings.simplefilter("ignore", UserWarning)
    chosen = [int(a) for a in sys.argv[1:]] or range(len(SETTINGS))
    for i in chosen:
        sigma, r, p, steps, delta = SETTINGS[i]
        mech = fdp.JL(noise_multiplier=sigma, jl_projections=r, sampling_rate=p)
        start = time.perf_counter()
        lo, hi = fdp.PLDAccountant().compose(mech, steps=steps).get_epsilon_bounds(delta)
        print(f"sigma={sigma} r={r} p={p:.4g} T={steps} delta={delta}: [{lo:.6g}, {hi:.6g}] "
              f"width={(hi - lo) / hi * 100:.3f}% {time.perf_counter() - start:.1f}s", flush=True)


if __name__ == "__main__":
    main()
