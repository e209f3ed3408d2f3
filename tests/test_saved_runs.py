"""Run directories saved by an earlier jaxrl still evaluate and resume after config keys move
(`config.RENAMED_KEYS`). tests/data/saved_runs/pendulum_sac was written at revision 177eec3, before
`temperature.learning_rate` became `optim.temperature_learning_rate` (its run_info.json holds the command)."""

import json
import os
import shutil

import pytest

from helpers import ROOT
from jaxrl import algos, config as config_lib, metrics, train
from jaxrl.run import policies

SAVED_SAC = os.path.join(ROOT, "tests", "data", "saved_runs", "pendulum_sac")


@pytest.fixture
def saved_sac(tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(SAVED_SAC, workdir)
    return str(workdir)


def test_a_saved_config_is_read_with_its_keys_under_their_new_names(saved_sac):
    with open(os.path.join(saved_sac, "config.json")) as f:
        saved = json.load(f)
    assert saved["temperature"]["learning_rate"] == 1e-3 and "temperature_learning_rate" not in saved["optim"]
    config = config_lib.load(os.path.join(saved_sac, "config.json"))
    assert config.optim.temperature_learning_rate == 1e-3 and "learning_rate" not in config.temperature
    assert saved["eval"]["num_envs"] == config.eval.episodes == 2 and "num_envs" not in config.eval
    algos.validate(config)
    assert config_lib.differences(config, algos.default_config("sac"), added=False) == [  # the run's own settings
        "checkpoint.every_steps", "eval.episodes", "eval.every_steps", "eval.max_steps", "experiment", "log.every_steps",
        "log.progress_bar", "network.hidden_sizes", "replay.batch_size", "replay.buffer_size", "replay.learning_starts",
        "total_steps"]


def test_a_saved_run_evaluates_as_it_did_and_resumes(saved_sac):
    recorded = [row for row in metrics.read(os.path.join(saved_sac, "metrics.jsonl"))]
    summary = policies.evaluate_run(saved_sac)  # greedy, the run's own episodes and key: its own figure
    assert summary["update"] == 128 and summary["eval_return"] == recorded[-1]["eval_return"]
    config = config_lib.load(os.path.join(saved_sac, "config.json"))
    with config.unlocked():
        config.total_steps = 192
    rows = train.run(config, saved_sac).metrics
    assert [row["env_steps"] for row in rows] == [64, 128, 192]  # resumed at 128: its rows kept, one more
    assert rows[:2] == recorded


def test_migrate_moves_a_key_once_and_refuses_both_names():
    renamed = {"a.old": "b.new"}
    assert config_lib.migrate({"a": {"old": 1}, "b": {"x": 2}}, renamed) == {"b": {"x": 2, "new": 1}}
    assert config_lib.migrate({"a": {"old": 1, "kept": 0}}, renamed) == {"a": {"kept": 0}, "b": {"new": 1}}
    assert config_lib.migrate({"b": {"new": 3}}, renamed) == {"b": {"new": 3}}  # already new
    with pytest.raises(ValueError, match="both a.old and b.new"):
        config_lib.migrate({"a": {"old": 1}, "b": {"new": 3}}, renamed)



ADDED_SINCE_THE_RENAME = ("advantage.stratum_weight", "advantage.prior_weight", "advantage.prior_z",
                         "advantage.rare_weight_max")


@pytest.mark.parametrize("name,old_names", [
    ("grpo", {"advantage.estimator": "advantage", "loss.critic_weight": "critic_weight", "eval.episodes": "eval.num_envs",
              **{f"advantage.{o}": f"advantage_options.{o}" for o in ("scale", "eps", "clip", "max_reward", "renormalize")}}),
    ("ppo", {"advantage.estimator": "returns.advantage", "eval.episodes": "eval.num_envs"})])
def test_a_config_saved_under_the_old_names_reads_as_today_s(name, old_names):
    """GRPO's top-level `advantage` with its `advantage_options`, PPO's `returns.advantage`, `critic_weight` and
    `eval.num_envs`, as configs saved before 2026-11-29 hold them, land on today's keys."""
    # (keys added after the rename, which a config saved before it cannot hold)
    expected = {k: v for k, v in config_lib.flat_keys(algos.default_config(name).to_dict()).items()
                if k not in ADDED_SINCE_THE_RENAME}
    flat = dict(expected)
    flat.update({old_names[key]: flat.pop(key) for key in list(flat) if key in old_names})
    saved = config_lib.nested(flat)
    assert ("advantage" in saved) == (name == "grpo") and "num_envs" in saved["eval"]
    assert config_lib.migrate(saved) == config_lib.nested(expected)
