"""What several test files share: experiment configs at test sizes, and building an algorithm from one.

Subprocess tests import these too (`sys.path.insert(0, "tests"); from helpers import ...`)."""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_experiment(name: str, arg: str | None = None):
    """experiments/<name>.py's config for `arg` (locked)."""
    from jaxrl import config as config_lib

    path = os.path.join(ROOT, "experiments", f"{name}.py")
    return config_lib.from_file(f"{path}:{arg}" if arg else path)


def set_keys(config, overrides: dict):
    """Set dotted config keys ("loss.clip_high": 0.28) as the command line does; returns the config."""
    from jaxrl import config as config_lib

    return config_lib.set_values(config, overrides)


def build(config, num_seeds=1):
    """(algorithm, hyperparams, initial state of `num_seeds` seeds) for a validated config."""
    from jaxrl import algos, mesh as mesh_lib

    algos.validate(config)
    algo, hp = algos.build(config, mesh_lib.make_mesh())
    return algo, hp, algo.init_seeds(config.seed, num_seeds)


def evaluation_curve(config, metric: str, every_steps: int) -> list[tuple[int, float]]:
    """Train one seed of `config` (config.seed) to config.total_steps in chunks of `every_steps` env steps,
    evaluating before training and after each chunk as the training loop does (`config.eval.episodes` greedy
    episodes): [(env steps, value of `metric`)], the first at 0 steps. A learning test reads its end (the last
    one or two), the figure a user's run ends on, not the best point on the way."""
    from jaxrl import algos
    from jaxrl.run.program import evaluation_key

    algos.validate(config)
    algo, hp, state = build(algos.resolve(config))
    batch = algo.settings.batch_size
    updates, per_chunk = algo.settings.num_updates, max(1, every_steps // batch)

    def evaluate(done):
        return done * batch, float(algo.evaluate(state.params, evaluation_key(config.seed, done),
                                                 config.eval.episodes)[metric][0])

    curve, done = [evaluate(0)], 0
    while done < updates:
        num = min(per_chunk, updates - done)
        state, _ = algo.run_chunk(state, hp, num)
        done += num
        curve.append(evaluate(done))
    return curve


def small_cartpole(**overrides):
    """experiments/cartpole_ppo.py at 8 envs x 16 steps, 4 updates, logging every 2, at a constant learning rate:
    its compiled programs do not depend on total_steps, so that runs of other lengths take them from the test
    session's compilation cache (a linear schedule is a constant of the program)."""
    config = load_experiment("cartpole_ppo")
    return set_keys(config, {"num_envs": 8, "num_steps": 16, "total_steps": 8 * 16 * 4, "log.progress_bar": False,
                             "log.every_steps": 8 * 16 * 2, "eval.episodes": 4, "optim.schedule": "constant",
                             **overrides})


def small_smax_config(scenario="3m", critic_input="global_state", kind="gru", num_envs=8, num_steps=32):
    """experiments/smax_mappo.py with small networks, 4 updates."""
    config = load_experiment("smax_mappo", scenario)
    config.num_envs, config.num_steps = num_envs, num_steps
    config.total_steps = num_envs * num_steps * 4
    config.network.critic_input = critic_input
    config.network.kind = kind
    config.network.fc_size, config.network.rnn_size, config.network.hidden_sizes = 32, 32, (32, 32)
    config.log.artifacts = False  # (tests that read the episode GIF set it)
    return config


def small_grpo_config(name="cartpole_grpo", arg=None, num_envs=8, num_steps=64, group_size=4, **overrides):
    """An env GRPO experiment with small networks, 4 updates, 2 minibatches; `overrides` by dotted key."""
    config = load_experiment(name, arg)
    config.num_envs, config.num_steps, config.group.size = num_envs, num_steps, group_size
    config.total_steps = num_envs * num_steps * 4
    config.optim.num_minibatches = 2
    config.network.fc_size, config.network.rnn_size, config.network.hidden_sizes = 32, 32, (32, 32)
    return set_keys(config, overrides)


def tiny_sft_config(task="addition", total_steps=3_200):
    """experiments/text_sft.py with a one-layer model, logging and evaluating every 1,600 samples."""
    config = load_experiment("text_sft", task)
    config.total_steps, config.num_prompts = total_steps, 32
    config.model.num_layers, config.model.d_model, config.model.num_heads = 1, 64, 2
    config.optim.warmup_updates = 10
    config.log.every_steps, config.eval.every_steps, config.eval.episodes = 1_600, 1_600, 64
    config.checkpoint.every_steps = 1_600
    config.log.progress_bar, config.log.artifacts = False, False  # (no sample completions: tests that read them set it)
    return config


def countdown_2() -> dict:
    """Two-number Countdown ("a op b" reaching a target up to 100, numbers up to 25), for SFT and GRPO alike: the
    keys to set."""
    from envs import text

    return {"task.name": "countdown", "task.kwargs": {**text.task_options("countdown"), "num_numbers": 2}}


def tiny_grpo_config(init_from, **overrides):
    """experiments/text_grpo.py:addition warm-started from the SFT run `init_from` (a tiny_sft_config run):
    8 prompts x 4 samples, 4 updates; `overrides` by dotted key."""
    config = load_experiment("text_grpo", "addition")
    config.init_from = init_from
    config.num_prompts, config.group.size = 8, 4
    config.total_steps = 8 * 4 * 4
    config.model.num_layers, config.model.d_model, config.model.num_heads = 1, 64, 2  # as tiny_sft_config
    config.log.every_steps, config.eval.every_steps, config.eval.episodes = 64, 128, 32
    config.checkpoint.every_steps = 128
    config.log.progress_bar, config.log.artifacts = False, False
    return set_keys(config, overrides)




def auto_reset_parity(ours, ref_reset, ref_step, num_envs: int = 8, num_steps: int = 200, seed: int = 0,
                      ignore_state_fields: tuple[str, ...] = ()) -> dict:
    """Step `envs.AutoReset(ours)` (an adapter whose states are the library's own) and the library's own
    auto-resetting step from the same states with the same keys and random actions, over whole episodes and
    their resets, and assert equal observations (flattened), rewards, done, next states and whatever else
    `ref_step` reports, at every step.

    ref_reset(key) -> (obs, state); ref_step(key, state, action) -> (dict with "obs", "reward", "done" and
    any of "terminated", "truncated", "final_obs" to compare with ours, next state).
    Floats may differ in the last bit (the two are compiled apart, and XLA may fuse a multiply-add
    differently), so both sides step from the reference's state, where one bit would otherwise grow over a
    chaotic episode (Acrobot). `ignore_state_fields`: state fields left out (documented differences).
    Returns how many episodes ended {"terminated": ..., "truncated": ...} (ours).
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    import envs

    wrapped = envs.AutoReset(ours)
    space = ours.action_space()
    flat = jax.vmap(lambda x: jnp.ravel(jnp.asarray(x)).astype(jnp.float32))
    keys = jax.random.split(jax.random.PRNGKey(seed), num_envs)

    @jax.jit  # (the resets too: run op by op, a large env's reset costs more than compiling it)
    def both(keys, key):
        obs, _ = jax.vmap(wrapped.reset)(keys)
        ref_obs, state = jax.vmap(ref_reset)(keys)

        def step(state, key):
            action_key, step_key = jax.random.split(key)
            actions = jax.vmap(space.sample)(jax.random.split(action_key, num_envs))
            step_keys = jax.random.split(step_key, num_envs)
            obs, our_state, reward, done, info = jax.vmap(wrapped.step)(step_keys, state, actions)
            theirs, ref_state = jax.vmap(ref_step)(step_keys, state, actions)
            theirs = dict(theirs, obs=flat(theirs["obs"]), reward=theirs["reward"].astype(jnp.float32),
                          state=ref_state)
            if "final_obs" in theirs:
                theirs["final_obs"] = flat(theirs["final_obs"])
            our_state = our_state.replace(**{f: getattr(ref_state, f) for f in ignore_state_fields})
            ours = {"obs": obs, "reward": reward, "done": done, "terminated": info["terminated"],
                    "truncated": info["truncated"], "final_obs": info["final_obs"], "state": our_state}
            return ref_state, ({k: ours[k] for k in theirs}, theirs, (info["terminated"], info["truncated"]))
        return obs, flat(ref_obs), jax.lax.scan(step, state, jax.random.split(key, num_steps))[1]

    obs, ref_obs, (ours_out, theirs_out, (terminated, truncated)) = jax.device_get(
        both(keys, jax.random.PRNGKey(seed + 1)))
    np.testing.assert_allclose(obs, ref_obs, rtol=1e-6, atol=1e-6)
    for name in theirs_out:
        for x, y in zip(jax.tree.leaves(ours_out[name]), jax.tree.leaves(theirs_out[name])):
            x, y = np.asarray(x), np.asarray(y)
            if np.issubdtype(x.dtype, np.floating):
                np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6, err_msg=f"{ours!r}: {name} differs")
            else:
                np.testing.assert_array_equal(x, y, err_msg=f"{ours!r}: {name} differs")
    return {"terminated": int(terminated.sum()), "truncated": int(truncated.sum())}


def gymnax_parity(ours, ref, ref_params, **kwargs) -> dict:
    """`auto_reset_parity` against gymnax 1.x's own `step` (`ref`): also terminated, truncated (where the
    episode did not also terminate) and the final observations."""
    def ref_step(key, state, action):
        obs, state, reward, terminated, truncated, info = ref.step(key, state, action, ref_params)
        return {"obs": obs, "reward": reward, "done": terminated | truncated, "terminated": terminated,
                "truncated": truncated & ~terminated, "final_obs": info["final_observation"]}, state

    return auto_reset_parity(ours, lambda key: ref.reset(key, ref_params), ref_step, **kwargs)
