"""The refinement loop of a query (fdp/pld/refinement.py), on scripted sides.

Every level's value is a valid bound, so a pass must report the best one it saw,
even when a finer level came out looser (a floored spacing, a larger FFT's
round-off charge), and must not keep refining a side that got looser.
"""

from __future__ import annotations

from dataclasses import dataclass

from fdp.pld.cells import Direction
from fdp.pld.refinement import delta_pass, epsilon_pass

R, A = Direction.REMOVE, Direction.ADD


@dataclass
class _Scripted:
    """A 'PLD' whose epsilon and delta are read from a table by level."""

    value: float
    #: what epsilon() returns to a delta pass (where the upper curve is down to the lower delta)
    reach: float | None = None

    def epsilon(self, delta: float) -> float:
        return self.value if self.reach is None else self.reach

    def delta(self, epsilon: float) -> float:
        return self.value


def _sides(table: dict, calls: list, reach: float | None = None):
    def side(d, pessimistic, level):
        calls.append((d, pessimistic, level))
        return _Scripted(table[(d, pessimistic)][level], reach)
    return side


# eps values by level: the optimistic side peaks at level 2, the pessimistic at level 1
TABLE = {(R, True): {0: 10.0, 1: 9.0, 2: 9.5, 3: 9.6}, (R, False): {0: 5.0, 1: 8.0, 2: 8.9, 3: 8.5}}


def test_a_pass_reports_the_best_level_of_each_side():
    calls: list = []
    result = epsilon_pass(_sides(TABLE, calls), [R], 1e-5, rtol=1e-3, max_refinements=3, refine=True)
    assert (result.lower, result.upper) == (8.9, 9.0)  # not the last levels' 8.5 and 9.5
    assert result.best == {(R, False): (8.9, 2), (R, True): (9.0, 1)}
    assert not result.converged


def test_a_side_that_got_looser_is_not_refined_again():
    calls: list = []
    epsilon_pass(_sides(TABLE, calls), [R], 1e-5, rtol=1e-3, max_refinements=3, refine=True)
    levels = {(d, s): max(lvl for dd, ss, lvl in calls if (dd, ss) == (d, s)) for d, s, _ in calls}
    # optimistic: 0, 1, 2, then 3 came out looser; pessimistic: 0, then 1, then 2 looser
    assert levels == {(R, False): 3, (R, True): 2}


def test_carried_sides_keep_their_bound_and_start_at_their_level():
    calls: list = []
    worse = {(R, True): {1: 9.4, 2: 9.3}, (R, False): {2: 8.0, 3: 8.1}}
    result = epsilon_pass(_sides(worse, calls), [R], 1e-5, rtol=1e-3, max_refinements=3, refine=True,
                          start={(R, False): (8.9, 2), (R, True): (9.0, 1)})
    assert (result.lower, result.upper) == (8.9, 9.0)
    # neither side beat its carried bound at its start level: neither is refined
    assert sorted({c[1:] for c in calls}) == [(False, 2), (True, 1)]


def test_the_screened_direction_is_computed_when_it_leads():
    table = {**TABLE, (A, True): {-2: 12.0, 0: 11.0, 1: 10.9}, (A, False): {0: 10.95, 1: 10.95}}
    result = epsilon_pass(_sides(table, []), [R, A], 1e-5, rtol=1e-2, max_refinements=3, refine=True)
    assert result.leading is A and (result.lower, result.upper) == (10.95, 11.0) and result.converged


def test_delta_pass_keeps_the_best_levels_too():
    table = {(R, True): {0: 2e-5, 1: 1.2e-5, 2: 1.5e-5, 3: 1.6e-5}, (R, False): {0: 5e-6, 1: 9e-6, 2: 8e-6}}
    # the upper curve never comes down to the lower delta within the tolerance: refine to the end
    result = delta_pass(_sides(table, [], reach=2.0), [R], 1.0, rtol=1e-3, max_refinements=3, refine=True)
    assert (result.lower, result.upper) == (9e-6, 1.2e-5)


def test_an_infinite_upper_bound_is_not_converged():
    """inf - lo <= rtol * inf holds in floats; a pass must not call that converged (it
    would skip the focused pass that may bring the bound down)."""
    table = {(R, True): {0: float("inf")}, (R, False): {0: 5.0}}
    result = epsilon_pass(_sides(table, []), [R], 1e-5, rtol=1e-3, max_refinements=0, refine=True)
    assert result.upper == float("inf") and not result.converged


def test_a_side_is_refined_while_it_moves_by_a_quarter_of_what_the_bracket_lacks():
    """The upper side is stuck at 10 (a mechanism's own cells, not h); the lower one moves
    0.011 per halving, less than a quarter of the gap (0.0125) but more than a quarter of
    what the bracket lacks (0.04 - 0.01): the old rule stopped at 9.961, unconverged, as
    the JL mechanism's lower side was at r = 30, T = 8, p = 0.125 (moves 7e-4, 7.5e-4, 1.2e-3)."""
    table = {(R, True): {0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0},
             (R, False): {0: 9.95, 1: 9.961, 2: 9.972, 3: 9.995}}
    result = epsilon_pass(_sides(table, []), [R], 1e-5, rtol=1e-3, max_refinements=3, refine=True)
    assert result.converged and (result.lower, result.upper) == (9.995, 10.0)


def test_the_mnist_example_setting_converges_within_the_tolerance():
    """JL r = 30, 8 steps at p = 1/8 (examples/mnist_cnn.py on its synthetic data): the
    bracket was [3.38615, 3.39031], 1.2e-3 wide, with a warning whose advice (more
    refinements) did not help; the lower side converges at level 3."""
    import warnings

    import fdp

    acc = fdp.PLDAccountant().compose(fdp.JL(noise_multiplier=1.1, jl_projections=30, sampling_rate=0.125), 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lower, upper = acc.get_epsilon_bounds(1e-5)
    assert upper - lower <= 1e-3 * upper
