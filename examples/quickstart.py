"""fdp quick start: how much privacy did DP-SGD training spend?

Prints certified (lower, upper) epsilon bounds for Poisson-subsampled Gaussian
DP-SGD over training, the same bounds for DP-SGD-JL (the norms estimated by r
JL projections) with a line on why they are larger, the smallest noise multiplier
that meets a target epsilon, and writes a PNG: DP-SGD's epsilon against epochs with
its certified bracket magnified at the last epoch, and DP-SGD-JL beside it.

    python examples/quickstart.py --png quickstart.png
"""

from __future__ import annotations

import argparse
import time

import fdp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--noise-multiplier", type=float, default=1.1)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--dataset-size", type=int, default=60000)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--jl-projections", type=int, default=10,
                        help="r of the DP-SGD-JL row (0 to skip it)")
    parser.add_argument("--target-epsilon", type=float, default=1.0,
                        help="epsilon budget for the noise calibration line (0 to skip it)")
    parser.add_argument("--png", default="quickstart.png", help="where to write the plot ('' to skip)")
    args = parser.parse_args()

    sampling_rate = args.batch_size / args.dataset_size
    # one epoch = ceil(N / B) Poisson-sampled steps (fdp.epochs, the one convention)
    steps_per_epoch = fdp.steps_per_epoch(args.batch_size, args.dataset_size)
    sizes = dict(batch_size=args.batch_size, dataset_size=args.dataset_size)
    print(f"DP-SGD: noise_multiplier={args.noise_multiplier}, sampling_rate={sampling_rate:.5f}, "
          f"{steps_per_epoch} steps/epoch, delta={args.delta:g}")
    print(f"{'epoch':>6} {'steps':>7} {'eps lower':>10} {'eps upper':>10} {'seconds':>8}")
    epochs, lowers, uppers = [], [], []
    for epoch in [e for e in (1, 2, 5, 10, 20, 30, 45) if e < args.epochs] + [args.epochs]:
        start = time.perf_counter()
        accountant = fdp.dpsgd(noise_multiplier=args.noise_multiplier, epochs=epoch, **sizes)
        lo, hi = accountant.get_epsilon_bounds(args.delta)
        print(f"{epoch:>6} {accountant.steps:>7} {lo:>10.4f} {hi:>10.4f} {time.perf_counter() - start:>8.3f}")
        epochs.append(epoch)
        lowers.append(lo)
        uppers.append(hi)
    jl_rows = None
    if args.jl_projections > 0:
        # DP-SGD-JL: the same noise, clipping by r JL projections of the gradient
        start = time.perf_counter()
        jl = fdp.JL(noise_multiplier=args.noise_multiplier, jl_projections=args.jl_projections,
                    sampling_rate=sampling_rate)
        jl_rows = fdp.epsilon_curve(jl, [e * steps_per_epoch for e in epochs], args.delta)
        print(f"DP-SGD-JL, r={args.jl_projections} projections, same noise, {epochs[-1]} epochs: "
              f"eps in [{jl_rows[-1][0]:.4f}, {jl_rows[-1][1]:.4f}] ({time.perf_counter() - start:.3f} s)")
        print("  why larger: DP-SGD-JL clips by an estimate of each gradient's norm, so one example can move a "
              "step by C / Z with Z = sqrt(chi2_r / r) random;\n  that heavier-tailed sensitivity costs more "
              "epsilon at the same noise, less as r grows (docs/jl.md)")
    if args.target_epsilon > 0:
        start = time.perf_counter()
        steps = fdp.epochs_to_steps(epochs[-1], **sizes)
        sigma = fdp.calibrate_noise_multiplier(target_epsilon=args.target_epsilon, delta=args.delta,
                                               steps=steps, sampling_rate=sampling_rate)
        print(f"noise multiplier for eps <= {args.target_epsilon:g} over {epochs[-1]} epochs: "
              f"{sigma:.4f} (certified; {time.perf_counter() - start:.3f} s)")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax, ax_jl) = plt.subplots(1, 2, figsize=(10, 3.8))
        ax.fill_between(epochs, lowers, uppers, alpha=0.3, label="certified bracket [lower, upper]")
        ax.plot(epochs, uppers, "o-", label="upper bound (report this)")
        ax.set_xlabel("epoch")
        ax.set_ylabel(f"epsilon at delta={args.delta:g}")
        ax.set_title(f"DP-SGD, sigma={args.noise_multiplier}, q={sampling_rate:.4f}", fontsize=10)
        ax.legend(loc="upper left", fontsize=8)
        # the bracket is ~0.05 % wide: an inset at the last epoch, magnified, shows it
        inset = ax.inset_axes([0.58, 0.1, 0.38, 0.32])
        inset.fill_between([0, 1], [lowers[-1]] * 2, [uppers[-1]] * 2, color="C0", alpha=0.3)
        inset.axhline(uppers[-1], color="C0")
        inset.set_xticks([])
        pad = 2 * (uppers[-1] - lowers[-1])
        inset.set_ylim(lowers[-1] - pad, uppers[-1] + pad)
        inset.set_title(f"epoch {epochs[-1]}: [{lowers[-1]:.4f}, {uppers[-1]:.4f}]", fontsize=7)
        inset.tick_params(labelsize=6)
        if jl_rows is not None:
            ax_jl.plot(epochs, uppers, "o-", label="DP-SGD")
            ax_jl.plot(epochs, [hi for _, hi in jl_rows], "s-", color="C3",
                       label=f"DP-SGD-JL, r={args.jl_projections}")
            ax_jl.set_yscale("log")
            ax_jl.set_xlabel("epoch")
            ax_jl.set_ylabel("epsilon (upper bound)")
            ax_jl.set_title("same noise: JL's estimated clipping costs more", fontsize=10)
            ax_jl.legend(fontsize=8)
        else:
            ax_jl.set_visible(False)
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
