"""A privacy fuzzer for fdp_tf: random models on random training paths, checked against
ground truth computed independently of fdp_tf.

Every generated case must end one of two ways: trained privately, or refused with a
``ValueError`` (a clear error). Anything else is a finding:

(a) sensitivity. With sigma = 0, SGD at learning rate 1 and the same JL directions (two
    optimizers seeded alike), one step on a batch D and one on D' = D minus example i
    move the weights by g(D) and g(D'); B (g(D) - g(D')) must be the removed example's
    own clipped term c_i g_i, with g_i its gradient computed with a plain GradientTape
    (on that row alone; with dropout, on the whole batch's loss of that row, the same
    masks): nothing else may change. Exact clipping: c_i = min(1, C / ||g_i||), so the
    term's norm is <= C (1 + 1e-4). DP-SGD-JL: c_i = min(1, C / M_i) with M_i the JL
    estimate of ||g_i|| from the shared directions (its excess over C is what the JL
    mechanism's accounting covers), so only c_i >= 0 and the direction are checked.
    No non-trainable weight may change (data-dependent state released unnoised), not
    even in a step that is refused.
(b) noise. With the same seeds, sigma = 1 minus sigma = 0 is the noise alone: its
    sample variance over the model's P weights must fit (sigma C / B)^2 (a chi-square
    test at 1e-6 on each side).
(c) accounting. Several steps on a path that does things to the weights and the
    optimizer between them (BackupAndRestore resumed with other settings, EarlyStopping
    restoring the best weights, ModelCheckpoint + load_model + more training,
    recompile, set_weights, train_on_batch after fit, a custom loop or train_step): the
    logged epsilon must be >= the certified lower bound of an independent
    ``fdp.PLDAccountant`` of the steps the fuzzer counted (Keras callbacks, its own
    loops), each at the sampling it ran (rate 1 where nothing vouches for it). Exact
    clipping draws its batches by Poisson sampling, random allocation (charged per pass
    over the sampler that ran a step, counted by Keras epochs) or without replacement
    (replace-one; compared with the guarantee itself, as its lower end is an attack).

Models come from the grammar of ``fuzz_models``; the paths of (a) and (b) are ``fit``
(eager or ``jit_compile``), a custom loop, a custom ``train_step``, ``train_on_batch``
and ``fit`` under a two-replica ``MirroredStrategy`` (two logical CPUs, when this
script configures TensorFlow first; in a process where TensorFlow already started, that
path runs as ``fit``). With ``--later-step`` every checked step runs after a clean step on
the same trace (its probe done, nothing pending on the host), and the custom loop is the
user's step in a ``tf.function``.

    python tools/privacy_fuzz.py --budget 60            # minutes of random search
    python tools/privacy_fuzz.py --cases 40 --seed 0    # a fixed sample
    python tools/privacy_fuzz.py --budget 20 --hostile-loss   # and losses refused on some batches
    python tools/privacy_fuzz.py --budget 20 --hostile-loss --later-step   # each after a clean step

Seeds are explicit (the fuzzer needs repeatable directions and noise), so fdp_tf's
``NotPrivateWarning`` is silenced here: no model trained by this script is private.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

try:  # two logical CPUs for the MirroredStrategy path (only before TensorFlow starts)
    _cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
except RuntimeError:
    pass

import keras  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fdp  # noqa: E402
import fdp_tf  # noqa: E402
from fuzz_common import CLIP, LOSS, LOSSES, OwnStep, make_optimizer  # noqa: E402
from fuzz_models import STEP_PATHS, Case, random_case  # noqa: E402
from fdp_tf.refusals import REFUSED, as_value_error  # noqa: E402


def two_replicas() -> bool:
    return len(tf.config.list_logical_devices("CPU")) >= 2


_STRATEGY: list[tf.distribute.Strategy] = []


def mirrored() -> tf.distribute.Strategy:
    """One MirroredStrategy for the whole process: a second one reuses the first one's
    collective instance keys, and TensorFlow then matches an all-reduce of one model
    with another's (a shape mismatch that is the fuzzer's doing, not fdp_tf's)."""
    if not _STRATEGY:
        _STRATEGY.append(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
    return _STRATEGY[0]


# ------------------------------------------------------------------ the paths


def _flat(grads: Any, variables: Any) -> np.ndarray:
    return np.concatenate([np.zeros(v.shape).ravel() if g is None else np.asarray(tf.convert_to_tensor(g)).ravel()
                           for g, v in zip(grads, variables)])  # (embeddings: IndexedSlices)


def own_gradient(case: Case, i: int) -> np.ndarray:
    """Example i's gradient with a plain GradientTape (no fdp_tf code): on its row alone,
    or with dropout the gradient of its loss in the whole batch (the same masks, so under
    ``jit_compile`` when the step is)."""
    keras.backend.clear_session()  # many models in one process: free the old graphs
    model = case.build()
    x, y, row = (case.x, case.y, i) if case.dropout else (case.x[i:i + 1], case.y[i:i + 1], 0)

    def gradient(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))[row]
        return tape.gradient(loss, model.trainable_variables)

    if case.dropout and case.path == "fit_jit":
        # XLA draws dropout masks unlike eager TensorFlow (same seed, other bits): the
        # reference must see the masks the compiled step sees (seed 3627592295)
        gradient = tf.function(gradient, jit_compile=True)
    return _flat(gradient(tf.constant(x), tf.constant(y)), model.trainable_variables)


