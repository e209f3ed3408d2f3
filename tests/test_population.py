"""Tuning inside one program: PBT's exploit copies whole run states and explore stays in bounds, successive
halving gives the dropped settings' runs to the survivors, nothing recompiles between chunks, a PBT program
resumes exactly and is the same on 1 and 8 devices, and a fork's children equal separately resumed runs."""

import json
import os
import signal

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import dispatch

from jaxrl import algos, checkpoint, mesh as mesh_lib, metrics as metrics_lib, sweep, train
from jaxrl.run import population as population_lib, sweep_programs
from helpers import small_cartpole

CHUNK_STEPS = 8 * 16  # small_cartpole: 8 envs x 16 steps per update


def lineage(workdir):
    return population_lib.read_lineage(sweep.lineage_path(workdir))


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_truncation_selection_copies_runs_of_the_top_into_the_bottom():
    scores = np.array([5.0, np.nan, 9.0, 1.0, 7.0, 3.0, 8.0, 2.0])
    rng = np.random.default_rng(0)
    for _ in range(50):
        parents = population_lib.truncation_parents(scores, 0.25, rng)
        # the bottom quarter (NaN ranks last, then 1.0) copy from the top quarter (9.0, 8.0); the rest keep
        assert set(np.flatnonzero(parents != np.arange(8))) == {1, 3}
        assert set(parents[[1, 3]]) <= {2, 6}
    assert population_lib.truncation_parents(np.array([1.0, 2.0]), 0.25, rng).tolist() == [1, 1]


def test_explore_perturbs_only_the_copies_and_stays_in_bounds():
    rng = np.random.default_rng(1)
    for _ in range(200):
        values = rng.uniform(1e-4, 1e-2, 8)
        parents = np.where(rng.random(8) < 0.5, rng.integers(8, size=8), np.arange(8))
        out = population_lib.explore(values, parents, (0.8, 1.25), 1e-4, 1e-2, rng)
        copied = parents != np.arange(8)
        assert np.all((out >= 1e-4) & (out <= 1e-2))
        np.testing.assert_array_equal(out[~copied], values[~copied])
        ratio = out[copied] / values[parents[copied]]
        unclipped = (out[copied] > 1e-4) & (out[copied] < 1e-2)
        assert np.all(np.isclose(ratio[unclipped], 0.8) | np.isclose(ratio[unclipped], 1.25))


def test_halving_drops_the_worse_half_and_deals_its_runs_to_the_survivors():
    settings = np.repeat(np.arange(4), 2)  # 4 settings x 2 seeds
    scores = np.array([1.0, 3.0, 9.0, 7.0, np.nan, np.nan, 4.0, 6.0])  # means 2, 8, NaN, 5
    parents, new = population_lib.halving_parents(scores, settings)
    # settings 1 (mean 8) and 3 (mean 5) survive; 0 and 2's runs go to 1, 3, 1, 3 in turn
    assert new.tolist() == [1, 3, 1, 1, 1, 3, 3, 3]
    assert parents.tolist() == [2, 6, 2, 3, 3, 7, 6, 7]
    parents, new = population_lib.halving_parents(np.arange(8.0), new)  # means: setting 1 2.25, setting 3 4.75
    assert new.tolist() == [3] * 8 and parents.tolist() == [1, 1, 5, 6, 7, 5, 6, 7]


