"""Reusing a run: `jaxrl.evaluate` reproduces the run's own final evaluation, `jaxrl.load_policy` acts as the
evaluation does, and an exported policy loads alone."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
import jaxrl
from helpers import small_cartpole, small_smax_config, tiny_grpo_config
from jaxrl import sampling, train
from jaxrl.run import policies


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    """Two seeds, with observation statistics: evaluation, loaded and exported policies must carry them."""
    workdir = str(tmp_path_factory.mktemp("cartpole") / "run")
    return train.run(small_cartpole(num_seeds=2, **{"normalize.obs": True}), workdir, progress=False)


@pytest.fixture(scope="module")
def seed_one(cartpole_run):
    """Seed 1's policy, loaded from the run."""
    return jaxrl.load_policy(cartpole_run.workdir, seed=1)


def _final_eval(result, keys):
    last = result.metrics[-1]
    return {k: last[k] for k in keys}, {k: last.get(f"{k}_per_seed") for k in keys}


def test_evaluate_reproduces_the_runs_final_evaluation_ppo_cartpole(cartpole_run):
    summary = policies.evaluate_run(cartpole_run.workdir)
    means, per_seed = _final_eval(cartpole_run, ["eval_return", "eval_length"])
    assert summary["update"] == cartpole_run.metrics[-1]["update"]
    assert summary["eval_return"] == pytest.approx(means["eval_return"], rel=1e-6)
    assert summary["eval_length"] == pytest.approx(means["eval_length"], rel=1e-6)
    assert summary["eval_return_per_seed"] == pytest.approx(per_seed["eval_return"], rel=1e-6)
    assert summary["out_dir"] == os.path.join(cartpole_run.workdir, f"eval-{summary['update']}")
    with open(os.path.join(summary["out_dir"], "evaluation.json")) as f:
        assert json.load(f)["eval_return"] == summary["eval_return"]


def test_evaluate_reproduces_the_runs_final_evaluation_mappo_smax(tmp_path):
    config = small_smax_config()
    config.num_seeds, config.eval.episodes, config.log.progress_bar = 2, 8, False
    result = train.run(config, str(tmp_path / "run"), progress=False)
    summary = policies.evaluate_run(result.workdir, out_dir=str(tmp_path / "eval"))
    means, per_seed = _final_eval(result, ["eval_return", "eval_win_rate"])
    for key in means:
        assert summary[key] == pytest.approx(means[key], rel=1e-6), key
        assert summary[f"{key}_per_seed"] == pytest.approx(per_seed[key], rel=1e-6), key
    assert summary["files"] == [str(tmp_path / "eval" / "eval_episode.gif")]
    assert os.path.getsize(summary["files"][0]) > 0
    # The SMAX renderer draws the loaded policy's greedy episode, a frame per state.
    from PIL import Image

    from envs.smax import render
    actor = jaxrl.load_policy(result.workdir)
    states = actor.episode_states(jax.random.PRNGKey(0))
    gif, _ = render.render_episode(actor.env, states, str(tmp_path / "render"))
    with Image.open(gif) as frames:
        assert frames.n_frames == len(states)


