"""Random allocation and without-replacement batches: the samplers, and what fit books for them."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow", minversion="2.16")
pytest.importorskip("keras", minversion="3.0")

import itertools
import warnings

import numpy as np

import fdp
import fdp_tf
from tf_helpers import CE, dense_data, dense_model


def _labels(dataset) -> list[list[int]]:
    return [np.asarray(by).tolist() for _, by in dataset]


def _model(optimizer=None):
    optimizer = optimizer or fdp_tf.DPSGDVanilla(l2_norm_clip=1.0, noise_multiplier=1.0)
    return fdp_tf.make_private(dense_model(), optimizer=optimizer, loss=CE)


def _epsilon(mechanism, steps: int) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fdp.PLDAccountant().compose(mechanism, steps=steps).get_epsilon(1e-5)


def test_random_allocation_puts_every_example_in_one_step_of_every_pass() -> None:
    n, t = 200, 7
    x = np.arange(n, dtype=np.float32)[:, None]
    dataset = fdp_tf.random_allocation_batches(x, np.arange(n), steps_per_epoch=t)
    passes = [_labels(dataset) for _ in range(3)]
    for batches in passes:
        assert len(batches) == t
        assert sorted(i for b in batches for i in b) == list(range(n))  # each exactly once
    assert passes[0] != passes[1]  # a fresh allocation every pass (OS entropy)
    assert fdp_tf.sampling_of(dataset) == fdp_tf.RandomAllocationSampling(n, t)


def test_random_allocation_steps_are_uniform() -> None:
    """Each example's step is uniform over the t steps: chi-square over 300 passes."""
    n, t, passes = 30, 5, 300
    x = np.arange(n, dtype=np.float32)[:, None]
    dataset = fdp_tf.random_allocation_batches(x, np.arange(n), steps_per_epoch=t, seed=0)
    counts = np.zeros((n, t))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fdp_tf.NotPrivateWarning)
        for _ in range(passes):
            for step, batch in enumerate(_labels(dataset)):
                counts[batch, step] += 1
    expected = passes / t
    chi2 = ((counts - expected) ** 2 / expected).sum()
    dof = n * (t - 1)
    assert abs(chi2 - dof) < 6 * np.sqrt(2 * dof)


def test_without_replacement_batches_are_exactly_b_distinct_examples() -> None:
    n, b = 50, 8
    x = np.arange(n, dtype=np.float32)[:, None]
    dataset = fdp_tf.without_replacement_batches(x, np.arange(n), batch_size=b)
    batches = _labels(dataset)
    assert len(batches) == 7  # ceil(N / B)
    assert all(len(set(batch)) == len(batch) == b for batch in batches)
    assert fdp_tf.sampling_of(dataset) == fdp_tf.WithoutReplacementSampling(n, b, 7)


@pytest.mark.parametrize(("make", "name"), [
    (lambda x: fdp_tf.random_allocation_batches(x, steps_per_epoch=0), "steps_per_epoch"),
    (lambda x: fdp_tf.random_allocation_batches(x, steps_per_epoch=11), "steps_per_epoch"),
    (lambda x: fdp_tf.random_allocation_batches(x, steps_per_epoch=4, selected=5), "selected"),
    (lambda x: fdp_tf.RandomAllocationSampling(10, 4, selected=0), "selected"),
    (lambda x: fdp_tf.without_replacement_batches(x, batch_size=11), "batch_size"),
    (lambda x: fdp_tf.without_replacement_batches(x, batch_size=2, steps_per_epoch=0), "steps_per_epoch"),
])
def test_bad_arguments_name_themselves(make, name) -> None:
    with pytest.raises(ValueError, match=name):
        make(np.zeros((10, 2), np.float32))


def test_a_seed_warns_not_private() -> None:
    with pytest.warns(fdp_tf.NotPrivateWarning):
        fdp_tf.random_allocation_batches(np.zeros((10, 2), np.float32), steps_per_epoch=2, seed=1)