def test_predicted_final_score_recovers_known_curves_and_falls_back_on_short_ones():
    steps = np.arange(1.0, 21.0)
    power = lambda s, c: 1.0 - 0.9 * s ** -c  # noqa: E731  (asymptote 1)
    for c in (0.5, 0.37):  # an exponent of the grid, and one between two
        assert population_lib.predict_final(steps, power(steps, c), 1e12) == pytest.approx(1.0, abs=1e-3)
        assert population_lib.predict_final(steps, power(steps, c), 160) == pytest.approx(power(160, c), abs=1e-3)
    plateaued = 1.0 - np.exp(-0.2 * steps)  # at 0.98 of its asymptote: a power law alone would say 1.5
    assert population_lib.predict_final(steps, plateaued, 160) == pytest.approx(1.0, abs=0.01)
    falling = 0.2 + 0.8 * np.exp(-0.3 * steps)
    assert population_lib.predict_final(steps, falling, 1e6) == pytest.approx(0.2, abs=0.01)
    logarithmic = 0.1 * np.log(steps)
    assert population_lib.predict_final(steps, logarithmic, 160) == pytest.approx(0.1 * np.log(160), abs=1e-6)
    noisy = power(steps, 0.5) + np.random.default_rng(0).normal(0, 0.01, steps.shape)
    assert population_lib.predict_final(steps, noisy, 160) == pytest.approx(power(160, 0.5), abs=0.05)
    gaps = power(steps, 0.5)
    gaps[[2, 7, 11]] = np.nan  # chunks without a finished episode are left out
    assert population_lib.predict_final(steps, gaps, 1e12) == pytest.approx(1.0, abs=1e-3)
    # fewer than 4 scores: the current score, even NaN
    assert population_lib.predict_final(steps[:3], np.array([0.1, 0.5, 0.6]), 160) == 0.6
    assert np.isnan(population_lib.predict_final(steps[:5], np.array([0.1, np.nan, 0.6, 0.7, np.nan]), 160))
    assert population_lib.predicted_scores(steps[:4], np.array([[1, 1], [2, 2], [3, 3], [4, np.nan]]), 8).shape == (2,)


def handmade_population(method: str, rank: str, tmp_path) -> population_lib.Population:
    """Four settings of one seed, 8 of 64 updates scored: a fast starter levelled off at 0.6, a medium one at
    0.5, a slow starter at 0.44 on a power law that reaches 0.66 by update 64, and a flat 0.46."""
    population = population_lib.Population(
        population_lib.Options(method=method, fraction=0.25, rank=rank), [], {"optim.learning_rate": [1, 2, 3, 4]},
        num_seeds=1, num_updates=64, chunk=1, batch=1, seed=0, checkpoint_dir=str(tmp_path))
    wiggle = 0.005 * (-1.0) ** np.arange(1, 9)
    for update in range(1, 9):
        s = float(update)
        returns = [0.6 * (1 - np.exp(-1.5 * s)), 0.5 * (1 - np.exp(-s)), 0.9 - 0.85 * s ** -0.3, 0.46]
        population.observe(update, {"episode_return": np.array(returns) + wiggle[update - 1]}, main=False)
    return population


def test_predicted_rank_keeps_the_slow_starter_that_the_current_rank_drops(tmp_path):
    metrics = {"episode_return": np.array([0.6, 0.5, 0.444, 0.46])}  # the last chunk's scores
    current = handmade_population("halving", "current", tmp_path).decide(8, metrics)
    predicted = handmade_population("halving", "predicted", tmp_path).decide(8, metrics)
    assert sorted(set(current["settings"])) == [0, 1] and "predicted" not in current
    assert sorted(set(predicted["settings"])) == [0, 2]  # the slow starter kept, the medium one dropped
    np.testing.assert_allclose(predicted["predicted"], [0.6, 0.5, 0.656, 0.46], atol=0.01)
    # PBT's exploit: the current rank replaces the slow starter, the predicted one the flat run
    assert handmade_population("pbt", "current", tmp_path).decide(8, metrics)["parents"][2] != 2
    pbt = handmade_population("pbt", "predicted", tmp_path).decide(8, metrics)["parents"]
    assert pbt[2] == 2 and pbt[3] != 3


