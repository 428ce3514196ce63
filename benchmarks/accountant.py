"""fdp vs dp_accounting vs prv_accountant on four DP-SGD settings (``SETTINGS`` below).

One run, side by side: epsilon (lower, upper) and wall time for each library,
and fdp's speed-up as a ratio. Times include building the PLD, composing and
querying; each library is warmed up once (Numba compilation, imports) first.

    python benchmarks/accountant.py [--png accountant.png] [--repeats 3]
"""

from __future__ import annotations

import argparse
import platform
import time

import fdp

SETTINGS = [
    # (sampling rate, noise multiplier, steps, delta)
    (256 / 60000, 1.1, 14100, 1e-5),
    (0.01, 0.8, 10000, 1e-6),
    (256 / 25000, 0.6, 1465, 1e-5),
    (0.001, 1.0, 100000, 1e-6),
]


def best_time(fn, repeats):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return out, best


def run_fdp(q, sigma, steps, delta):
    return fdp.PLDAccountant().compose(fdp.Gaussian(noise_multiplier=sigma, sampling_rate=q), steps=steps).get_epsilon_bounds(delta)


def run_dpa(q, sigma, steps, delta):
    from dp_accounting.pld import privacy_loss_distribution as pld

    return pld.from_gaussian_mechanism(
        standard_deviation=sigma, sampling_prob=q, use_connect_dots=True, value_discretization_interval=1e-4
    ).self_compose(steps).get_epsilon_for_delta(delta)


def run_prv(q, sigma, steps, delta):
    import prv_accountant as prv

    acc = prv.PRVAccountant(
        prvs=[prv.PoissonSubsampledGaussianMechanism(noise_multiplier=sigma, sampling_probability=q)],
        max_self_compositions=[steps], eps_error=0.01, delta_error=delta / 1000,
    )
    lo, _, hi = acc.compute_epsilon(delta=delta, num_self_compositions=[steps])
    return lo, hi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--png", default="")
    args = parser.parse_args()
    run_fdp(*SETTINGS[2])  # warm-up: Numba compilation
    run_dpa(0.01, 1.0, 10, 1e-5)
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    header = f"{'setting':<32} {'fdp [lower, upper]':>22} {'gap':>8} {'fdp s':>7} {'dp_acc eps':>10} {'dp_acc s':>8} {'prv [lower, upper]':>20} {'prv s':>6} {'speed-up vs dp_acc':>18} {'vs prv':>7}"
    print(header)
    rows = []
    for q, sigma, steps, delta in SETTINGS:
        (lo, hi), t_fdp = best_time(lambda: run_fdp(q, sigma, steps, delta), args.repeats)
        e_dpa, t_dpa = best_time(lambda: run_dpa(q, sigma, steps, delta), 1)
        (p_lo, p_hi), t_prv = best_time(lambda: run_prv(q, sigma, steps, delta), 1)
        name = f"q={q:.5f} s={sigma} T={steps} d={delta:g}"
        print(f"{name:<32} [{lo:9.4f}, {hi:9.4f}] {(hi - lo) / hi:8.1e} {t_fdp:7.3f} {e_dpa:10.4f} {t_dpa:8.3f} [{p_lo:8.4f}, {p_hi:8.4f}] {t_prv:6.2f} {t_dpa / t_fdp:17.1f}x {t_prv / t_fdp:6.1f}x")
        rows.append((name, t_fdp, t_dpa, t_prv))
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np

        x = np.arange(len(rows))
        fig, ax = plt.subplots(figsize=(7, 3.5))
        for i, (label, col) in enumerate([("fdp", 1), ("dp_accounting (CTD, h=1e-4)", 2), ("prv_accountant", 3)]):
            ax.bar(x + (i - 1) * 0.27, [r[col] for r in rows], 0.27, label=label)
        ax.set_xticks(x, [f"setting {i + 1}" for i in x])
        ax.set_ylabel("seconds (PLD + compose + query)")
        ax.set_yscale("log")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
