"""A run that turns non-finite never costs a good checkpoint: it is frozen at its last finite state (or rolled
back), the other seeds of the program go on exactly as without it, and nothing non-finite is saved.

The NaN is injected by wrapping PPO's `run_chunk`: after any chunk that leaves seed 2 at update >= 3 (with
its original random key), seed 2's parameters become NaN, as a diverging update would make them.
"""

import dataclasses
import io
import json
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import small_cartpole
from jaxrl import algos, checkpoint, train

POISONED_SEED, POISONED_AT = 2, 3
UPDATES, PER_CHUNK = 8, 2


def poisoning(build):
    """A builder whose algorithm's chunks poison seed 2's parameters when they take it past update
    POISONED_AT - 1 from the state it first had there (a seed rolled back with a new key is left alone)."""
    def poisoned_build(config, mesh):
        algo = build(config, mesh)
        run_chunk, poisoned_key = algo.run_chunk, {}

        def poisoned_run_chunk(state, hp, num_updates, **donate):
            key = np.asarray(jax.device_get(state.key))[POISONED_SEED]
            if np.asarray(jax.device_get(state.update_step))[POISONED_SEED] == POISONED_AT - 1:
                poisoned_key.setdefault("key", key)
            state, metrics = run_chunk(state, hp, num_updates, **donate)
            if np.array_equal(key, poisoned_key.get("key")):
                state = state.replace(params=jax.tree.map(lambda x: x.at[POISONED_SEED].set(jnp.nan), state.params))
            return state, metrics

        algo.run_chunk = poisoned_run_chunk
        return algo
    return poisoned_build


def _config(num_seeds=4, **overrides):
    batch = 8 * 16
    return small_cartpole(num_seeds=num_seeds, **{
        "total_steps": batch * UPDATES, "log.every_steps": batch * PER_CHUNK, "checkpoint.every_steps": batch * PER_CHUNK, "checkpoint.keep": UPDATES,
        **overrides})


def recording(build, given: list):
    """A builder whose algorithm's chunks append (donate, the parameter leaves they were given) to `given`."""
    def recording_build(config, mesh):
        algo = build(config, mesh)
        run_chunk = algo.run_chunk

        def recording_run_chunk(state, hp, num_updates, donate=False):
            out = run_chunk(state, hp, num_updates, donate=donate)
            given.append((donate, jax.tree.leaves(state.params)))
            return out
        algo.run_chunk = recording_run_chunk
        return algo
    return recording_build


def _run(config, workdir, poisoned: bool, monkeypatch, given: list | None = None):
    recipe = algos.recipe("ppo")
    build = poisoning(recipe.build) if poisoned else recipe.build
    if given is not None:
        build = recording(build, given)
    monkeypatch.setitem(algos.ALGORITHMS, "ppo", dataclasses.replace(recipe, build=build))
    try:
        return train.run(config, str(workdir), progress=False)
    finally:
        monkeypatch.undo()


def _params(state, run):
    return jax.tree.map(lambda x: np.asarray(x[run]), jax.device_get(state.params))


