"""gymnax's authors' PPO checkpoints, evaluated here: the reference of `env_suites.py`'s gymnax rows measured
with the same protocol as our policies rather than quoted.

gymnax-blines (github.com/RobertTLange/gymnax-blines) keeps, per env, `agents/<env_id>/ppo.pkl`: a pickled dict
with the trained network's parameters, its training log (`log_steps`, `log_return`: returns of sampled
actions over 164 episodes) and its config. Its networks are separate actor and critic MLPs of ReLU layers; a
categorical actor's layers are named `Dense_<i>` (logits last), a Gaussian actor's `actor_fc_<i>`, then
`actor_fc_mu` and `actor_fc_scale` (std = softplus(scale) + 0.001). MinAtar observations are flattened.

    checkpoint = load(checkout, "Pendulum-v1")
    returns = episode_returns(checkpoint, "Pendulum-v1", jax.random.PRNGKey(0), 1024, sample=True)
"""

from __future__ import annotations

import os
import pickle

import jax
import jax.numpy as jnp
import numpy as np

MIN_STD = 0.001


class _Anything(dict):
    """Stands in for the classes a checkpoint's config was pickled with (dotmap's DotMap): keeps their state."""

    def __setstate__(self, state):
        self.update(state if isinstance(state, dict) else {})


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            return _Anything


def checkpoint_path(checkout: str, env_id: str) -> str:
    return os.path.join(checkout, "agents", env_id, "ppo.pkl")


def load(checkout: str, env_id: str) -> dict:
    """{"params": the network's parameters (numpy), "log_steps", "log_return": its training log} of the PPO
    checkpoint of `env_id` in a gymnax-blines checkout."""
    path = checkpoint_path(checkout, env_id)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no PPO checkpoint for {env_id} at {path} (is {checkout} a gymnax-blines checkout?)")
    with open(path, "rb") as f:
        saved = _Unpickler(f).load()
    params = jax.tree.map(np.asarray, dict(saved["network"]["params"]))
    return {"params": params, "log_steps": [int(s) for s in saved["log_steps"]],
            "log_return": [float(r) for r in saved["log_return"]]}


def _actor(params: dict, obs: jax.Array, continuous: bool):
    """The actor's outputs for one observation: logits [K], or (mean [D], std [D])."""
    def dense(name, x):
        return x @ params[name]["kernel"] + params[name]["bias"]

    x = obs.reshape(-1)
    if continuous:
        hidden = sorted((k for k in params if k.startswith("actor_fc_") and k[len("actor_fc_"):].isdigit()),
                        key=lambda k: int(k.rsplit("_", 1)[1]))
        for name in hidden:
            x = jax.nn.relu(dense(name, x))
        return dense("actor_fc_mu", x), jax.nn.softplus(dense("actor_fc_scale", x)) + MIN_STD
    layers = sorted((k for k in params if k.startswith("Dense_")), key=lambda k: int(k.split("_")[1]))
    for name in layers[:-1]:
        x = jax.nn.relu(dense(name, x))
    return dense(layers[-1], x)


def episode_returns(checkpoint: dict, env_id: str, key: jax.Array, episodes: int, sample: bool = True) -> np.ndarray:
    """The return of `episodes` episodes [episodes] of the checkpoint's policy on gymnax's `env_id` (default
    params), with sampled actions (the protocol of the checkpoint's own log) or, without `sample`, the mode."""
    import gymnax

    env, env_params = gymnax.make(env_id)
    continuous = "actor_fc_mu" in checkpoint["params"]
    params = jax.tree.map(jnp.asarray, checkpoint["params"])

    def act(obs, key):
        if continuous:
            mean, std = _actor(params, obs, True)
            return mean + std * jax.random.normal(key, mean.shape) if sample else mean
        logits = _actor(params, obs, False)
        return jax.random.categorical(key, logits) if sample else jnp.argmax(logits)

    def episode(key):
        reset_key, key = jax.random.split(key)
        obs, state = env.reset(reset_key, env_params)

        def step(carry, key):
            obs, state, total, running = carry
            action_key, step_key = jax.random.split(key)
            obs, state, reward, terminated, truncated, _ = env.step(step_key, state, act(obs, action_key),
                                                                    env_params)
            done = jnp.logical_or(terminated, truncated).astype(jnp.float32)
            return (obs, state, total + reward * running, running * (1.0 - done)), None

        steps = jax.random.split(key, env_params.max_steps_in_episode)
        (_, _, total, _), _ = jax.lax.scan(step, (obs, state, 0.0, 1.0), steps)
        return total

    return np.asarray(jax.jit(jax.vmap(episode))(jax.random.split(key, episodes)))
