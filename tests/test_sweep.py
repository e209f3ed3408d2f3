"""Sweeps: settings x seeds vmapped in one program train exactly as the runs would one by one; the run axis
splits over devices; the command line makes directories, a summary and a plot; bad sweeps fail early."""

import csv
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import algos, metrics as metrics_lib, mesh as mesh_lib, sweep, train
from jaxrl.run import summary as summary_lib
from conftest import run_python
from helpers import set_keys, small_cartpole


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.fixture(scope="module")
def cartpole_algo():
    """small_cartpole's algorithm on one device, and its hyperparameters."""
    return algos.build(small_cartpole(), mesh_lib.make_mesh())


def test_settings_and_seeds_in_one_program_equal_separate_runs(cartpole_algo):
    algo, hp = cartpole_algo
    learning_rates = (1e-3, 3e-3)
    # 2 settings x 2 seeds, settings-major; each run its own learning rate
    swept = hp.replace(learning_rate=jnp.repeat(jnp.array(learning_rates, jnp.float32), 2))
    state, metrics = algo.run_chunk(algo.init_seeds(0, 2, num_settings=2), swept, 3)
    assert metrics["policy_loss"].shape == (4,)
    # each setting alone: a program of its 2 seeds (the learning rate is traced: one program serves both)
    alone, _ = algos.build(small_cartpole(), mesh_lib.make_mesh())
    for i, lr in enumerate(learning_rates):
        single, _ = alone.run_chunk(alone.init_seeds(0, 2), hp.replace(learning_rate=jnp.float32(lr)), 3)
        for got, want in zip(leaves(state.params), leaves(single.params)):
            np.testing.assert_allclose(got[2 * i:2 * i + 2], want, rtol=2e-5, atol=2e-6)
    # seed s of every setting starts from the same key (common random numbers across settings)
    start = algo.init_seeds(0, 2, num_settings=2)
    for x in leaves(start.params):
        np.testing.assert_array_equal(x[:2], x[2:])


def test_a_hyperparameter_of_the_wrong_length_is_refused(cartpole_algo):
    algo, hp = cartpole_algo
    state = algo.init_seeds(0, 2)
    with pytest.raises(ValueError, match=r"expected a scalar or one value per run \(2,\)"):
        algo.run_chunk(state, hp.replace(learning_rate=jnp.ones(3)), 1)


