"""The figures of the documentation's Concepts pages, computed with fdp itself.

    python docs/figures.py [OUT_DIR]        # default docs/img (the committed copies)

Each figure is one function below; ``tests/test_docs_figures.py`` runs them all.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import fdp  # noqa: E402


def tradeoff_curves(path: Path) -> None:
    """f-DP: G_mu for three mu, a subsampled curve and its symmetrisation, an (eps, delta) curve."""
    fig, ax = plt.subplots(figsize=(5, 5))
    for mu in (0.5, 1.0, 2.0):
        fdp.gaussian_curve(mu).plot(ax, label=f"G_{mu:g} (Gaussian, mu = {mu:g})", show_identity=mu == 0.5)
    sub = fdp.gaussian_curve(3.0).subsampled(0.2)
    sub.plot(ax, show_identity=False, linestyle=":", label="G_3 subsampled, p = 0.2 (remove)")
    sub.symmetrized().plot(ax, show_identity=False, linestyle="-.", label="... symmetrised min{f, f^-1}**")
    fdp.epsilon_delta_curve(1.0, 0.05).plot(ax, show_identity=False, color="0.3", linewidth=1,
                                             label="(eps, delta) = (1, 0.05)-DP")
    ax.set_title("Tradeoff curves: larger is more private")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def two_directions(path: Path) -> None:
    """One step of the subsampled Gaussian: the privacy-loss distributions of both directions."""
    mech = fdp.Gaussian(noise_multiplier=1.0, sampling_rate=0.2)
    acc = fdp.PLDAccountant(grid_spacing=1e-3).compose(mech, steps=1)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    labels = {"remove": "remove: P = (1-p) N(0,1) + p N(1,1), Q = N(0,1); L >= log(1-p)",
              "add": "add: P and Q swapped; L <= -log(1-p)"}
    for direction, style in (("remove", "-"), ("add", "--")):
        pld = acc.composed_pld(direction)
        keep = pld.pmf > 1e-12
        ax.semilogy(pld.losses[keep], pld.pmf[keep] / pld.h, style, label=labels[direction])
    ax.axvline(np.log1p(-0.2), color="0.6", linewidth=0.8)
    ax.axvline(-np.log1p(-0.2), color="0.6", linewidth=0.8)
    ax.set_xlabel("privacy loss L")
    ax.set_ylabel("density")
    ax.set_ylim(1e-8, None)
    ax.set_title("One step of the subsampled Gaussian (sigma = 1, p = 0.2)", fontsize=10)
    ax.legend(fontsize=7, loc="lower center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def duality(path: Path) -> None:
    """The composed delta(eps) bracket and the tradeoff curve it gives (the eps/delta duality)."""
    acc = fdp.dpsgd(noise_multiplier=1.1, batch_size=256, dataset_size=60000, epochs=10)
    eps = np.linspace(0.0, 3.0, 31)
    bounds = np.array([acc.get_delta_bounds(float(e)) for e in eps])
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
    left.semilogy(eps, bounds[:, 1], label="certified upper delta(eps)")
    left.semilogy(eps, bounds[:, 0], "--", label="certified lower delta(eps)")
    left.set_xlabel("eps")
    left.set_ylabel("delta")
    left.set_title("Privacy profile (both directions)")
    left.legend(fontsize=8)
    curve = acc.tradeoff()
    curve.plot(right, label="composed f (from the upper profile)")
    alpha = np.linspace(0.0, 1.0, 201)
    for e in (0.5, 1.0, 2.0):  # each eps gives one supporting line 1 - delta - e^eps alpha
        d = acc.get_delta(e)
        right.plot(alpha, np.clip(1 - d - np.exp(e) * alpha, 0, 1), ":", linewidth=1,
                   label=f"1 - delta({e:g}) - e^{e:g} alpha")
    right.set_title("f = sup over eps of those lines")
    right.legend(fontsize=7)
    fig.suptitle("DP-SGD, MNIST setting, 10 epochs (sigma = 1.1, B = 256, N = 60,000)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def jl_tail(path: Path) -> None:
    """One step, no subsampling: delta(eps) of JL decays polynomially, the Gaussian's like e^{-eps^2}."""
    eps = np.geomspace(0.5, 200.0, 60)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(eps, np.maximum(fdp.Gaussian(noise_multiplier=1.0).delta(eps), 1e-300), "k",
              label="Gaussian, sigma = 1")
    for r in (2, 5, 10, 30):
        delta = fdp.JL(noise_multiplier=1.0, jl_projections=r).delta(eps)
        ax.loglog(eps, delta, label=f"JL, r = {r}  (~ eps^-{r / 2:g})")
    ax.set_ylim(1e-30, 1)
    ax.set_xlabel("eps")
    ax.set_ylabel("delta(eps), one step")
    ax.set_title("Polynomial tails: every Renyi divergence of JL is infinite", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sampling_schemes(path: Path) -> None:
    """Epsilon after each epoch of DP-SGD (sigma 1, B 256, N 60,000) for each sampling scheme:
    certified brackets (shaded) for Poisson, random allocation and without replacement, and
    the certified lower bound of shuffling; the right panel shows the first two alone."""
    sigma, batch, n, delta = 1.0, 256, 60_000, 1e-5
    epochs = [1, 2, 3, 5, 8, 12, 20, 30, 45, 60]
    steps = fdp.epochs.steps_per_epoch(batch, n)
    schemes = {"Poisson, p = B/N": fdp.Gaussian(noise_multiplier=sigma, sampling_rate=batch / n),
               "random allocation (balls in bins)": fdp.RandomAllocation(fdp.Gaussian(noise_multiplier=sigma),
                                                                         steps_per_epoch=steps),
               "without replacement (replace-one)": fdp.SampledWithoutReplacement(
                   fdp.Gaussian(noise_multiplier=sigma / 2), sample_size=batch, dataset_size=n)}
    fig, (every, close) = plt.subplots(1, 2, figsize=(10, 4.2))
    for label, mech in schemes.items():
        per_epoch = 1 if isinstance(mech, fdp.RandomAllocation) else steps
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # without replacement's gap is by nature
            rows = np.array(fdp.epsilon_curve(mech, [e * per_epoch for e in epochs], delta))
        for ax in (every, close) if "replace" not in label else (every,):
            line, = ax.plot(epochs, rows[:, 1], marker=".", label=label)
            ax.fill_between(epochs, rows[:, 0], rows[:, 1], color=line.get_color(), alpha=0.25, linewidth=0)
    shuffled = [fdp.shuffled_lower_bound(sigma, batch, n, e, delta) for e in epochs]
    every.plot(epochs, shuffled, "k--", marker=".", label="shuffling: certified LOWER bound\n(no upper bound known)")
    every.set_yscale("log")
    every.set_title(f"DP-SGD, sigma = {sigma:g}, B = {batch}, N = {n:,}: every scheme", fontsize=9)
    close.set_title("Poisson and random allocation (bands: certified brackets)", fontsize=9)
    for ax in (every, close):
        ax.set_xlabel("epochs")
        ax.set_ylabel(f"epsilon at delta = {delta:g}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


FIGURES = {"tradeoff.png": tradeoff_curves, "two_directions.png": two_directions, "duality.png": duality,
           "jl_tail.png": jl_tail, "sampling_schemes.png": sampling_schemes}


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, draw in FIGURES.items():
        draw(out / name)
        print(out / name)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "img")
