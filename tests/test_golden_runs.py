"""Every experiment family ends a short fixed-seed run where it ended when tests/golden_runs.json was recorded
(final parameters and last metrics row): refactors keep behaviour. Re-record only for a deliberate change of
numbers, and say which and why in the commit (`python tests/golden_runs.py --record`). Where only another
machine's rounding moves them beyond the recorded drift, re-record there at the commit that passed before, with
`--other-machine` naming the old file."""

import json

import pytest

import golden_runs


@pytest.mark.parametrize("family", list(golden_runs.RUNS))
def test_short_run_ends_where_it_was_recorded(family):
    with open(golden_runs.GOLDEN_PATH) as f:
        recorded = json.load(f)[family]
    assert golden_runs.differences(recorded, golden_runs.run_family(family)) == []


def test_differences_reports_a_changed_leaf_and_a_missing_metric():
    recorded = {"leaf_sums": {"['w']": 1.0}, "metrics": {"loss": 0.5, "return": 10.0}}
    current = {"leaf_sums": {"['w']": 1.001}, "metrics": {"loss": 0.5}}
    problems = golden_runs.differences(recorded, current)
    assert any("missing ['return']" in p for p in problems)
    assert any("leaf_sums[['w']]: recorded 1.0, now 1.001" in p for p in problems)
    assert golden_runs.differences(recorded, recorded) == []


def test_a_value_may_move_by_ten_times_its_recorded_rounding_drift():
    recorded = {"leaf_sums": {"['w']": 1.0, "['b']": 0.5}, "metrics": {"loss": 0.5},
                "rounding_drift": {"leaf_sums": {"['w']": 1e-3, "['b']": 0.0}, "metrics": {"loss": 0.0}}}
    moved = {"leaf_sums": {"['w']": 1.009, "['b']": 0.5}, "metrics": {"loss": 0.5}}
    assert golden_runs.differences(recorded, moved) == []
    moved["leaf_sums"]["['w']"] = 1.011
    assert golden_runs.differences(recorded, moved) == ["leaf_sums[['w']]: recorded 1.0, now 1.011 (allowed +-0.01)"]
    moved["leaf_sums"].update({"['w']": 1.0, "['b']": 0.500011})  # no drift recorded: rtol 1e-5 of max(|v|, 1)
    assert len(golden_runs.differences(recorded, moved)) == 1
