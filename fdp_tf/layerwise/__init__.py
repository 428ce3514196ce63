"""Exact per-example gradient norms layer by layer (``per_example_method="layerwise"``).

support: which layers are handled (static filter); pieces: per-example gradients in
outer-product form; recurrent: RNNs with the input projection outside the loop;
taps: recording, norms, the released reconstruction and its reconciliation.
"""

from fdp_tf.layerwise.support import layerwise_unsupported, tap_kind
from fdp_tf.layerwise.taps import LayerTaps, layerwise_norms, reconcile, reconstructed_sum

__all__ = [
    "LayerTaps",
    "layerwise_norms",
    "layerwise_unsupported",
    "reconcile",
    "reconstructed_sum",
    "tap_kind",
]