# In one interpreter with 8 host devices: the same runs on meshes that split the run axis differently, and runs
# that do not divide over the run axis.
EIGHT_DEVICES_CODE = r"""
import json, jax, jax.numpy as jnp, numpy as np
import sys; sys.path.insert(0, "tests")
from helpers import small_cartpole
from jaxrl import algos, mesh as mesh_lib, train
out = {}
for devices, run_devices in ((1, 1), (8, 4), (8, 8), (8, 2)):
    algo, hp = algos.build(small_cartpole(), mesh_lib.make_mesh(devices, run_devices))
    hp = hp.replace(learning_rate=jnp.array([1e-3, 3e-3, 1e-2, 3e-4] * 2, jnp.float32))
    state = algo.init_seeds(0, 4, num_settings=2)
    state, metrics = algo.run_chunk(state, hp, 3)
    shard = state.obs.sharding.shard_shape(state.obs.shape)
    out[f"{devices}x{run_devices}"] = {"shard": list(shard[:2]), "episodes": np.asarray(metrics["episodes"]).tolist(),
                                       "params": [np.asarray(x).tolist() for x in jax.tree.leaves(state.params)]}
config = small_cartpole(num_seeds=3)
out["auto"] = dict(mesh_lib.mesh_for_runs(config.mesh, num_runs=6).shape)  # 6 runs: 2 along runs, 4 along data
algo, _ = algos.build(config, mesh_lib.make_mesh(8, 2))
try:
    algo.init_seeds(0, 3)
except ValueError as e:
    out["indivisible"] = str(e)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def eight_devices():
    out = run_python(EIGHT_DEVICES_CODE, devices=8)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_run_axis_splits_over_devices_and_gives_the_same_runs(eight_devices):
    result = eight_devices
    # [runs, envs] per device: 8 runs over the runs axis, 8 envs over the data axis
    assert result["1x1"]["shard"] == [8, 8]
    assert result["8x4"]["shard"] == [2, 4] and result["8x8"]["shard"] == [1, 8] and result["8x2"]["shard"] == [4, 2]
    for name in ("8x4", "8x8", "8x2"):
        assert result[name]["episodes"] == result["1x1"]["episodes"]
        for got, want in zip(result[name]["params"], result["1x1"]["params"]):
            got, want = np.asarray(got), np.asarray(want)
            assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max()), name


def test_sweep_writes_a_directory_per_setting_a_summary_and_a_plot(tmp_path):
    config, swept = sweep.sweep_from_flags(small_cartpole(), [("seeds", "3"), ("lr", "1e-3,3e-3"),
                                                              ("num_minibatches", "2,4")])
    assert config.num_seeds == 3 and swept == {"optim.learning_rate": [1e-3, 3e-3], "optim.num_minibatches": [2, 4]}
    points = sweep.expand(config, swept)
    # the learning rate is traced, the minibatch count changes shapes: two programs of two settings each
    assert sweep.group_programs(points) == [[0, 2], [1, 3]]
    workdir = str(tmp_path / "sweep")
    summary = sweep.run_sweep(config, swept, workdir)

    names = ["learning_rate=0.001,num_minibatches=2", "learning_rate=0.001,num_minibatches=4",
             "learning_rate=0.003,num_minibatches=2", "learning_rate=0.003,num_minibatches=4"]
    assert [row["setting"] for row in summary] == names
    for name, row in zip(names, summary):
        saved = json.load(open(os.path.join(workdir, name, "config.json")))
        assert saved["optim"]["learning_rate"] == row["optim.learning_rate"]
        assert saved["optim"]["num_minibatches"] == row["optim.num_minibatches"] and saved["num_seeds"] == 3
        rows = metrics_lib.read(os.path.join(workdir, name, "metrics.jsonl"))
        assert [r["env_steps"] for r in rows] == [256, 512]
        per_seed = rows[-1]["eval_return_per_seed"]
        mean, low, high = sweep.confidence_interval(per_seed)
        assert row["eval_return"] == pytest.approx(np.mean(per_seed))
        assert (row["eval_return_ci_low"], row["eval_return_ci_high"]) == pytest.approx((low, high))
        half = 4.302653 * np.std(per_seed, ddof=1) / math.sqrt(3)  # Student t(0.975), 2 degrees of freedom
        assert high - mean == pytest.approx(half)
    with open(os.path.join(workdir, "summary.csv")) as f:
        assert [r["setting"] for r in csv.DictReader(f)] == names
    assert os.path.getsize(os.path.join(workdir, "sweep.png")) > 0
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["0", "1"]
    # The same setting in a one-setting run (same seeds) trains the same: a sweep is independent runs.
    alone = train.run(set_keys(small_cartpole(num_seeds=3), {"optim.learning_rate": 3e-3, "optim.num_minibatches": 4}),
                      str(tmp_path / "alone"))
    swept_seeds = [float(v) for v in summary[3]["eval_return_per_seed"].split()]
    np.testing.assert_allclose(alone.metrics[-1]["eval_return_per_seed"], swept_seeds, rtol=1e-3)


def test_bad_sweeps_fail_before_compiling():
    config = small_cartpole()
    with pytest.raises(ValueError, match="no key 'learning_rat'"):
        sweep.sweep_from_flags(config, [("learning_rat", "1,2")])
    with pytest.raises(ValueError, match=r"'fast' is not a float"):
        sweep.sweep_from_flags(config, [("lr", "1e-3,fast")])
    with pytest.raises(ValueError, match="'2.5' is not an integer"):
        sweep.sweep_from_flags(config, [("num_envs", "8,2.5")])
    for seeds in ("0", "2,3"):
        with pytest.raises(ValueError, match=f"--sweep.seeds takes one positive number.*got '{seeds}'"):
            sweep.sweep_from_flags(config, [("seeds", seeds)])
    with pytest.raises(ValueError, match="repeated values"):
        sweep.sweep_from_flags(config, [("lr", "1e-3,1e-3")])
    with pytest.raises(ValueError, match="only numbers, booleans and strings"):
        sweep.sweep_from_flags(config, [("hidden_sizes", "64,64")])
    with pytest.raises(ValueError, match="clip_low must be > 0"):  # every setting is validated
        sweep.expand(config, {"loss.clip_low": [0.2, -1.0]})
    from experiments import smax_grpo
    with pytest.raises(ValueError, match="ambiguous: .*returns.gamma"):  # (a made-up ambiguity: two `gamma`s)
        grpo = smax_grpo.get_config("3m")
        with grpo.unlocked():
            grpo.loss.gamma = 0.5
        sweep.resolve_key(grpo, "gamma")


def test_runs_that_do_not_divide_over_the_runs_axis_fail_before_compiling(eight_devices):
    assert eight_devices["auto"] == {"runs": 2, "data": 4}
    assert eight_devices["indivisible"].startswith(
        "3 runs (seeds x settings) do not divide over the 2 devices of the runs axis")


def test_confidence_interval_matches_student_t():
    mean, low, high = sweep.confidence_interval([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    assert high - mean == pytest.approx(3.182446 * np.std([1, 2, 3, 4], ddof=1) / 2, rel=1e-6)  # t(0.975, df=3)
    assert mean - low == pytest.approx(high - mean)
    one = sweep.confidence_interval([5.0])
    assert one[0] == 5.0 and math.isnan(one[1]) and math.isnan(one[2])
    assert sweep.confidence_interval([None, 2.0, 4.0])[0] == 3.0  # seeds without a value are left out


def test_the_detectable_difference_is_the_power_analysis_of_the_seeds_spread():
    """Two settings of n seeds with standard deviation s: a two-sided 5% test finds a difference of means d with 80%
    probability when d = (1.95996 + 0.84162) s sqrt(2 / n); 4 seeds of [1, 2, 3, 4] (s = 1.29099) detect 2.55749."""
    assert summary_lib.detectable_difference([1.0, 2.0, 3.0, 4.0]) == pytest.approx(2.80158 * 1.290994 * math.sqrt(0.5),
                                                                                    rel=1e-5)
    assert summary_lib.detectable_difference([1.0, 2.0, 3.0, 4.0]) == pytest.approx(2.55749, rel=1e-5)
    # four times the seeds halve it; one seed detects nothing
    wide = summary_lib.detectable_difference([1.0, 2.0, 3.0, 4.0] * 4)
    assert wide == pytest.approx(2.80158 * np.std([1, 2, 3, 4] * 4, ddof=1) * math.sqrt(2 / 16), rel=1e-5)
    assert math.isnan(summary_lib.detectable_difference([5.0]))
    row = summary_lib.summarize_sweep([{"lr": 1}], ["lr=1"], [[{"env_steps": 1, "episode_return_per_seed": [1.0, 3.0]}]],
                                      2)[0]
    assert row["episode_return_detectable"] == pytest.approx(2.80158 * math.sqrt(2.0) * 1.0, rel=1e-5)


def test_the_summary_table_shows_an_interval_only_where_there_is_one():
    two_seeds = summary_lib.summarize_sweep([{"lr": 1}], ["lr=1"],
                                            [[{"env_steps": 100, "episode_return_per_seed": [1.0, 3.0]}]], 2)
    one_seed = summary_lib.summarize_sweep([{"lr": 2}], ["lr=2"], [[{"env_steps": 100, "episode_return": 5.0}]], 1)
    lines = sweep.format_summary(two_seeds + one_seed).splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    mean, low, high = sweep.confidence_interval([1.0, 3.0])
    assert cells == [["lr=1", "2", "100", f"{mean:.3g} [{low:.3g}, {high:.3g}]"], ["lr=2", "1", "100", "5"]]
