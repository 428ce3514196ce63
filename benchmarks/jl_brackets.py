"""Width and time of fdp.PLDAccountant's JL bracket, and of JL noise calibration.

Usage: python benchmarks/jl_brackets.py [--calibrate] [--delta] [--p1] [index ...]   (no index: all settings)

Prints one line per setting of SETTINGS: the certified [lower, upper] epsilon, the
relative width and the wall time of get_epsilon_bounds. Numba is compiled first (on
a small query); the JL cells and components caches are cleared before each setting,
so each time is that of a first query on a warm install. ``--calibrate`` also times
``fdp.calibrate_noise_multiplier`` for JL on CALIBRATIONS (caches cleared) and
counts its accountant runs; ``--delta`` times ``get_delta_bounds`` on DELTA_SETTINGS.
``--p1`` runs only the settings without subsampling (P1_SETTINGS: sigma = 2, p = 1,
delta = 1e-5): each epsilon bracket, then the delta bracket at P1_EPSILONS (about the
epsilon at delta = 1e-5) and its tolerance ratio delta_hi(eps + 1e-3 max(eps, 1)) /
delta_lo(eps), which is <= 1 where the upper curve reaches the lower bound within the
accountant's tolerance (get_delta_bounds' docstring).
"""

from __future__ import annotations

import argparse
import time
import warnings

import fdp
from fdp.mechanisms.random_sensitivity import cells

SEED_P = 256 / 25000
SETTINGS = [(0.6, r, SEED_P, 1465, 1e-5) for r in (5, 10, 20, 30)] + [
    (1.0, 10, 0.01, 1000, 1e-5), (0.8, 20, 0.02, 500, 1e-6), (1.5, 5, 0.004, 3000, 1e-5),
    (0.6, 3, SEED_P, 1465, 1e-5), (0.6, 2, SEED_P, 1465, 1e-5), (0.6, 1, SEED_P, 1465, 1e-5),
]
#: Without subsampling: (sigma, r, p, T, delta) for r = 1..100 and T = 1, 10, 100.
P1_SETTINGS = [(2.0, r, 1.0, steps, 1e-5) for steps in (1, 10, 100) for r in (1, 2, 3, 5, 10, 20, 30, 50, 100)]
#: epsilon of each P1 delta query, (r, T) -> ~ the epsilon at delta = 1e-5 (4-5 digits).
P1_EPSILONS = {
    (1, 1): 7.95e8, (2, 1): 12500.0, (3, 1): 334.56, (5, 1): 20.605, (10, 1): 4.3016,
    (20, 1): 2.7257, (30, 1): 2.4251, (50, 1): 2.2299, (100, 1): 2.1041,
    (1, 10): 7.95e10, (2, 10): 125020.0, (3, 10): 1554.8, (5, 10): 51.957, (10, 10): 9.9085,
    (20, 10): 8.3417, (30, 10): 8.0266, (50, 10): 7.8051, (100, 10): 7.6529,
    (1, 100): 7.95e12, (2, 100): 1.2503e6, (3, 100): 7236.3, (5, 100): 144.71, (10, 100): 39.687,
    (20, 100): 35.932, (30, 100): 34.911, (50, 100): 34.154, (100, 100): 33.615,
}
#: (r, target epsilon) at the seed's p and T = 1,465, delta = 1e-5.
CALIBRATIONS = [(10, 8.0), (30, 4.0), (5, 20.0)]
#: (sigma, r, p, T, epsilon) of the delta queries.
DELTA_SETTINGS = [(0.6, 2, 0.01, 1, 1e4), (0.6, 2, 0.01, 100, 1e5), (0.6, 1, 0.05, 1, 1e6),
                  (0.6, 10, SEED_P, 1465, 47.0), (0.7573823938936274, 3, 0.01, 44, 4e5)]


