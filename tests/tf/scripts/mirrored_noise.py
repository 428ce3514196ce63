"""One private step under tf.distribute; prints JSON with the measured std of the
update of a zero-gradient model and the ledger (run by a test).

    python mirrored_noise.py {vanilla,jl} [mirrored|multiworker]

mirrored: MirroredStrategy on two logical CPUs. multiworker:
MultiWorkerMirroredStrategy as one worker (no TF_CONFIG), the same code path with
collective ops."""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras
import numpy as np

import fdp_tf

method = sys.argv[1]
kind = sys.argv[2] if len(sys.argv) > 2 else "mirrored"
sigma, clip, batch, n = 2.0, 0.5, 8, 64


def zero_loss(y_true, y_pred):
    return 0.0 * tf.reduce_sum(y_pred, axis=1) + 0.0 * tf.cast(y_true, y_pred.dtype)


if kind == "multiworker":
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
else:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    inner = keras.Sequential([keras.Input((10,)), keras.layers.Dense(2000, use_bias=False)])
    dp = dict(l2_norm_clip=clip, noise_multiplier=sigma, learning_rate=1.0, expected_batch_size=batch)
    optimizer = (fdp_tf.DPSGDJL(jl_projections=1, **dp) if method == "jl"
                 else fdp_tf.DPSGDVanilla(per_example_method="vectorized", **dp))
    model = fdp_tf.make_private(inner, optimizer=optimizer, loss=zero_loss)
before = inner.trainable_variables[0].numpy().copy()
x = np.random.default_rng(0).normal(size=(n, 10)).astype("float32")
y = np.zeros(n, "float32")
data = fdp_tf.poisson_batches(x, y, expected_batch_size=batch, steps_per_epoch=1)
model.fit(data, epochs=1, verbose=0)
update = before - inner.trainable_variables[0].numpy()
print(json.dumps({
    "replicas": strategy.num_replicas_in_sync,
    "std": float(update.std()), "target": sigma * clip / batch, "size": int(update.size),
    "steps": model.ledger.steps, "rate": model.ledger.segments[-1].sampling_rate,
}))
