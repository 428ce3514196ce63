"""DP-SGD-JL on the MNIST CNN of the TF Privacy tutorial (seed, Section 4.2).

Conv2D(16, 8, strides 2, same, relu) -> MaxPool(2, 1) -> Conv2D(32, 4, strides 2,
valid, relu) -> MaxPool(2, 1) -> Flatten -> Dense(32, relu) -> Dense(10):
26,010 parameters (checked at start-up), as in ``mnist_dpsgd_tutorial_keras.py``.

Run (synthetic digits with the real shapes; 17 s on a 2-core VM)::

    python examples/mnist_cnn.py --synthetic

Real data: a local Keras-format ``mnist.npz`` (x_train, y_train, x_test, y_test)::

    python examples/mnist_cnn.py --data ~/.keras/datasets/mnist.npz --epochs 15 \\
        --batch-size 256 --noise-multiplier 1.1 --learning-rate 0.15 \\
        --optimizer jl-sgd --jl-projections 5
"""

from __future__ import annotations

import argparse

import numpy as np

from fdp_tf_common import add_common_arguments, check_data_arguments, train

PARAMETERS = 26_010


def build_model():
    import keras

    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 8, strides=2, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2, 1),
            keras.layers.Conv2D(32, 4, strides=2, padding="valid", activation="relu"),
            keras.layers.MaxPooling2D(2, 1),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    assert model.count_params() == PARAMETERS, model.count_params()
    return model


def load_mnist(path: str):
    with np.load(path) as f:
        x_train, y_train, x_test, y_test = (f[k] for k in ("x_train", "y_train", "x_test", "y_test"))

    def images(x):
        return (np.asarray(x, dtype=np.float32) / 255.0)[..., None]

    return images(x_train), y_train.astype(np.int32), images(x_test), y_test.astype(np.int32)


def synthetic_mnist(n_train: int, seed: int):
    """Ten random stroke templates plus pixel noise, clipped to [0, 1]."""
    rng = np.random.default_rng(seed)
    templates = (rng.random((10, 28, 28, 1)) < 0.15).astype(np.float32)

    def make(n):
        y = rng.integers(0, 10, size=n).astype(np.int32)
        x = np.clip(templates[y] + 0.3 * rng.normal(size=(n, 28, 28, 1)), 0.0, 1.0)
        return x.astype(np.float32), y

    x_train, y_train = make(n_train)
    x_test, y_test = make(max(n_train // 4, 100))
    return x_train, y_train, x_test, y_test


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser, learning_rate=0.5, noise_multiplier=1.1, batch_size=128,
                         epochs=3, num_examples=2048)
    parser.set_defaults(optimizer="jl-sgd")
    args = parser.parse_args()
    check_data_arguments(parser, args)
    data = synthetic_mnist(args.num_examples, args.seed) if args.synthetic else load_mnist(args.data)
    train(build_model(), data, args)


if __name__ == "__main__":
    main()