def test_evaluate_reproduces_the_runs_final_evaluation_text_grpo(tmp_path):
    # (from scratch: what is evaluated does not matter, only that the evaluation is the run's own)
    result = train.run(tiny_grpo_config(""), str(tmp_path / "grpo"), progress=False)
    summary = policies.evaluate_run(result.workdir)
    means, _ = _final_eval(result, ["eval_accuracy", "eval_length"])
    assert summary["eval_accuracy"] == pytest.approx(means["eval_accuracy"], rel=1e-6)
    assert summary["eval_length"] == pytest.approx(means["eval_length"], rel=1e-6)
    (completions,) = summary["files"]
    lines = open(completions).read().splitlines()
    assert lines[0].startswith("# 16 held-out problems, greedy") and len(lines) == 17 and "->" in lines[1]
    # The loaded model answers strings, as the evaluation decodes them.
    actor = jaxrl.load_policy(result.workdir)
    problems = actor.task.heldout(4, seed=1234)
    texts = [prompt for prompt, _ in actor.task.texts(problems)]
    assert len(actor.complete(texts)) == 4
    # Its likelihood of a string is what the sampler's cache says of the same tokens forced through it, EOS included
    policy, answers = actor.policy, [answer for _, answer in actor.task.texts(problems)]
    prompts, tokens, mask = policy.encode_pairs(texts, answers)
    forced = sampling.sample_groups_per_prompt(
        policy.model, actor.params, jnp.asarray(prompts), jax.random.split(jax.random.PRNGKey(3), 4), group_size=1,
        max_new_tokens=tokens.shape[1], eos_id=policy.vocab.eos_id, pad_id=policy.vocab.pad_id,
        forced=jnp.asarray(tokens), forced_len=jnp.asarray(mask.sum(-1), jnp.int32))
    np.testing.assert_array_equal(np.asarray(forced.tokens[:, 0]), tokens)
    np.testing.assert_allclose(actor.log_likelihood(texts, answers), np.asarray(forced.log_probs[:, 0].sum(-1)),
                               rtol=1e-4)
    with pytest.raises(ValueError, match="4 prompts and 3 completions"):
        actor.log_likelihood(texts, answers[:3])


def test_the_loaded_policy_plays_as_the_evaluation_does(seed_one):
    """A hand-written loop of `actor(obs)` on CartPole, with the evaluation's keys, gets the same returns."""
    actor = seed_one
    key, num_envs = jax.random.PRNGKey(7), 4
    reset_key, step_key = jax.random.split(key)
    obs, state = jax.vmap(actor.env.reset)(jax.random.split(reset_key, num_envs))
    returns, alive, carry = np.zeros(num_envs), np.ones(num_envs, bool), None
    for step_key in jax.random.split(step_key, actor.policy.eval_max_steps):
        action, carry = actor(obs, carry)
        assert action.shape == (num_envs,)
        obs, state, reward, done, info = jax.vmap(actor.env.step)(jax.random.split(step_key, num_envs), state, action)
        returns += np.asarray(reward) * alive
        alive &= ~np.asarray(envs.episode_over(done, info))
    played = actor.play(key, num_envs)
    assert played["eval_return"] == pytest.approx(returns.mean(), rel=1e-6)


def test_an_exported_policy_loads_alone_and_acts_the_same(cartpole_run, seed_one, tmp_path):
    out = policies.export_policy(cartpole_run.workdir, str(tmp_path / "policy"), seed=1)
    assert sorted(os.listdir(out)) == ["config.json", "exported_policy.json", "params"]
    exported, original = jaxrl.load_policy(out), seed_one
    statistics = exported.params["obs_norm"]["obs"]
    assert float(statistics.count) == 8 * 16 * 4  # every observation of seed 1's run
    np.testing.assert_array_equal(statistics.mean, original.params["obs_norm"]["obs"].mean)
    obs = jax.random.normal(jax.random.PRNGKey(0), (16, 4))
    np.testing.assert_array_equal(exported(obs)[0], original(obs)[0])
    with pytest.raises(ValueError, match="not empty"):
        policies.export_policy(cartpole_run.workdir, out)


def test_the_cli_prints_the_summary_and_rejects_bad_input(cartpole_run, tmp_path, run_command):
    def cli(*args):
        return run_command("jaxrl.evaluate", *args)
    done = cli(f"--workdir={cartpole_run.workdir}", "--episodes=8", "--sample", f"--out={tmp_path}")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 8 and summary["sample"] is True
    # the figures of the library's evaluation of the same checkpoint, episodes and key (the command adds nothing)
    library = policies.evaluate_run(cartpole_run.workdir, episodes=8, sample=True, out_dir=str(tmp_path / "lib"))
    assert summary["eval_return"] == library["eval_return"] and summary["eval_return_per_seed"] == \
        library["eval_return_per_seed"]
    for args, expected in [((f"--workdir={tmp_path / 'nope'}",), "is not a run directory"),
                           ((f"--workdir={cartpole_run.workdir}", "--checkpoint=3"), "no checkpoint 3"),
                           ((), "give --workdir")]:
        failed = cli(*args)
        assert failed.returncode == 2, failed.stderr
        last = failed.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and expected in last and "Traceback" not in failed.stderr