def removal_error(case: Case, term: np.ndarray, own: np.ndarray) -> tuple[float, str]:
    """How far B (g(D) - g(D')) = ``term`` is from example i's own clipped term c_i g_i, in
    units of C (0 for a private step), and a note."""
    norm = float(np.linalg.norm(own))
    if norm == 0.0:
        return float(np.linalg.norm(term)) / CLIP, "zero gradient"
    if case.optimizer == "vanilla":
        expected = min(1.0, CLIP / norm) * own
        return float(np.linalg.norm(term - expected)) / CLIP, f"||term|| {np.linalg.norm(term) / CLIP:.4f} C"
    c = max(float(term @ own) / norm**2, 0.0)  # the least-squares c_i >= 0
    return float(np.linalg.norm(term - c * own)) / CLIP, f"c_i ||g_i|| {c * norm / CLIP:.3f} C"


def _state(model: keras.Model) -> list[np.ndarray]:
    """The non-trainable weights a step must not change (dropout seed states may)."""
    return [np.array(v.numpy()) for v in model.non_trainable_variables if "seed_generator" not in v.path]


class StepRunner:
    """One compiled model for the steps of a check: ``step(rows)`` resets the weights, the
    optimizer's variables and its seeded generator to one start and runs one private step
    on ``rows`` by the case's path, so every removal reuses the first step's trace (a
    fresh model per removal retraced a recurrent model for minutes). The reset includes
    the generator's state and, for two replicas (whose JL directions are keyed by the
    count of released steps), that count: a replay of the same step, which only a test
    harness may do (a user's odometer never goes back)."""

    def __init__(self, case: Case, sigma: float, batch: int, seed: int) -> None:
        self.case, self.sigma, self.batch, self.seed = case, sigma, batch, seed
        self.path = case.path if case.path != "distributed" or two_replicas() else "fit"
        self.model: keras.Model | None = None
        self.clean_step = "none"  # with ``case.later_step``: "ran" or why not
        self._loop: Any = None  # the custom loop's traced step (``case.later_step``)

    def _build(self) -> keras.Model:
        keras.backend.clear_session()
        scope = (mirrored().scope() if self.path == "distributed"
                 else tf.distribute.get_strategy().scope())
        with scope:
            wrapper = OwnStep if self.path == "custom_train_step" else fdp_tf.PrivateModel
            model = wrapper(self.case.build())
            model.compile(optimizer=make_optimizer(self.case.optimizer, self.sigma, self.batch, 1.0, self.seed),
                          loss=LOSSES[self.case.loss], jit_compile=self.path == "fit_jit")
            model.optimizer.build(model.trainable_variables)
        self.start = [np.array(v.numpy()) for v in self._variables(model)]
        return model

    @staticmethod
    def _variables(model: keras.Model) -> list[Any]:
        # the generator's state too (its key for the JL directions was drawn at construction)
        optimizer = model.optimizer
        return [*model.variables, *optimizer.variables, optimizer.rng.state, optimizer._dp_booking.counter]

    def _reset(self) -> keras.Model:
        if self.model is None:
            self.model = self._build()
            if not self.case.later_step:
                return self.model
            self._clean_step(self.model)
        model = self.model
        for v, value in zip(self._variables(model), self.start):
            v.assign(value)
        return model

    def _clean_step(self, model: keras.Model) -> None:
        """A step the checked ones come after, on the same trace (the same batch size), so its
        probe is done and nothing is pending on the host when they run. Its labels are each
        row's predicted class (every row's loss <= log(CLASSES) < 1.25: no hostile loss
        refuses it); its inputs the case's, or if that is refused (a layer that learns from
        an outlier) the case's clipped to [-1, 1]."""
        x, every = self.case.x, np.arange(len(self.case.x))
        candidates = [x] if x.dtype.kind == "i" else [x, np.clip(x, -1.0, 1.0)]
        sampling = fdp_tf.PoissonSampling(num_examples=len(x), expected_batch_size=self.batch)
        for inputs in candidates:
            labels = np.argmax(np.asarray(model.base_model(inputs, training=False)), axis=-1).astype("int32")
            try:
                self._run(model, inputs, labels, every, sampling)
                self.clean_step = "ran"
                return
            except ValueError as err:  # refused all the same (a model that mixes rows): not a later step
                self.clean_step = f"refused ({str(err).splitlines()[0][len(REFUSED):][:50]})"

    def step(self, rows: np.ndarray) -> np.ndarray:
        """The weight change of one private step on ``rows`` of the case's data."""
        model, case = self._reset(), self.case
        x, y = case.x[rows], case.y[rows]
        before = [np.array(v.numpy()) for v in model.trainable_variables]
        state = _state(model.base_model)
        sampling = fdp_tf.PoissonSampling(num_examples=len(case.x), expected_batch_size=self.batch)
        try:
            self._run(model, x, y, rows, sampling)
        except ValueError:  # a refusal: nothing of the step may stay either
            self._unchanged(state, model, "refused")
            raise
        self._unchanged(state, model, "not refused")
        return np.concatenate([(np.array(v.numpy()) - b).ravel()
                               for v, b in zip(model.trainable_variables, before)])

    def _traced_loop(self, model: keras.Model, x: np.ndarray, y: np.ndarray) -> Any:
        """A user's custom loop step in one ``tf.function`` (one trace: the batch size is dynamic)."""
        if self._loop is None:
            spec = [tf.TensorSpec((None, *x.shape[1:]), tf.as_dtype(x.dtype)), tf.TensorSpec((None,), tf.int32)]

            @tf.function(input_signature=spec)
            def loop_step(x: tf.Tensor, y: tf.Tensor) -> None:
                result = model.private_gradients(x, y)
                model.optimizer.apply_gradients(zip(result.gradients, model.trainable_variables))

            self._loop = loop_step
        return self._loop

    @staticmethod
    def _unchanged(state: list[np.ndarray], model: keras.Model, outcome: str) -> None:
        for a, b in zip(state, _state(model.base_model)):
            if not np.array_equal(a, b):
                raise AssertionError(f"a non-trainable weight changed in a private step that was {outcome}")

    def _run(self, model: keras.Model, x: np.ndarray, y: np.ndarray, rows: np.ndarray, sampling: Any) -> None:
        if self.path in ("fit", "fit_jit", "custom_train_step", "distributed"):
            # repeated: a first step whose method crashed (pfor, Conv3D groups) trains the next;
            # batched from slices: the batch size is dynamic (as poisson_batches gives), one trace
            data = tf.data.Dataset.from_tensor_slices((x, y)).batch(len(rows)).repeat()
            model.fit(data, epochs=1, steps_per_epoch=1, verbose=0, sampling=sampling)
        elif self.path == "custom_loop" and self.case.later_step:
            # a later step means something for a trace only: the user's loop in a tf.function
            model.open_segment(sampling)
            try:
                self._traced_loop(model, x, y)(tf.constant(x), tf.constant(y))
            except tf.errors.OpError as err:  # a refusal inside the user's graph
                refusal = as_value_error(err)
                if refusal is None:
                    raise
                raise refusal from err
        elif self.path == "custom_loop":
            model.open_segment(sampling)
            result = model.private_gradients(tf.constant(x), tf.constant(y))
            model.optimizer.apply_gradients(zip(result.gradients, model.trainable_variables))
        else:
            model.open_segment(sampling)
            model.train_on_batch(x, y)


