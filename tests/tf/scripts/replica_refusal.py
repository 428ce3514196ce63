"""One private step on two replicas (MirroredStrategy, two logical CPUs) where only replica
0's batch makes a layer write a non-trainable weight, so only replica 0's checks refuse the
step. Prints JSON: how far the weights moved and whether the host raised the refusal
(run by a test: the strategy needs its devices before TensorFlow starts).

    python replica_refusal.py
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras
import numpy as np

import fdp_tf
from fdp_tf.verify import raise_recorded_refusals


class LargestOutlier(keras.layers.Layer):
    """Keeps the largest input above 5 in a non-trainable weight (0 while none came)."""

    def build(self, shape):
        self.seen = self.add_weight(shape=(), initializer="zeros", trainable=False, name="seen")

    def call(self, x, training=None):
        if training:
            self.seen.assign(tf.maximum(self.seen, tf.reduce_max(x) - 5.0))
        return x


def no_gradient(y_true, y_pred):  # one entry per row, gradient 0: the update is the noise alone
    return 0.0 * tf.reduce_sum(y_pred, axis=1) + 0.0 * tf.cast(y_true, y_pred.dtype)


strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    inner = keras.Sequential([keras.Input((10,)), LargestOutlier(), keras.layers.Dense(500, use_bias=False)])
    optimizer = fdp_tf.DPSGDVanilla(l2_norm_clip=0.5, noise_multiplier=2.0, learning_rate=1.0,
                                    expected_batch_size=8)
    model = fdp_tf.make_private(inner, optimizer=optimizer, loss=no_gradient)
    optimizer.build(model.trainable_variables)
model.open_segment(fdp_tf.PoissonSampling(num_examples=64, expected_batch_size=8))

rng = np.random.default_rng(0)
x0, x1 = rng.normal(size=(2, 4, 10)).astype("float32")
x0[0, 0] = 100.0  # replica 0 only
xs = strategy.experimental_distribute_values_from_function(
    lambda ctx: tf.constant(x0 if ctx.replica_id_in_sync_group == 0 else x1))
ys = strategy.experimental_distribute_values_from_function(lambda ctx: tf.zeros([4]))


@tf.function
def step(x, y):
    def on_replica(x, y):
        result = model.private_gradients(x, y)
        model.optimizer.apply_gradients(zip(result.gradients, model.trainable_variables))

    strategy.run(on_replica, args=(x, y))


kernel = inner.layers[-1].kernel
before = np.array(kernel.numpy())
step(xs, ys)
try:
    raise_recorded_refusals(optimizer)
    raised = ""
except ValueError as err:
    raised = str(err)
seen = [float(v) for v in strategy.experimental_local_results(inner.layers[0].seen.value)]
print(json.dumps({"moved": float(np.abs(np.array(kernel.numpy()) - before).max()), "raised": raised,
                  "seen": seen}))