def test_fit_books_random_allocation_in_whole_epochs() -> None:
    """Two full passes are two epochs; a pass cut short (steps_per_epoch=3 of t=8) is a whole
    epoch, and so is the next one, in a second fit: 4 epochs, not ceil(22 / 8) = 3."""
    x, y = dense_data(n=64)
    dataset = fdp_tf.random_allocation_batches(x, y, steps_per_epoch=8)
    model = _model()
    model.fit(dataset, epochs=2, verbose=0)
    assert model.optimizer.expected_batch_size == 8  # floor(N / t)
    (segment,) = model.ledger.segments
    assert (segment.sampling, segment.scheme_size, segment.steps) == ("random_allocation", 8, 16)
    model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0)
    model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0)
    assert model.ledger.segments[0].events() == 4
    epoch = fdp.RandomAllocation(fdp.Gaussian(noise_multiplier=1.0), steps_per_epoch=8)
    assert model.epsilon(1e-5) == pytest.approx(_epsilon(epoch, 4), rel=1e-9)


def test_fit_books_without_replacement_under_replace_one() -> None:
    x, y = dense_data(n=64)
    model = _model()
    model.fit(fdp_tf.without_replacement_batches(x, y, batch_size=16), epochs=1, verbose=0)
    (segment,) = model.ledger.segments
    assert (segment.sampling, segment.neighboring, segment.steps) == ("without_replacement", "replace_one", 4)
    step = fdp.SampledWithoutReplacement(fdp.Gaussian(noise_multiplier=0.5), sample_size=16, dataset_size=64)
    assert model.epsilon(1e-5) == pytest.approx(_epsilon(step, 4), rel=1e-9)
    # a step of unknown sampling after it is a full batch under replace-one, not a refusal
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fdp_tf.SamplingWarning)
        model.train_on_batch(x[:16], y[:16])
    full = fdp.SampledWithoutReplacement(fdp.Gaussian(noise_multiplier=0.5), sample_size=1, dataset_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = fdp.PLDAccountant().compose(step, steps=4).compose(full).get_epsilon(1e-5)
    assert model.epsilon(1e-5) == pytest.approx(expected, rel=1e-9)


def test_relations_are_not_mixed_and_nothing_runs_when_refused() -> None:
    x, y = dense_data(n=64)
    model = _model()
    model.fit(fdp_tf.poisson_batches(x, y, expected_batch_size=16), epochs=1, verbose=0)
    steps = model.ledger.steps
    with pytest.raises(ValueError, match="replacing one example"):
        model.fit(fdp_tf.without_replacement_batches(x, y, batch_size=16), epochs=1, verbose=0)
    assert model.ledger.steps == steps
    other = _model()
    other.fit(fdp_tf.without_replacement_batches(x, y, batch_size=16), epochs=1, verbose=0)
    with pytest.raises(ValueError, match="adding or removing"):
        other.fit(fdp_tf.random_allocation_batches(x, y, steps_per_epoch=4), epochs=1, verbose=0)


def test_jl_on_random_allocation_is_booked_as_its_epochs_and_a_heavy_tail_is_refused() -> None:
    """DP-SGD-JL on random-allocation batches: booked as RandomAllocation(JL) in whole epochs,
    its epsilon the accountant's; a sigma and r whose tail the lattice cannot hold (sigma 1,
    r 2) are refused before a step runs."""
    x, y = dense_data(n=64)
    heavy = _model(fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=1.0, jl_projections=2))
    with pytest.raises(ValueError, match="too heavy-tailed"):
        heavy.fit(fdp_tf.random_allocation_batches(x, y, steps_per_epoch=4), epochs=1, verbose=0)
    assert heavy.ledger.steps == 0
    jl = _model(fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=3.0, jl_projections=30))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jl.fit(fdp_tf.random_allocation_batches(x, y, steps_per_epoch=4), epochs=2, verbose=0)
    (segment,) = jl.ledger.segments
    assert (segment.kind, segment.sampling, segment.scheme_size, segment.jl_projections) == (
        "jl", "random_allocation", 4, 30)
    epoch = fdp.RandomAllocation(fdp.JL(noise_multiplier=3.0, jl_projections=30), steps_per_epoch=4)
    assert jl.epsilon(1e-5) == pytest.approx(_epsilon(epoch, 2), rel=1e-9)
    assert fdp_tf.PrivacyLedger.from_table(jl.ledger.table()).segments == jl.ledger.segments
    with pytest.raises(ValueError, match="exact clipping"):
        heavy.open_segment(fdp_tf.WithoutReplacementSampling(64, 16))