def _saved_states(result):
    manager = checkpoint.Checkpointer(os.path.join(result.workdir, "checkpoints"))
    target = checkpoint.abstract_state(result.state)
    try:
        return {step: manager.restore(step, target) for step in manager.steps()}
    finally:
        manager.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The clean 4-seed run; `given`: what its chunks were given (`recording`)."""
    given = []
    result = _run(_config(), tmp_path_factory.mktemp("clean"), False, pytest.MonkeyPatch(), given)
    result.given = given
    return result


def _assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def frozen_run(tmp_path_factory):
    """The 4-seed run with seed 2 poisoned, and what it printed on stderr."""
    mp, capture = pytest.MonkeyPatch(), io.StringIO()
    mp.setattr(sys, "stderr", capture)
    recipe = algos.recipe("ppo")
    mp.setitem(algos.ALGORITHMS, "ppo", dataclasses.replace(recipe, build=poisoning(recipe.build)))
    try:
        result = train.run(_config(), str(tmp_path_factory.mktemp("poisoned")), progress=False)
    finally:
        mp.undo()
    result.stderr = capture.getvalue()
    return result


def test_a_diverged_seed_is_frozen_and_the_others_finish_unchanged(reference, frozen_run):
    result = frozen_run
    assert not result.diverged and not result.interrupted
    for run in (0, 1, 3):
        _assert_same(_params(result.state, run), _params(reference.state, run))
    # Seed 2 kept its state after update 2, the last finite one: the clean run's checkpoint at update 2.
    clean_saved = _saved_states(reference)
    _assert_same(_params(result.state, POISONED_SEED), _params(clean_saved[2], POISONED_SEED))

    warning = result.stderr
    assert f"seed {POISONED_SEED} diverged in update {POISONED_AT}: state.params" in warning
    assert "frozen at its last finite state (after update 2)" in warning
    rows = result.metrics
    assert "frozen_seeds" not in rows[0] and rows[1]["frozen_seeds"] == [POISONED_SEED]
    assert all(row["frozen_seeds"] == [POISONED_SEED] for row in rows[1:])
    assert rows[-1]["episode_return_per_seed"][POISONED_SEED] is None
    assert all(row["episode_return_per_seed"][s] is not None for row in rows for s in (0, 1, 3))

    saved = _saved_states(result)
    assert sorted(saved) == [2, 4, 6, 8]
    for step, state in saved.items():
        for leaf in jax.tree.leaves(state):
            if jnp.issubdtype(leaf.dtype, jnp.floating):
                assert np.isfinite(np.asarray(leaf)).all(), f"checkpoint {step} holds a non-finite value"
    with open(os.path.join(result.workdir, "checkpoints", "diverged.json")) as f:
        entry = json.load(f)[str(POISONED_SEED)]
    assert entry["update"] == POISONED_AT and entry["frozen_at"] == 4 and entry["quantity"].startswith("state.params")


def test_a_resumed_program_keeps_the_seed_frozen(frozen_run, tmp_path, monkeypatch):
    """The frozen run, copied and extended by 2 updates with nothing poisoning it: seed 2 stays frozen at the
    same parameters."""
    poisoned = frozen_run
    workdir = str(tmp_path / "resumed")
    shutil.copytree(poisoned.workdir, workdir)
    resumed = _run(_config(total_steps=8 * 16 * (UPDATES + PER_CHUNK)), workdir, False, monkeypatch)
    assert resumed.metrics[-1]["update"] == UPDATES + PER_CHUNK
    assert resumed.metrics[-1]["frozen_seeds"] == [POISONED_SEED]
    _assert_same(_params(resumed.state, POISONED_SEED), _params(poisoned.state, POISONED_SEED))


def test_a_single_seed_run_stops_when_it_diverges(tmp_path, monkeypatch, capsys):
    config = _config(num_seeds=1)
    global POISONED_SEED
    seed, POISONED_SEED = POISONED_SEED, 0
    try:
        result = _run(config, tmp_path, True, monkeypatch)
    finally:
        POISONED_SEED = seed
    assert result.diverged
    assert result.metrics[-1]["update"] == 4  # the chunk in which it diverged, then the program stopped
    assert "every run diverged" in capsys.readouterr().err
    for step, state in _saved_states(result).items():
        assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(state.params))


def test_rollback_restarts_the_chunk_with_a_new_key(reference, tmp_path, monkeypatch, capsys):
    result = _run(_config(**{"checkpoint.on_nonfinite": "rollback"}), tmp_path, True, monkeypatch)
    assert not result.diverged
    assert "rolling its chunk back with a new random key (rollback 1 of 3)" in capsys.readouterr().err
    assert all("frozen_seeds" not in row for row in result.metrics)
    for run in (0, 1, 3):
        _assert_same(_params(result.state, run), _params(reference.state, run))
    params = _params(result.state, POISONED_SEED)
    assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(params))
    assert int(jax.device_get(result.state.update_step)[POISONED_SEED]) == UPDATES  # it did not fall behind
    differs = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                        jax.tree.leaves(_params(reference.state, POISONED_SEED)))]
    assert any(differs)  # it went on from update 2 with another key


def test_stop_ends_the_program_and_keeps_the_finite_checkpoints(tmp_path, monkeypatch, capsys):
    result = _run(_config(**{"checkpoint.on_nonfinite": "stop"}), tmp_path, True, monkeypatch)
    err = capsys.readouterr().err
    assert result.diverged
    # seed 2 turned NaN in the chunk of updates 3-4; the rows and checkpoints end with the chunk before it
    assert f"warning: seed {POISONED_SEED} diverged in updates 3-4: state.params" in err
    assert "stopped at update 4 (checkpoint.on_nonfinite=stop): the checkpoints end at update 2" in err
    assert result.metrics[-1]["update"] == 2
    saved = _saved_states(result)
    assert sorted(saved) == [2]
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(saved[2].params))


def test_stop_reuses_the_state_memory_and_trains_the_same(reference, tmp_path, monkeypatch):
    """Donated chunks compute what kept ones do; the state a chunk was given is gone after it (and, without
    "stop", kept: the reference run's)."""
    given = []
    result = _run(_config(**{"checkpoint.on_nonfinite": "stop"}), tmp_path, False, monkeypatch, given)
    assert not result.diverged
    _assert_same(result.state.params, reference.state.params)
    assert [donate for donate, _ in given] == [True] * (UPDATES // PER_CHUNK)  # every chunk, nothing else
    assert all(leaf.is_deleted() for _, leaves in given for leaf in leaves)
    assert [donate for donate, _ in reference.given if donate] == []
    assert not any(leaf.is_deleted() for _, leaves in reference.given for leaf in leaves)


def test_the_policy_names_are_checked():
    with pytest.raises(ValueError, match="unknown config.checkpoint.on_nonfinite 'ignore'"):
        algos.validate(_config(**{"checkpoint.on_nonfinite": "ignore"}))