@dataclass
class Outcome:
    case: Case
    check: str  # "step" or "ledger"
    status: str  # "private", "refused" or "VIOLATION"
    detail: str


def _refused_or_violation(case: Case, check: str, err: BaseException) -> Outcome:
    if isinstance(err, ValueError):
        return Outcome(case, check, "refused", str(err).splitlines()[0][:160])
    return Outcome(case, check, "VIOLATION", f"{type(err).__name__}: {str(err).splitlines()[0][:200]}\n"
                                             f"{traceback.format_exc(limit=4)}")


def check_case(case: Case) -> Outcome:
    """Run checks (a) and (b) on ``case``; a ValueError anywhere is a refusal."""
    n = len(case.x)
    every = np.arange(n)
    runner: StepRunner | None = None
    try:
        # with dropout only the last row: the others keep their masks (a prefix of the draw)
        removed = [n - 1] if case.dropout else list(range(n))
        own = {i: own_gradient(case, i) for i in removed}  # first: it clears Keras's session
        runner = StepRunner(case, 0.0, n, seed=11)
        full = runner.step(every)
        worst, note = 0.0, ""
        for i in removed:
            term = -n * (full - runner.step(np.delete(every, i)))  # lr 1: w -= g
            error, what = removal_error(case, term, own[i])
            if error > worst:
                worst, note = error, what
        if not worst <= 1e-4:
            return Outcome(case, "step", "VIOLATION", f"removing one example moves B g by {worst:.4f} C more "
                                                      f"than its own clipped term ({note})")
        noise = StepRunner(case, 1.0, n, seed=11).step(every) - full
        statistic = float(np.sum(noise**2) / (CLIP / n) ** 2)
        low, high = stats.chi2.ppf([1e-6, 1 - 1e-6], df=noise.size)
        if not low <= statistic <= high:
            return Outcome(case, "step", "VIOLATION", f"noise variance {statistic / noise.size:.4f} x "
                                                      f"(sigma C / B)^2 over {noise.size} weights")
        replicas = 2 if case.path == "distributed" and two_replicas() else 1
        return Outcome(case, "step", "private", f"removal error {worst:.1e} C, noise ok, {replicas} replica(s)"
                                                f"{', clean step ' + runner.clean_step if case.later_step else ''}")
    except Exception as err:  # noqa: BLE001 - anything but a ValueError is a finding
        out = _refused_or_violation(case, "step", err)
        if case.later_step and runner is not None:
            out.detail = f"(clean step {runner.clean_step}) {out.detail}"
        return out