def test_custom_loops_are_refused_for_random_allocation() -> None:
    x, y = dense_data(n=64)
    model = _model()
    with pytest.raises(ValueError, match="fit"):
        model.open_segment(fdp_tf.RandomAllocationSampling(64, 4))
    model.open_segment(fdp_tf.WithoutReplacementSampling(64, 16))
    model.train_on_batch(x[:16], y[:16])
    assert model.ledger.segments[0].sampling == "without_replacement"


def test_the_saved_table_keeps_the_scheme_and_old_tables_read_as_poisson() -> None:
    segments = (fdp_tf.Segment("gaussian", 1.0, 0, 0.125, 16, sampling="random_allocation", scheme_size=8),
                fdp_tf.Segment("gaussian", 2.0, 0, 0.25, 4, sampling="without_replacement", scheme_size=64),
                fdp_tf.Segment("jl", 1.0, 3, 0.5, 2),
                fdp_tf.Segment("jl", 2.0, 30, 0.01, 300, sampling="random_allocation", scheme_size=100))
    ledger = fdp_tf.PrivacyLedger(segments)
    assert fdp_tf.PrivacyLedger.from_table(ledger.table()).segments == segments
    old = ledger.table()
    old[:, 0] = np.where(old[:, 0] >= 0, 1.0, -1.0)  # a table written before schemes: code 1 = gaussian
    assert {s.sampling for s in fdp_tf.PrivacyLedger.from_table(old).segments} == {"poisson"}


def test_the_sampling_page_keras_block_runs() -> None:
    """docs/sampling.md, 'In Keras': each scheme's model books its scheme; epsilon is finite."""
    import contextlib
    import io
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "sampling.md").read_text()
    section = text[text.index("## In Keras"):text.index("## Shuffling")]
    block = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(block, "sampling.md", "exec"), {"__name__": "__doc__"})
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == ["poisson", "random allocation", "without replacement"]
    assert "30 steps booked as random_allocation" in lines[1]
    assert "30 steps booked as without_replacement" in lines[2]


def test_a_refused_sampling_changes_nothing_and_later_steps_are_booked() -> None:
    """Red team: the refusal came after the current segment was closed, and every later step
    (train_on_batch, 20 of them) was booked nowhere; the optimizer's B was changed too."""
    x, y = dense_data(n=64)
    jl = _model(fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=1.0, jl_projections=2))
    with pytest.raises(ValueError, match="too heavy-tailed"):
        jl.fit(fdp_tf.random_allocation_batches(x, y, steps_per_epoch=4), epochs=1, verbose=0)
    with pytest.raises(ValueError, match="exact clipping"):
        jl.open_segment(fdp_tf.WithoutReplacementSampling(64, 16))
    assert jl.optimizer.expected_batch_size is None
    jl.optimizer.expected_batch_size = 16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fdp_tf.SamplingWarning)
        for _ in range(3):
            jl.train_on_batch(x[:16], y[:16])
    assert jl.ledger.steps == 3 and jl.ledger.segments[0].sampling_rate == 1.0