def test_a_resumed_population_rebuilds_its_runs_curves(tmp_path):
    @flax.struct.dataclass
    class State:
        key: jax.Array

    @flax.struct.dataclass
    class Hyperparams:
        learning_rate: jax.Array

    tuned = [population_lib.Tuned("optim.learning_rate", "learning_rate", 1.0, 4.0)]
    make = lambda: population_lib.Population(  # noqa: E731
        population_lib.Options(method="halving", rank="predicted"), tuned, {"optim.learning_rate": [1, 2, 3, 4]},
        num_seeds=1, num_updates=64, chunk=1, batch=1, seed=0, checkpoint_dir=str(tmp_path))
    straight, state, hp = make(), State(jax.random.split(jax.random.key(0), 4)), Hyperparams(jnp.ones(4))
    straight.start(main=True)
    for update in range(1, 7):
        straight.observe(update, {"episode_return": np.arange(4.0) * update}, main=True)
        if update == 3:
            event = straight.decide(update, {"episode_return": np.arange(4.0) * update})
            state, hp = straight.apply(event, state, hp)
            straight.record(event)
        if update == 5:
            at_five = straight.curves.copy()
    resumed = make()
    resumed.resume(5, hp, main=True)
    assert resumed.curve_updates == [1, 2, 3, 4, 5]
    np.testing.assert_array_equal(resumed.curves, at_five)
    # runs 0 and 1 continue the best two, 3 and 2, and their curves
    np.testing.assert_array_equal(at_five[:3], np.arange(4.0)[[3, 2, 2, 3]] * [[1], [2], [3]])
    assert [row["update"] for row in metrics_lib.read(resumed.curves_path)] == [1, 2, 3, 4, 5]


def test_a_copy_holds_its_parents_whole_state_with_its_own_key():
    algo, hp = algos.build(small_cartpole(), mesh_lib.make_mesh())
    state, _ = algo.run_chunk(algo.init_seeds(0, 4), hp.replace(learning_rate=jnp.array([1, 2, 3, 4.0]) * 1e-3), 2)
    runs_hp = mesh_lib.runs_of(hp.replace(learning_rate=jnp.array([1, 2, 3, 4.0]) * 1e-3), 4, algo.mesh)
    parents = jnp.array([0, 0, 3, 2])
    copied, copied_hp = population_lib.continue_runs(state, runs_hp, parents)
    for name in ("params", "opt_state", "env_state", "obs", "update_step"):
        for got, want in zip(leaves(getattr(copied, name)), leaves(getattr(state, name))):
            np.testing.assert_array_equal(got, want[np.asarray(parents)])
    keys = np.asarray(copied.key)
    np.testing.assert_array_equal(keys[[0, 1]][:1], np.asarray(state.key)[[0]])  # run 0 kept itself
    assert not np.array_equal(keys[1], np.asarray(state.key)[0])  # run 1 copied run 0: a new key
    assert len({tuple(k) for k in keys}) == 4
    np.testing.assert_allclose(np.asarray(copied_hp.learning_rate), [1e-3, 1e-3, 4e-3, 3e-3])


def pbt_config(**overrides):
    return small_cartpole(**{"total_steps": CHUNK_STEPS * 8, "log.every_steps": CHUNK_STEPS,
                             "eval.every_steps": CHUNK_STEPS, **overrides})