def check_accounting(case: Case, delta: float = 1e-5) -> Outcome:
    """(c): the logged epsilon after the case's ledger path is >= an independent bound."""
    from fuzz_ledger import run_ledger_path, scheme_of

    try:
        with tempfile.TemporaryDirectory() as tmp:
            logged, phases = run_ledger_path(case, tmp, delta)

        def truth(upto: int) -> float:  # the certified lower bound of the first phases
            run = [p.events() for p in phases[:upto] if p.steps]
            accountant = fdp.PLDAccountant()
            for mechanism, count in run:
                accountant = accountant.compose(mechanism, steps=count)
            if not run:
                return 0.0
            if accountant.neighboring == "replace_one":
                # its lower end is an attack, far below the guarantee: compare with the
                # guarantee itself (the same steps must cost at least as much)
                return accountant.get_epsilon(delta) * (1 - 1e-9)
            return accountant.get_epsilon_bounds(delta)[0]

        steps = sum(p.steps for p in phases)
        for where, value, upto in logged:
            if not value >= truth(upto):
                return Outcome(case, "ledger", "VIOLATION", f"{case.ledger_path}/{scheme_of(case)}: logged epsilon {value:.4f} "
                                                            f"({where}) < {truth(upto):.4f} of the steps run by then")
        return Outcome(case, "ledger", "private", f"{case.ledger_path}/{scheme_of(case)}: epsilon >= "
                                                  f"{truth(len(phases)):.4f} ({steps} steps)")
    except Exception as err:  # noqa: BLE001
        return _refused_or_violation(case, "ledger", err)