def test_train_on_batch_inside_fit_is_not_booked_at_fits_sampling() -> None:
    """Red team: a callback's train_on_batch during fit was booked under fit's sampling (here
    random allocation, whole epochs), with no warning; it is a batch nothing vouches for."""
    import keras

    x, y = dense_data(n=64)
    model = _model()

    class Extra(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            for _ in range(2):
                self.model.train_on_batch(x[:8], y[:8])

    with pytest.warns(fdp_tf.SamplingWarning):
        model.fit(fdp_tf.random_allocation_batches(x, y, steps_per_epoch=8), epochs=2, verbose=0,
                  callbacks=[Extra()])
    by_scheme = {}
    for segment in model.ledger.segments:
        by_scheme[segment.sampling, segment.sampling_rate] = by_scheme.get(
            (segment.sampling, segment.sampling_rate), 0) + segment.steps
    assert by_scheme == {("random_allocation", 0.125): 16, ("poisson", 1.0): 4}


def test_sampling_that_contradicts_the_sampler_is_refused() -> None:
    x, y = dense_data(n=64)
    model = _model()
    with pytest.raises(ValueError, match="contradicts"):
        model.fit(fdp_tf.without_replacement_batches(x, y, batch_size=16), verbose=0,
                  sampling=fdp_tf.PoissonSampling(num_examples=64, expected_batch_size=16))
    assert model.ledger.steps == 0


def test_random_allocation_of_k_steps_puts_every_example_in_k_uniform_steps() -> None:
    """selected=k: each example in exactly k distinct steps of every pass, fresh each pass,
    and its k-subset uniform over the C(t, k): chi-square over 400 seeded passes."""
    n, t, k = 200, 7, 3
    x = np.arange(n, dtype=np.float32)[:, None]
    dataset = fdp_tf.random_allocation_batches(x, np.arange(n), steps_per_epoch=t, selected=k)
    passes = [_labels(dataset) for _ in range(2)]
    for batches in passes:
        assert len(batches) == t
        assert all(len(set(b)) == len(b) for b in batches)
        assert np.bincount([i for b in batches for i in b], minlength=n).tolist() == [k] * n
    assert passes[0] != passes[1]
    assert fdp_tf.sampling_of(dataset) == fdp_tf.RandomAllocationSampling(n, t, k)

    n, t, k, rounds = 20, 5, 2, 400
    seeded = fdp_tf.random_allocation_batches(np.zeros((n, 1), np.float32), np.arange(n), steps_per_epoch=t,
                                              selected=k, seed=0)
    subsets = {s: i for i, s in enumerate(itertools.combinations(range(t), k))}
    counts = np.zeros((n, len(subsets)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fdp_tf.NotPrivateWarning)
        for _ in range(rounds):
            steps_of: dict[int, list[int]] = {}
            for step, batch in enumerate(_labels(seeded)):
                for i in batch:
                    steps_of.setdefault(i, []).append(step)
            for i, steps in steps_of.items():
                counts[i, subsets[tuple(steps)]] += 1
    expected = rounds / len(subsets)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    dof = n * (len(subsets) - 1)
    assert abs(chi2 - dof) < 6 * np.sqrt(2 * dof)


def test_fit_books_k_steps_per_example_and_refuses_them_for_jl() -> None:
    """k = 2 of t = 8: the noise is for B = floor(N k / t) = 16, the ledger reads k back from
    the rate k / t (also from the saved table), epsilon is RandomAllocation(selected=2)'s;
    DP-SGD-JL with k > 1 is refused before a step."""
    x, y = dense_data(n=64)
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the k > 1 bracket is wide: "accept the gap"
        model.fit(fdp_tf.random_allocation_batches(x, y, steps_per_epoch=8, selected=2), epochs=2, verbose=0)
        (segment,) = model.ledger.segments
        assert model.optimizer.expected_batch_size == 16
        assert (segment.sampling, segment.scheme_size, segment.selected, segment.events()) == (
            "random_allocation", 8, 2, 2)
        epoch = fdp.RandomAllocation(fdp.Gaussian(noise_multiplier=1.0), steps_per_epoch=8, selected=2)
        assert model.epsilon(1e-5) == pytest.approx(_epsilon(epoch, 2), rel=1e-9)
    assert fdp_tf.PrivacyLedger.from_table(model.ledger.table()).segments[0].selected == 2
    jl = _model(fdp_tf.DPSGDJL(l2_norm_clip=1.0, noise_multiplier=3.0, jl_projections=30))
    with pytest.raises(ValueError, match="Gaussian step only"):
        jl.fit(fdp_tf.random_allocation_batches(x, y, steps_per_epoch=8, selected=2), epochs=1, verbose=0)
    assert jl.ledger.steps == 0
