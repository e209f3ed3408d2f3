"""Algorithms by name: `build(config, mesh)` returns (algorithm, hyperparams) for the training loop.

An algorithm object offers `init_seeds(seed, num_seeds)`, `state_shardings(state)`,
`run_chunk(state, hyperparams, num_updates)`, `evaluate(params, key, num_envs)` and `settings`
(with `batch_size` and `num_updates`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from ml_collections import ConfigDict

import envs
from jaxrl.algos.ppo import PPO, PPOHyperparams, PPOSettings, TrainState
from jaxrl.networks import ActorCritic, RecurrentActorCritic

NETWORKS = ("mlp", "gru")


def make_network(config: ConfigDict, num_actions: int):
    """The actor-critic named by `config.network.kind`."""
    n = config.network
    if n.kind == "mlp":
        return ActorCritic(num_actions, tuple(n.hidden_sizes), n.activation)
    if n.kind == "gru":
        return RecurrentActorCritic(num_actions, n.fc_size, n.rnn_size, n.activation)
    raise ValueError(f"unknown config.network.kind {n.kind!r}; known: {', '.join(NETWORKS)}")


def _ppo(config: ConfigDict, mesh):
    env = envs.make(config.env.name, **config.env.kwargs.to_dict())
    c = config.ppo
    settings = PPOSettings(
        num_envs=config.num_envs, num_steps=config.num_steps, num_epochs=c.num_epochs,
        num_minibatches=c.num_minibatches,
        num_updates=config.total_steps // (config.num_envs * config.num_steps),
        anneal_lr=c.anneal_lr, normalize_advantages=c.normalize_advantages, clip_value=c.clip_value,
        bootstrap_truncation=c.bootstrap_truncation, adam_eps=c.adam_eps,
        rollout_unroll=config.rollout_unroll, critic_input=c.critic_input, agent_id=config.network.agent_id)
    network = make_network(config, env.num_actions)
    hyperparams = jax.tree.map(jnp.float32, PPOHyperparams(
        learning_rate=c.learning_rate, gamma=c.gamma, gae_lambda=c.gae_lambda, clip_eps=c.clip_eps,
        vf_coef=c.vf_coef, ent_coef=c.ent_coef, max_grad_norm=c.max_grad_norm))
    eval_max_steps = config.eval.max_steps or env.max_episode_steps or 1000
    return PPO(env, network, settings, mesh, eval_max_steps=eval_max_steps), hyperparams


ALGORITHMS = {"ppo": _ppo}


def build(config: ConfigDict, mesh):
    """(algorithm, hyperparams) for `config.algorithm`."""
    return ALGORITHMS[config.algorithm](config, mesh)


__all__ = ["ALGORITHMS", "NETWORKS", "PPO", "PPOHyperparams", "PPOSettings", "TrainState", "build"]
