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
from jaxrl.algos.grpo import GRPO, GRPOHyperparams, GRPOSettings
from jaxrl.algos.ppo import PPO, PPOHyperparams, PPOSettings, TrainState
from jaxrl.networks import ActorCritic, RecurrentActorCritic

NETWORKS = ("mlp", "gru")


def make_network(config: ConfigDict, num_actions: int, critic: bool = True):
    """The actor-critic named by `config.network.kind` (without a value network when `critic` is false)."""
    n = config.network
    if n.kind == "mlp":
        return ActorCritic(num_actions, tuple(n.hidden_sizes), n.activation, critic=critic)
    if n.kind == "gru":
        return RecurrentActorCritic(num_actions, n.fc_size, n.rnn_size, n.activation, critic=critic)
    raise ValueError(f"unknown config.network.kind {n.kind!r}; known: {', '.join(NETWORKS)}")


def _shared_settings(config: ConfigDict) -> dict:
    """PPOSettings fields that every algorithm reads from the same keys."""
    c = config.ppo
    return dict(num_envs=config.num_envs, num_steps=config.num_steps, num_epochs=c.num_epochs,
                num_minibatches=c.num_minibatches,
                num_updates=config.total_steps // (config.num_envs * config.num_steps),
                anneal_lr=c.anneal_lr, adam_eps=c.adam_eps, rollout_unroll=config.rollout_unroll,
                critic_input=c.critic_input, agent_id=config.network.agent_id)


def _make_env(config: ConfigDict):
    env = envs.make(config.env.name, **config.env.kwargs.to_dict())
    return env, config.eval.max_steps or env.max_episode_steps or 1000


def _ppo(config: ConfigDict, mesh):
    env, eval_max_steps = _make_env(config)
    c = config.ppo
    settings = PPOSettings(**_shared_settings(config), normalize_advantages=c.normalize_advantages,
                           clip_value=c.clip_value, bootstrap_truncation=c.bootstrap_truncation)
    hyperparams = jax.tree.map(jnp.float32, PPOHyperparams(
        learning_rate=c.learning_rate, gamma=c.gamma, gae_lambda=c.gae_lambda, clip_eps=c.clip_eps,
        vf_coef=c.vf_coef, ent_coef=c.ent_coef, max_grad_norm=c.max_grad_norm))
    network = make_network(config, env.num_actions)
    return PPO(env, network, settings, mesh, eval_max_steps=eval_max_steps), hyperparams


def advantage_options(config: ConfigDict) -> tuple[tuple[str, object], ...]:
    """config.advantage_options as keyword options of the estimator ("" and 0 mean the default / off)."""
    o = config.advantage_options
    return (("scale", o.scale or None), ("eps", o.eps), ("clip", o.clip or None), ("max_reward", o.max_reward),
            ("renormalize", o.renormalize))


def _group_relative_settings(config: ConfigDict) -> dict:
    """The estimator and loss-part choices that env and text GRPO read from the same keys."""
    loss = config.loss
    return dict(group_size=config.group.size, advantage=config.advantage,
                advantage_options=advantage_options(config), ratio=loss.ratio, aggregate=loss.aggregate,
                dual_clip=loss.dual_clip or None)


def _grpo(config: ConfigDict, mesh):
    env, eval_max_steps = _make_env(config)
    c, loss = config.ppo, config.loss
    settings = GRPOSettings(
        **_shared_settings(config), **_group_relative_settings(config), returns=config.group.returns,
        constant_length=loss.constant_length or None)
    hyperparams = jax.tree.map(jnp.float32, GRPOHyperparams(
        learning_rate=c.learning_rate, gamma=c.gamma, clip_eps=loss.clip_low, clip_high=loss.clip_high,
        vf_coef=c.vf_coef, ent_coef=loss.ent_coef, max_grad_norm=c.max_grad_norm,
        critic_weight=config.critic_weight))
    network = make_network(config, env.num_actions, critic=config.critic_weight > 0)
    return GRPO(env, network, settings, mesh, eval_max_steps=eval_max_steps), hyperparams


def _text_settings(config: ConfigDict, settings_cls, value_head: bool = False, **extra):
    o = config.optim
    model = dict(config.model.to_dict(), d_ff=config.model.d_ff or None, value_head=value_head)
    return settings_cls(
        task=config.task.name, task_kwargs=tuple(sorted(config.task.kwargs.to_dict().items())),
        num_prompts=config.num_prompts,
        num_updates=config.total_steps // (config.num_prompts * extra.get("group_size", 1)),
        warmup_updates=o.warmup_updates, adam_eps=o.adam_eps, model_kwargs=tuple(sorted(model.items())),
        pass_k=config.eval.pass_k, **extra)


def _text_sft(config: ConfigDict, mesh):
    from jaxrl.algos.text import TextHyperparams, TextSettings, TextSFT

    o = config.optim
    hyperparams = jax.tree.map(jnp.float32, TextHyperparams(
        learning_rate=o.learning_rate, max_grad_norm=o.max_grad_norm, weight_decay=o.weight_decay))
    return TextSFT(_text_settings(config, TextSettings), mesh), hyperparams


def _text_grpo(config: ConfigDict, mesh):
    import os

    from jaxrl.algos.text import TextGRPO, TextGRPOHyperparams, TextGRPOSettings, restore_text_params

    o, loss = config.optim, config.loss
    tokenizer = os.path.join(config.init_from, "tokenizer.json") if config.init_from else None
    settings = _text_settings(
        config, TextGRPOSettings, value_head=config.critic_weight > 0, **_group_relative_settings(config),
        tokenizer_path=tokenizer, oversample=config.group.oversample, top_k=config.sampling.top_k,
        reward_weights=tuple(config.reward_weights), kl=loss.kl, use_kl=loss.kl_coef > 0,
        num_epochs=o.num_epochs, num_minibatches=o.num_minibatches)
    hyperparams = jax.tree.map(jnp.float32, TextGRPOHyperparams(
        learning_rate=o.learning_rate, max_grad_norm=o.max_grad_norm, weight_decay=o.weight_decay,
        clip_low=loss.clip_low, clip_high=loss.clip_high, kl_coef=loss.kl_coef, ent_coef=loss.ent_coef,
        vf_coef=loss.vf_coef, critic_weight=config.critic_weight, temperature=config.sampling.temperature,
        top_p=config.sampling.top_p))
    init_params = restore_text_params(config.init_from, settings, mesh) if config.init_from else None
    return TextGRPO(settings, mesh, init_params), hyperparams


ALGORITHMS = {"ppo": _ppo, "grpo": _grpo, "text_sft": _text_sft, "text_grpo": _text_grpo}


def build(config: ConfigDict, mesh):
    """(algorithm, hyperparams) for `config.algorithm`."""
    return ALGORITHMS[config.algorithm](config, mesh)


__all__ = ["ALGORITHMS", "GRPO", "GRPOHyperparams", "GRPOSettings", "NETWORKS", "PPO", "PPOHyperparams", "PPOSettings", "TrainState", "build"]
