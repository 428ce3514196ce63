"""Memory left behind per model: plain Keras vs fdp_tf's private paths, one process.

Builds a small model again and again (each then deleted, ``keras.backend.clear_session()``
and ``gc.collect()``), trains it on a few batches by one path, and prints the resident
set size after every ``--every`` models and the growth per model. A path whose growth
stays above plain Keras's leaves something of every model alive: a process that trains
many models (a hyperparameter search, the test suite's workers) grows with them.

    python benchmarks/model_memory.py [--models 25] [--every 5] [--paths keras private_gradients train_on_batch fit]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

PATHS = ("keras", "private_gradients", "train_on_batch", "fit")


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def _one_model(path: str, x, y) -> None:
    import keras

    import fdp_tf

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    if path == "keras":
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        return
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0, expected_batch_size=16)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    model = fdp_tf.make_private(model, optimizer=optimizer, loss=loss)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unvouched batches: booked at rate 1, on purpose
        if path == "private_gradients":
            model.private_gradients(x[:16], y[:16])
        elif path == "train_on_batch":
            for _ in range(4):
                model.train_on_batch(x[:16], y[:16])
        else:
            model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=16), epochs=1, verbose=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=25, help="models per path")
    parser.add_argument("--every", type=int, default=5, help="print the RSS after this many models")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    args = parser.parse_args(argv)
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    print("| path | models | RSS MiB | MiB per model since the first |")
    print("|---|---|---|---|")
    for path in args.paths:
        first = None
        for i in range(1, args.models + 1):
            _one_model(path, x, y)
            keras.backend.clear_session()
            gc.collect()
            rss = _rss_mib()
            first = rss if first is None else first
            if i % args.every == 0:
                print(f"| {path} | {i} | {rss:.0f} | {(rss - first) / max(i - 1, 1):.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
