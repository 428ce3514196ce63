"""The seed's MNIST figure: test accuracy per epoch of DP-SGD-JL(3), DP-SGD-JL(20), exact
DP-SGD and non-private SGD on the MNIST CNN, averaged over seeds.

Does JL(r) track exact clipping, as the seed reports? Without a local MNIST (``--data
mnist.npz``, Keras's format) the digits are generated: ten random stroke templates,
each pixel of a template kept with probability 1/2, plus Gaussian pixel noise, so that
the task is learnable but not trivially. Every private run trains on Poisson batches
through ``fit`` and prints the epsilon its ledger spent.

    python benchmarks/seed_accuracy.py [--epochs 5] [--seeds 3] [--png accuracy.png]
    python benchmarks/seed_accuracy.py --quick       # smoke test
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

METHODS = ("non-DP SGD", "DP-SGD exact", "DP-SGD-JL r=3", "DP-SGD-JL r=20")
DELTA = 1e-5


def generated_digits(n_train: int, n_test: int, seed: int = 0):
    """Ten random stroke templates, each pixel kept with probability 1/2, plus noise."""
    rng = np.random.default_rng(seed)
    templates = (rng.random((10, 28, 28, 1)) < 0.15).astype(np.float32)

    def make(n: int):
        y = rng.integers(0, 10, size=n).astype(np.int32)
        kept = rng.random((n, 28, 28, 1)) < 0.5
        x = np.clip(templates[y] * kept + 0.5 * rng.normal(size=(n, 28, 28, 1)), 0.0, 1.0)
        return x.astype(np.float32), y

    return (*make(n_train), *make(n_test))


def run(method: str, data, args: argparse.Namespace, seed: int) -> tuple[list[float], float]:
    """Test accuracy after every epoch, and the epsilon spent (inf for non-DP)."""
    import keras

    import fdp_tf
    from mnist_cnn import build_model

    keras.utils.set_random_seed(seed)
    x_train, y_train, x_test, y_test = data
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    model = build_model()
    dp = dict(l2_norm_clip=args.l2_norm_clip, noise_multiplier=args.noise_multiplier,
              learning_rate=args.learning_rate)
    if method == "non-DP SGD":
        # the mean loss: with the per-example loss (reduction=None) plain fit stayed at chance here
        model.compile(keras.optimizers.SGD(args.non_private_learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        trained, batches = model, (x_train, y_train)
    else:
        optimizer = (fdp_tf.DPSGDVanilla(**dp) if method == "DP-SGD exact"
                     else fdp_tf.DPSGDJL(jl_projections=int(method.split("=")[1]), **dp))
        trained = fdp_tf.make_private(model, optimizer=optimizer, loss=loss, metrics=["accuracy"])
        batches = fdp_tf.poisson_batches(x_train, y_train, expected_batch_size=args.batch_size)
    accuracy: list[float] = []

    class Evaluate(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            accuracy.append(float(trained.evaluate(x_test, y_test, verbose=0, return_dict=True)["accuracy"]))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fdp_tf.NotPrivateWarning)
        if method == "non-DP SGD":
            trained.fit(*batches, batch_size=args.batch_size, epochs=args.epochs, verbose=0, callbacks=[Evaluate()])
        else:
            trained.fit(batches, epochs=args.epochs, verbose=0, callbacks=[Evaluate()])
    epsilon = float("inf") if method == "non-DP SGD" else float(trained.epsilon(DELTA))
    return accuracy, epsilon


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="", help="a local mnist.npz (Keras's format); default: generated digits")
    parser.add_argument("--num-examples", type=int, default=4096, help="generated training examples")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--noise-multiplier", type=float, default=1.1)
    parser.add_argument("--l2-norm-clip", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, default=0.5, help="of the private runs")
    parser.add_argument("--non-private-learning-rate", type=float, default=0.5, help="of non-DP SGD")
    parser.add_argument("--png", default="")
    parser.add_argument("--quick", action="store_true", help="smoke test: 256 examples, 1 epoch, 1 seed")
    args = parser.parse_args(argv)
    if args.quick:
        args.num_examples, args.epochs, args.seeds, args.batch_size = 256, 1, 1, 32
    if args.data:
        from mnist_cnn import load_mnist

        data = load_mnist(args.data)
        source = f"MNIST from {args.data}"
    else:
        data = generated_digits(args.num_examples, max(args.num_examples // 4, 100))
        source = f"generated digits, {args.num_examples} training examples"
    curves: dict[str, list[list[float]]] = {m: [] for m in METHODS}
    epsilons: dict[str, float] = {}
    start = time.perf_counter()
    for seed in range(args.seeds):
        for method in METHODS:
            accuracy, epsilon = run(method, data, args, seed)
            curves[method].append(accuracy)
            epsilons[method] = epsilon
            print(f"  seed {seed} {method:16s} accuracy per epoch {np.round(accuracy, 3).tolist()}", flush=True)
    print(f"\n{source}; B = {args.batch_size}, sigma = {args.noise_multiplier}, C = {args.l2_norm_clip}, "
          f"lr = {args.learning_rate} (non-DP {args.non_private_learning_rate}); mean (sd) test accuracy over {args.seeds} seed(s); "
          f"epsilon at delta = {DELTA:g}; {time.perf_counter() - start:.0f} s")
    print("| method | " + " | ".join(f"epoch {e + 1}" for e in range(args.epochs)) + " | epsilon |")
    print("|---|" + "---|" * (args.epochs + 1))
    for method, runs in curves.items():
        table = np.array(runs)
        cells = [f"{m:.3f} ({s:.3f})" for m, s in zip(table.mean(axis=0), table.std(axis=0))]
        print(f"| {method} | " + " | ".join(cells) + f" | {epsilons[method]:.3g} |")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        epochs = np.arange(1, args.epochs + 1)
        for method, runs in curves.items():
            table = np.array(runs)
            ax.errorbar(epochs, table.mean(axis=0), yerr=table.std(axis=0), marker="o", capsize=3,
                        label=f"{method} (ε = {epsilons[method]:.3g})")
        ax.set_xticks(epochs)
        ax.set_xlabel("epoch")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"MNIST CNN: {source}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