def run(seeds: Any, deadline: float = math.inf, accounting_every: int = 4, path: str | None = None,
        activation: str | None = None, hostile_loss: bool = False, later_step: bool = False) -> list[Outcome]:
    """Check the cases of ``seeds`` until ``deadline`` (time.monotonic()); prints a line each.
    With ``activation``, only the cases whose trunk has it."""
    outcomes = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seeded on purpose (NotPrivateWarning), sampling notes
        for k, seed in enumerate(seeds):
            if time.monotonic() > deadline:
                break
            paths = STEP_PATHS if path is None else (path,)
            case = random_case(seed, paths=paths, hostile_loss=hostile_loss, later_step=later_step)
            if activation is not None and case.activation != activation:
                continue
            results = [check_case(case)]
            if k % accounting_every == 0:
                results.append(check_accounting(case))
            for out in results:
                print(f"{case.describe()} [{out.check}]: {out.status} {out.detail}", flush=True)
            outcomes.extend(results)
    return outcomes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=None, help="minutes of random search (fresh seeds)")
    ap.add_argument("--cases", type=int, default=40, help="number of cases without --budget")
    ap.add_argument("--seed", type=int, default=0, help="first case seed (a fixed sample)")
    ap.add_argument("--path", choices=STEP_PATHS, default=None, help="only this path for checks (a), (b)")
    ap.add_argument("--no-ledger", action="store_true", help="skip the accounting check (c)")
    ap.add_argument("--activation", choices=["softsign"], default=None,
                    help="only the cases whose trunk has this activation (no second derivative in TensorFlow)")
    ap.add_argument("--hostile-loss", action="store_true",
                    help="half the cases get a loss with one entry per batch on some batches (refused then)")
    ap.add_argument("--later-step", action="store_true",
                    help="every checked step runs after a clean step on its trace (probe done, nothing pending)")
    args = ap.parse_args()
    every = 10**9 if args.no_ledger else 4
    began = time.monotonic()
    if args.budget is not None:
        start = int.from_bytes(os.urandom(4), "little")
        outcomes = run(range(start, start + 10**9), deadline=began + 60 * args.budget, path=args.path,
                       accounting_every=every, activation=args.activation, hostile_loss=args.hostile_loss,
                       later_step=args.later_step)
    else:
        outcomes = run(range(args.seed, args.seed + args.cases), path=args.path, accounting_every=every,
                       activation=args.activation, hostile_loss=args.hostile_loss, later_step=args.later_step)
    counts = {s: sum(o.status == s for o in outcomes) for s in ("private", "refused", "VIOLATION")}
    models = len({o.case.seed for o in outcomes})
    by_path: dict[str, int] = {}
    for o in outcomes:
        key = o.case.path if o.check == "step" else f"ledger:{o.case.ledger_path}"
        by_path[key] = by_path.get(key, 0) + 1
    print(f"{models} models, {len(outcomes)} checks in {(time.monotonic() - began) / 60:.1f} min: {counts}")
    print("checks by path: " + ", ".join(f"{k} {v}" for k, v in sorted(by_path.items())))
    raise SystemExit(1 if counts["VIOLATION"] else 0)


if __name__ == "__main__":
    main()