def _clear_caches() -> None:
    cells.cached_cells.cache_clear()
    cells.components.cache_clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", action="store_true", help="also time JL noise calibration")
    ap.add_argument("--tail-cells", type=int, default=None,
                    help="what-if: the JL Z-partition's TAIL_CELLS (default: the library's, 2000)")
    ap.add_argument("--delta", action="store_true", help="also time get_delta_bounds on DELTA_SETTINGS")
    ap.add_argument("--p1", action="store_true",
                    help="the settings without subsampling (P1_SETTINGS), epsilon and delta brackets")
    ap.add_argument("index", nargs="*", type=int, help="settings to run (default: all)")
    args = ap.parse_args()
    if args.tail_cells is not None:
        from fdp.mechanisms.random_sensitivity import cells as z_cells

        z_cells.TAIL_CELLS = args.tail_cells
    warnings.simplefilter("ignore", UserWarning)
    fdp.PLDAccountant().compose(fdp.JL(noise_multiplier=1.0, jl_projections=8, sampling_rate=0.1),
                                steps=10).get_epsilon_bounds(1e-5)  # compile the kernels
    if args.p1:
        _run_p1(args.index)
        return
    for i in args.index or range(len(SETTINGS)):
        _epsilon_bracket(*SETTINGS[i])
    if args.delta:
        for sigma, r, p, steps, eps in DELTA_SETTINGS:
            _clear_caches()
            start = time.perf_counter()
            lo, hi = fdp.PLDAccountant().compose(fdp.JL(noise_multiplier=sigma, jl_projections=r, sampling_rate=p),
                                                 steps=steps).get_delta_bounds(eps)
            print(f"delta: sigma={sigma} r={r} p={p:.4g} T={steps} eps={eps:g}: [{lo:.6g}, {hi:.6g}] "
                  f"width={(hi - lo) / hi * 100:.3g}% {time.perf_counter() - start:.2f}s", flush=True)
    if args.calibrate:
        for r, target in CALIBRATIONS:
            _clear_caches()
            runs: list[float] = []
            original = fdp.PLDAccountant.get_epsilon

            def counted(self: fdp.PLDAccountant, delta: float) -> float:  # one accountant run per probe
                runs.append(delta)
                return original(self, delta)

            fdp.PLDAccountant.get_epsilon = counted
            start = time.perf_counter()
            try:
                sigma = fdp.calibrate_noise_multiplier(target_epsilon=target, delta=1e-5, steps=1465,
                                                       sampling_rate=SEED_P, mechanism="jl", jl_projections=r)
            finally:
                fdp.PLDAccountant.get_epsilon = original
            print(f"calibrate r={r} target eps={target}: sigma={sigma:.5f} "
                  f"{time.perf_counter() - start:.2f}s, {len(runs)} probes", flush=True)


def _epsilon_bracket(sigma: float, r: int, p: float, steps: int, delta: float) -> None:
    """Print the epsilon bracket of one setting, its width and time (caches cleared)."""
    mech = fdp.JL(noise_multiplier=sigma, jl_projections=r, sampling_rate=p)
    _clear_caches()
    start = time.perf_counter()
    lo, hi = fdp.PLDAccountant().compose(mech, steps=steps).get_epsilon_bounds(delta)
    print(f"sigma={sigma} r={r} p={p:.4g} T={steps} delta={delta}: [{lo:.6g}, {hi:.6g}] "
          f"width={(hi - lo) / hi * 100:.3f}% {time.perf_counter() - start:.2f}s", flush=True)


def _run_p1(indices: list[int]) -> None:
    """Epsilon and delta brackets of P1_SETTINGS (``indices``: a selection)."""
    for i in indices or range(len(P1_SETTINGS)):
        sigma, r, p, steps, delta = P1_SETTINGS[i]
        _epsilon_bracket(sigma, r, p, steps, delta)
        mech = fdp.JL(noise_multiplier=sigma, jl_projections=r, sampling_rate=p)
        eps = P1_EPSILONS[(r, steps)]
        _clear_caches()
        start = time.perf_counter()
        d_lo, d_hi = fdp.PLDAccountant().compose(mech, steps=steps).get_delta_bounds(eps)
        took = time.perf_counter() - start
        tol_hi = fdp.PLDAccountant().compose(mech, steps=steps).get_delta_bounds(eps + 1e-3 * max(eps, 1.0))[1]
        print(f"  delta at eps={eps:g}: [{d_lo:.6g}, {d_hi:.6g}] width={(d_hi - d_lo) / d_hi * 100:.3g}% "
              f"tolerance ratio={tol_hi / d_lo:.4f} {took:.2f}s", flush=True)


if __name__ == "__main__":
    main()
