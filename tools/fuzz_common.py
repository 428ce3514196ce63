"""What the privacy fuzzer's checks share: the clip norm, the loss, the DP optimizers
they train with, and a user's own ``train_step`` built from fdp_tf's documented pieces.

Kept apart from ``privacy_fuzz`` (the step checks) and ``fuzz_ledger`` (the accounting
paths) so that neither imports the other.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

import fdp_tf

CLIP = 0.1
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def rare_one_entry(y_true: Any, y_pred: Any) -> Any:
    """A hostile "robust" loss: one loss per row, but one entry for the whole batch (its
    mean) when some row's loss exceeds 1.25 (refused at run time, on such batches only)."""
    per_row = LOSS(y_true, y_pred)
    return tf.cond(tf.reduce_max(per_row) > 1.25, lambda: tf.reduce_mean(per_row, keepdims=True),
                   lambda: per_row)


#: the fuzzer's losses by name (``Case.loss``)
LOSSES = {"per_row": LOSS, "rare_one_entry": rare_one_entry}
JL_PROJECTIONS = 3
#: ``"jl_forward"`` / ``"jl_forward_batched"``: one / three directions in forward mode, through
#: the recurrent loops a tangent pass (the directions vectorized) then a taped pass
#: (fdp_tf.recurrent_tangents)
JL_FORWARD_PROJECTIONS = {"jl_forward": 1, "jl_forward_batched": 3}


def jl_projections_of(kind: str) -> int:
    """r of the fuzzer's optimizer ``kind`` (``"jl"``, ``"jl_forward"``, ``"jl_forward_batched"``)."""
    return JL_FORWARD_PROJECTIONS.get(kind, JL_PROJECTIONS)


def make_optimizer(kind: str, sigma: float, batch: int, learning_rate: float,
                   seed: int | None = None) -> fdp_tf.DPOptimizer:
    """DP-SGD-JL (``kind="jl"``; ``"jl_forward"``, ``"jl_forward_batched"``: r = 1, 3 in forward
    mode) or exact DP-SGD at the fuzzer's clip norm."""
    common = dict(l2_norm_clip=CLIP, noise_multiplier=sigma, expected_batch_size=batch,
                  learning_rate=learning_rate, seed=seed)
    if kind == "jl":
        return fdp_tf.DPSGDJL(jl_projections=JL_PROJECTIONS, **common)
    if kind in JL_FORWARD_PROJECTIONS:
        return fdp_tf.DPSGDJL(jl_projections=JL_FORWARD_PROJECTIONS[kind], jvp_method="forward", **common)
    return fdp_tf.DPSGDVanilla(**common)


class OwnStep(fdp_tf.PrivateModel):
    """A user's train_step from the documented pieces (not PrivateModel.train_step)."""

    def train_step(self, data: Any) -> dict[str, Any]:
        x, y = data
        result = self.private_gradients(x, y)
        self.optimizer.apply_gradients(zip(result.gradients, self.trainable_variables))
        return {"loss": tf.reduce_mean(result.forward.per_example_losses)}
