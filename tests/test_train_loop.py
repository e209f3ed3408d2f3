"""The outer loop: run directory contents, exact resume after a kill, SIGTERM checkpoints, corrupt checkpoints."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types

import jax
import numpy as np
import pytest

from helpers import ROOT
from experiments import cartpole_ppo
from jaxrl import algos, checkpoint, config as config_lib, train

BATCH = 4 * 32


def small_config(total_updates=24, **overrides):
    """CartPole PPO at 4 envs x 32 steps, at a constant learning rate: runs of any length compile one program
    (the test session's compilation cache serves the others)."""
    config = cartpole_ppo.get_config()
    config.num_steps = 32
    config.optim.schedule = "constant"
    config.total_steps = total_updates * BATCH
    config.log.every_steps = 2 * BATCH  # a chunk is 2 updates
    config.log.progress_bar = False
    config.checkpoint.every_steps = 4 * BATCH  # a checkpoint every 2 chunks
    config.eval.episodes = 4
    config.eval.max_steps = 50
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        (config[section] if section else config)[name] = value
    return config


def _cli_args(config, workdir):
    return [sys.executable, "-m", "jaxrl.train", "--config=experiments/cartpole_ppo.py",
            f"--workdir={workdir}", "--config.num_steps=32", "--config.optim.schedule=constant",
            f"--config.total_steps={config.total_steps}",
            f"--config.log.every_steps={config.log.every_steps}", "--config.log.progress_bar=False",
            f"--config.checkpoint.every_steps={config.checkpoint.every_steps}", "--config.eval.episodes=4",
            "--config.eval.max_steps=50"]


def _checkpoint_steps(workdir):
    return checkpoint.saved_steps(os.path.join(workdir, "checkpoints"))


def _wait_for_checkpoint(workdir, proc, at_least=1, timeout=120):
    start = time.time()
    while time.time() - start < timeout:
        steps = _checkpoint_steps(workdir)
        if steps and steps[-1] >= at_least:
            return steps
        if proc.poll() is not None:
            raise AssertionError(f"training exited early: {proc.stderr.read()}")
        time.sleep(0.02)
    raise AssertionError("no checkpoint appeared")


def _assert_same_params(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def eight_updates(tmp_path_factory):
    """small_config(8): chunks of 2 updates, checkpoints at updates 4 and 8; tests that change it copy it."""
    return train.run(small_config(8), str(tmp_path_factory.mktemp("eight") / "run"))


def _copy(result, tmp_path) -> str:
    workdir = str(tmp_path / "run")
    shutil.copytree(result.workdir, workdir)
    return workdir


def test_run_directory_holds_config_metrics_checkpoints_and_curve(eight_updates):
    result = eight_updates
    files = set(os.listdir(result.workdir))
    assert {"config.json", "run_info.json", "metrics.jsonl", "checkpoints", "learning_curve.png"} <= files
    rows = result.metrics
    assert [r["update"] for r in rows] == [2, 4, 6, 8]
    for key in ("env_steps", "wall_time", "episode_return", "policy_loss", "value_loss", "entropy",
                "steps_per_second"):
        assert key in rows[-1], key
    assert rows[-1]["env_steps"] == 8 * BATCH
    assert "eval_return" in rows[-1]
    saved = json.load(open(os.path.join(result.workdir, "config.json")))
    assert saved["num_steps"] == 32 and saved["total_steps"] == 8 * BATCH
    assert _checkpoint_steps(result.workdir)[-1] == 8
    assert not result.interrupted


def test_the_plan_reads_the_config_once():
    """Chunks, evaluations and checkpoints in whole chunks, from the config's env steps."""
    from jaxrl.run import plan as plan_lib

    config = small_config(24, **{"eval.every_steps": 5 * BATCH})
    settings = plan_lib.as_trained([plan_lib.Setting(config, "unused")])
    algo_settings = types.SimpleNamespace(batch_size=BATCH, num_updates=24)
    plan = plan_lib.make(settings, algo_settings, "/nonexistent/checkpoints")
    assert (plan.chunk, plan.checkpoint_every, plan.eval_every) == (2, 2, 2)  # 5 updates: 2.5 chunks, rounded
    assert (plan.num_runs, plan.resuming, plan.tuning, plan.progress_bar) == (1, False, None, False)
    assert [c for c in range(1, 13) if plan.evaluates_after(c, done=c == 12)] == [2, 4, 6, 8, 10, 12]
    assert [c for c in range(1, 7) if plan.saves_after(c, evaluated=False)] == [2, 4, 6]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.chunk = 3


def test_resume_after_kill_gives_the_same_parameters(tmp_path, monkeypatch):
    config = small_config(40)
    straight = train.run(config, str(tmp_path / "straight"))

    workdir = str(tmp_path / "killed")
    proc = subprocess.Popen(_cli_args(config, workdir), cwd=ROOT, stderr=subprocess.PIPE, text=True)
    steps = _wait_for_checkpoint(workdir, proc, at_least=8)
    proc.kill()
    proc.wait()
    steps = _checkpoint_steps(workdir)
    assert steps and steps[-1] < 40, f"the run should have been killed part-way, checkpoints: {steps}"

    # The checkpoint is restored into the state's shapes: no fresh state is allocated beside it (for a replay
    # buffer near memory's size, two copies would not fit).
    allocated, build = [], algos.build

    def counting_build(*args, **kwargs):  # an algorithm whose init_seeds records the arrays it allocates
        algo, hp = build(*args, **kwargs)
        init_seeds = algo.init_seeds

        def counting_init_seeds(*args, **kwargs):
            state = init_seeds(*args, **kwargs)
            allocated.extend(x for x in jax.tree.leaves(state) if not isinstance(x, jax.core.Tracer))
            return state
        algo.init_seeds = counting_init_seeds
        return algo, hp

    monkeypatch.setattr(algos, "build", counting_build)
    resumed = train.run(config, workdir)
    assert not allocated
    _assert_same_params(straight.state.params, resumed.state.params)
    _assert_same_params(straight.state.opt_state, resumed.state.opt_state)
    # The metrics file continues without duplicated updates.
    updates = [r["update"] for r in resumed.metrics]
    assert updates == sorted(set(updates)) and updates[-1] == 40


def _wait_for_first_row(workdir, proc, timeout=600):
    """Block until metrics.jsonl holds a whole row: the first chunk has run, inside the loop whose handler turns
    SIGTERM into a request to stop (the file is first written there). `timeout` only ends a hung run."""
    path, deadline = os.path.join(workdir, "metrics.jsonl"), time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and open(path).read().endswith("\n"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"training exited before its first row: {proc.stderr.read()}")
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"no metrics row within {timeout} s")


def test_sigterm_saves_a_checkpoint_and_the_run_resumes(tmp_path):
    # A million updates (hours at any speed, in chunks of 2): the run cannot end before the signal reaches it,
    # and the only checkpoint it could write before its end is the one SIGTERM asks for.
    total = 1_000_000
    config = small_config(total, **{"checkpoint.every_steps": total * BATCH})
    workdir = str(tmp_path / "run")
    proc = subprocess.Popen(_cli_args(config, workdir), cwd=ROOT, stderr=subprocess.PIPE, text=True)
    _wait_for_first_row(workdir, proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "received SIGTERM" in stderr and "to resume" in stderr, stderr
    logged = [json.loads(line)["update"] for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert logged == list(range(2, logged[-1] + 1, 2)) and logged[-1] < total  # chunks of 2 updates, cut short
    assert _checkpoint_steps(workdir) == [logged[-1]], "one checkpoint, at the last logged update"
    # The checkpoint restores at that update; the run may be extended but not shortened on resume.
    from jaxrl.run.saved import restore_run
    assert restore_run(workdir).update == logged[-1]
    with pytest.raises(ValueError, match=f"total_steps={(logged[-1] + 2) * BATCH} is below"):
        train.run(small_config(logged[-1] + 2, **{"checkpoint.every_steps": total * BATCH}), workdir)


def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(eight_updates, tmp_path, capsys):
    workdir = _copy(eight_updates, tmp_path)
    steps = _checkpoint_steps(workdir)
    assert steps[-2:] == [4, 8]
    latest = os.path.join(workdir, "checkpoints", "8")
    for root, _, files in os.walk(latest):
        for name in files:
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"garbage")
    result = train.run(small_config(8), workdir)
    err = capsys.readouterr().err
    assert "is damaged" in err and "resuming" in err and "at update 4" in err
    assert os.path.isdir(latest + ".corrupt"), "the damaged checkpoint is kept aside, not deleted"
    assert _checkpoint_steps(workdir)[-1] == 8
    assert result.metrics[-1]["update"] == 8


def test_a_finished_run_run_again_reports_without_compiling_its_chunk_program(eight_updates, tmp_path, capsys):
    """The same command on a finished run restores it and returns its state and rows: no chunk program is compiled
    (nor its memory line printed), and nothing is trained or rewritten."""
    workdir = _copy(eight_updates, tmp_path)
    traced = []

    def listen(event, seconds, **kwargs):  # (traced whether or not the compilation cache then holds it)
        if event.endswith("jaxpr_trace_duration"):
            traced.append(kwargs.get("fun_name"))
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        result = train.run(small_config(8), workdir)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    err = capsys.readouterr().err
    assert "resuming from" in err and "at update 8" in err and "memory:" not in err, err
    assert "run" not in traced, traced  # the chunk program (restoring traces a few tiny ones)
    _assert_same_params(result.state.params, eight_updates.state.params)
    assert result.metrics == eight_updates.metrics
    assert _checkpoint_steps(workdir) == _checkpoint_steps(eight_updates.workdir)


def test_resuming_with_a_different_config_is_refused(eight_updates, tmp_path):
    workdir = _copy(eight_updates, tmp_path)
    with pytest.raises(ValueError, match="different config.*optim.learning_rate"):
        train.run(small_config(8, **{"optim.learning_rate": 1e-3}), workdir)
    # Extending the run is allowed, and so is evaluating and checkpointing at other intervals (it evaluated at
    # its end and saved every 4 updates); and so is resuming after jaxrl added a config key (the saved config
    # lacks it).
    saved = config_lib.load(os.path.join(workdir, "config.json"))
    saved.unlock()
    del saved.log["every_steps"]
    config_lib.save(saved, os.path.join(workdir, "config.json"))
    result = train.run(small_config(12, **{"eval.every_steps": 2 * BATCH, "checkpoint.every_steps": 2 * BATCH}),
                       workdir)
    assert [r["update"] for r in result.metrics if any(k.startswith("eval_") for k in r)] == [8, 10, 12]
    assert _checkpoint_steps(workdir)[-3:] == [8, 10, 12]


def test_recurrent_multi_agent_run_resumes_exactly(tmp_path):
    """Hidden states and episode-start flags are part of the checkpoint: a run resumed from a checkpoint (its
    last one lost) ends where a straight run does, every leaf of its state bit for bit."""
    from conftest import assert_same_state, straight_and_resumed
    from helpers import small_smax_config

    config = small_smax_config(num_envs=8, num_steps=16)
    batch = 8 * 16
    config.total_steps, config.log.every_steps, config.log.progress_bar = 6 * batch, 2 * batch, False
    config.eval.episodes, config.checkpoint.every_steps = 2, 2 * batch
    straight, resumed = straight_and_resumed(config, tmp_path, last_checkpoint=6)
    assert [r["update"] for r in resumed.metrics] == [2, 4, 6]
    assert hasattr(resumed.state, "carry") and hasattr(resumed.state, "env_state")
    assert_same_state(straight.state, resumed.state)


def test_a_dropped_algorithm_is_released_with_its_compiled_programs():
    """Nothing (no jit cache) keeps an algorithm alive after its last use: a session that builds many
    would otherwise keep every compiled program mapped in memory."""
    import gc
    import weakref

    from jaxrl import algos, mesh as mesh_lib

    algo, hp = algos.build(small_config(), mesh_lib.make_mesh())
    state, _ = algo.run_chunk(algo.init_seeds(0, 1), hp, 1)
    jax.block_until_ready(algo.evaluate(state.params, jax.random.PRNGKey(0), 4))
    released = weakref.ref(algo)
    del algo, state
    gc.collect()
    assert released() is None


def test_scaled_run_trains_and_saves_the_config_as_it_trains_and_resumes(tmp_path, capsys):
    config = small_config(4, **{"scale.num_envs": 8, "log.every_steps": 2 * 2 * BATCH,
                                "checkpoint.every_steps": 2 * 2 * BATCH})
    config.total_steps = 2 * 2 * BATCH  # two updates of 8 envs x 32 steps
    workdir = str(tmp_path / "scaled")
    result = train.run(config, workdir)
    assert "num_envs 4 -> 8" in capsys.readouterr().err
    saved = json.load(open(os.path.join(workdir, "config.json")))
    assert (saved["num_envs"], saved["optim"]["num_minibatches"]) == (8, 2 * config.optim.num_minibatches)
    assert [r["env_steps"] for r in result.metrics] == [2 * 2 * BATCH]
    config.total_steps = 4 * 2 * BATCH  # the same command line, longer: resumes (the saved config matches)
    assert train.run(config, workdir).metrics[-1]["env_steps"] == 4 * 2 * BATCH