def test_pbt_decides_between_chunks_without_recompiling_and_resumes_exactly(tmp_path, monkeypatch):
    traced = []
    population_lib.continue_runs.clear_cache()  # (another test may have traced it for these shapes)
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: traced.append(kw.get("fun_name")) if event == dispatch.JAXPR_TRACE_EVENT
        else None)
    apply = population_lib.Population.apply
    monkeypatch.setattr(population_lib.Population, "apply",
                        lambda self, *args: (traced.append("<decision>"), apply(self, *args))[1])
    options = population_lib.Options(method="pbt", every_steps=CHUNK_STEPS, fraction=0.25)
    config, swept = sweep.sweep_from_flags(pbt_config(), [("lr", "1e-3,3e-3,1e-2,3e-2")])
    straight = str(tmp_path / "straight")
    sweep.run_sweep(config, swept, straight, options=options)

    events = lineage(straight)
    assert [e["update"] for e in events] == list(range(8))  # the start, then after every chunk but the last
    decisions = [i for i, name in enumerate(traced) if name == "<decision>"]
    assert len(decisions) == 7
    # the chunk program and the copy are traced once; from the second decision on nothing is traced again
    assert traced.count("continue_runs") == 1 and traced.count("run") == 1
    assert traced[decisions[1]:decisions[-1]] == [n for n in traced[decisions[1]:decisions[-1]] if n == "<decision>"]
    for before, event in zip(events, events[1:]):
        parents = np.array(event["parents"])
        lr, previous = np.array(event["values"]["optim.learning_rate"]), np.array(before["values"]["optim.learning_rate"])
        assert np.all((lr >= 1e-3) & (lr <= 3e-2))
        kept = parents == np.arange(4)
        np.testing.assert_array_equal(lr[kept], previous[kept])
        assert (~kept).sum() == 1  # a quarter of 4 runs
        order = np.argsort(-np.nan_to_num(np.array(event["scores"], dtype=float), nan=-np.inf), kind="stable")
        assert parents[~kept][0] == order[0] and np.flatnonzero(~kept)[0] == order[-1]
    population = list(__import__("csv").DictReader(open(os.path.join(straight, "population.csv"))))
    assert len(population) == 4 and os.path.getsize(os.path.join(straight, "lineage.png")) > 0

    # Interrupted (SIGTERM at the fourth decision: the loop saves after the next chunk) and resumed: the same
    # decisions and the same runs.
    decide = population_lib.Population.decide

    def decide_then_stop(self, update, metrics):
        if update == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return decide(self, update, metrics)
    monkeypatch.setattr(population_lib.Population, "decide", decide_then_stop)
    resumed = str(tmp_path / "resumed")
    with pytest.raises(sweep.Interrupted, match="sweep stopped"):
        sweep.run_sweep(config, swept, resumed, options=options)
    assert [e["update"] for e in lineage(resumed)] == list(range(6))  # stopped after update 5's decision
    monkeypatch.setattr(population_lib.Population, "decide", decide)
    sweep.run_sweep(config, swept, resumed, options=options)
    assert lineage(resumed) == events
    for name in os.listdir(straight):
        if os.path.isdir(os.path.join(straight, name)) and name != "checkpoints":
            want = metrics_lib.read(os.path.join(straight, name, "metrics.jsonl"))
            got = metrics_lib.read(os.path.join(resumed, name, "metrics.jsonl"))
            assert [r["episode_return"] for r in got] == [r["episode_return"] for r in want]
            assert got[-1]["eval_return"] == want[-1]["eval_return"]


def test_successive_halving_gives_the_dropped_settings_runs_to_the_survivors(tmp_path):
    options = population_lib.Options(method="halving", at=(0.25, 0.5))
    config, swept = sweep.sweep_from_flags(pbt_config(), [("lr", "1e-4,1e-3,1e-2,3e-2")])
    workdir = str(tmp_path / "halving")
    summary = sweep.run_sweep(config, swept, workdir, options=options)
    events = lineage(workdir)
    assert [e["update"] for e in events] == [0, 2, 4]
    assert len(set(events[1]["settings"])) == 2 and len(set(events[2]["settings"])) == 1
    survivor = events[2]["settings"][0]
    assert events[2]["values"]["optim.learning_rate"] == [[1e-4, 1e-3, 1e-2, 3e-2][survivor]] * 4
    rows = {row["setting"]: metrics_lib.read(os.path.join(workdir, row["setting"], "metrics.jsonl"))
            for row in summary}
    last_steps = sorted(r[-1]["env_steps"] for r in rows.values())
    assert last_steps == [2 * CHUNK_STEPS, 2 * CHUNK_STEPS, 4 * CHUNK_STEPS, 8 * CHUNK_STEPS]
    winner = rows[summary[survivor]["setting"]]
    assert len(winner[-1]["eval_return_per_seed"]) == 4  # its own run and the three it was given


def test_halving_by_predicted_final_scores_runs_end_to_end(tmp_path):
    options = population_lib.Options(method="halving", at=(0.5,), rank="predicted")
    config, swept = sweep.sweep_from_flags(pbt_config(), [("lr", "1e-4,1e-3,1e-2,3e-2")])
    workdir = str(tmp_path / "predicted")
    sweep.run_sweep(config, swept, workdir, options=options)
    decision = lineage(workdir)[1]
    assert decision["update"] == 4
    curves = metrics_lib.read(os.path.join(os.path.dirname(sweep.lineage_path(workdir)), "curves.jsonl"))
    assert [row["update"] for row in curves] == list(range(1, 9))  # every chunk's scores
    scores = np.array([row["scores"] for row in curves[:4]], dtype=float)
    np.testing.assert_allclose(np.array(decision["predicted"], dtype=float),
                               population_lib.predicted_scores(np.arange(1, 5), scores, 8))
    kept = np.argsort(-np.nan_to_num(np.array(decision["predicted"], dtype=float), nan=-np.inf), kind="stable")[:2]
    assert sorted(set(decision["settings"])) == sorted(kept)


def test_fork_children_equal_separately_resumed_runs(tmp_path):
    parent_config = small_cartpole(**{"checkpoint.every_steps": CHUNK_STEPS * 2})
    parent = train.run(parent_config, str(tmp_path / "parent"))
    fork = sweep.Fork(parent.workdir, update=2)
    config, swept = sweep.sweep_from_flags(parent_config, [("lr", "1e-3,1e-2")])
    workdir = str(tmp_path / "fork")
    sweep.run_sweep(config, swept, workdir, fork=fork)

    algo, hp = algos.build(config, mesh_lib.make_mesh())
    children = checkpoint.restore_from(os.path.join(workdir, "checkpoints", "0"),
                                       algo.abstract_seeds(config.seed, config.num_seeds, 2))[1]
    _, start = checkpoint.restore_from(os.path.join(parent.workdir, "checkpoints"),
                                       algo.abstract_seeds(config.seed, config.num_seeds, 1), step=2)
    for i, lr in enumerate((1e-3, 1e-2)):
        alone, _ = algo.run_chunk(start, hp.replace(learning_rate=jnp.float32(lr)), 2)
        for got, want in zip(leaves(children.params), leaves(alone.params)):
            np.testing.assert_allclose(got[i], want[0], rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(np.asarray(children.obs)[i], np.asarray(alone.obs)[0], rtol=1e-4, atol=1e-5)
        rows = metrics_lib.read(os.path.join(workdir, f"learning_rate={lr:g}", "metrics.jsonl"))
        assert [r["update"] for r in rows] == [2, 4]  # the parent's row up to the fork, then the child's
        assert rows[0] == parent.metrics[0]


def test_bad_tuning_flags_fail_before_compiling(tmp_path):
    with pytest.raises(ValueError, match=r"--sweep.method: is one of grid, pbt, halving"):
        sweep.method_from_flags([("method", "bayes")])
    with pytest.raises(ValueError, match=r"--sweep.halving.at is an option of --sweep.method=halving"):
        sweep.method_from_flags([("method", "pbt"), ("halving.at", "0.5")])
    with pytest.raises(ValueError, match=r"--sweep.pbt.fraction must be in \(0, 0.5\]"):
        sweep.method_from_flags([("method", "pbt"), ("pbt.fraction", "0.7")])
    with pytest.raises(ValueError, match=r"^--sweep.halving.rank: is one of current, predicted, not 'final'$"):
        sweep.method_from_flags([("method", "halving"), ("halving.rank", "final")])
    with pytest.raises(ValueError, match=r"--sweep.halving.rank is an option of --sweep.method=halving"):
        sweep.method_from_flags([("method", "pbt"), ("halving.rank", "predicted")])
    assert sweep.method_from_flags([("method", "pbt"), ("pbt.rank", "predicted")])[0].rank == "predicted"
    with pytest.raises(ValueError, match=r"--sweep.pbt.speed: is not an option; known: pbt.every_steps"):
        sweep.method_from_flags([("method", "pbt"), ("pbt.speed", "2")])
    options, population, fork, rest = sweep.method_from_flags(
        [("method", "pbt"), ("pbt.population", "4"), ("lr", "1e-4:1e-2"), ("pbt.perturb", "0.5,2")])
    assert (options.method, options.perturb, population, fork, rest) == ("pbt", (0.5, 2.0), 4, None, [("lr", "1e-4:1e-2")])
    config, swept = sweep.sweep_from_flags(small_cartpole(), rest)
    assert swept == {"optim.learning_rate": sweep.Range(1e-4, 1e-2)}
    points = sweep.expand(config, swept, sweep.draw_ranges(swept, 4, 0))
    assert len(points) == 4 and all(1e-4 <= p["optim.learning_rate"] <= 1e-2 for p, _ in points)
    with pytest.raises(ValueError, match="a range low:high is for --sweep.method=pbt"):
        sweep.run_sweep(config, swept, str(tmp_path / "grid"))
    config, swept = sweep.sweep_from_flags(small_cartpole(), [("num_envs", "4,8")])
    with pytest.raises(ValueError, match="num_envs changes the program"):
        sweep.run_sweep(config, swept, str(tmp_path / "pbt"), options=options)
    with pytest.raises(ValueError, match="no checkpoints under"):
        os.makedirs(tmp_path / "empty")
        json.dump({}, open(tmp_path / "empty" / "config.json", "w"))
        sweep.Fork(str(tmp_path / "empty")).check([small_cartpole()])
    assert not os.path.exists(tmp_path / "grid" / "checkpoints")


def test_a_sweep_saved_before_the_rank_option_resumes_with_its_default(tmp_path):
    described = sweep_programs.describe(small_cartpole(), {"optim.learning_rate": [1e-3, 1e-2]},
                                        population_lib.Options(method="halving"), None, [["a", "b"]])
    old = json.loads(json.dumps(described))
    del old["method"]["rank"]
    json.dump(old, open(tmp_path / "sweep.json", "w"))
    sweep_programs.check_same_sweep(str(tmp_path), described)
    predicted = sweep_programs.describe(small_cartpole(), {"optim.learning_rate": [1e-3, 1e-2]},
                                        population_lib.Options(method="halving", rank="predicted"), None, [["a", "b"]])
    with pytest.raises(ValueError, match="holds a sweep of other settings"):
        sweep_programs.check_same_sweep(str(tmp_path), predicted)


PBT_DEVICES_CODE = r"""
import json, os, sys; sys.path.insert(0, "tests")
from helpers import small_cartpole
from jaxrl import metrics as metrics_lib, sweep
from jaxrl.run import population as population_lib
out = {}
for devices in (1, 8):
    config = small_cartpole(**{"total_steps": 128 * 4, "log.every_steps": 128, "mesh.num_devices": devices,
                               "mesh.run_devices": devices})
    config, swept = sweep.sweep_from_flags(config, [("lr", "1e-3,2e-3,3e-3,5e-3,1e-2,2e-2,3e-2,5e-2")])
    workdir = os.path.join(os.environ["POPULATION_DIR"], str(devices))
    sweep.run_sweep(config, swept, workdir, options=population_lib.Options(method="pbt", every_steps=128))
    out[devices] = {"lineage": population_lib.read_lineage(sweep.lineage_path(workdir)),
                    "eval": [metrics_lib.read(os.path.join(workdir, name, "metrics.jsonl"))[-1]["eval_return"]
                             for name in sorted(os.listdir(workdir)) if name.startswith("learning_rate")]}
print(json.dumps(out))
"""


def test_pbt_on_one_and_eight_devices_makes_the_same_decisions(python_subprocess, tmp_path):
    out = python_subprocess(PBT_DEVICES_CODE, devices=8, env={"POPULATION_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    one, eight = result["1"], result["8"]
    assert [e["parents"] for e in one["lineage"]] == [e["parents"] for e in eight["lineage"]]
    assert [e["values"] for e in one["lineage"]] == [e["values"] for e in eight["lineage"]]
    for a, b in zip(one["lineage"], eight["lineage"]):
        np.testing.assert_allclose(np.array(a["scores"], dtype=float), np.array(b["scores"], dtype=float), rtol=1e-4)
    np.testing.assert_allclose(one["eval"], eight["eval"], rtol=1e-4)


def test_a_population_that_needs_two_programs_is_refused(tmp_path):
    config, swept = sweep.sweep_from_flags(small_cartpole(), [("weight_decay", "0,1e-4")])  # 0: no decay state
    with pytest.raises(ValueError, match="tunes one program, but weight_decay=0.0001 needs another"):
        sweep.run_sweep(config, swept, str(tmp_path / "pbt"), options=population_lib.Options(method="pbt"))
