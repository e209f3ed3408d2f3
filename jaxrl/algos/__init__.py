"""Algorithms by name: `build(config, mesh)` returns (algorithm, hyperparams) for the training loop.

An algorithm object offers `init_seeds(seed, num_seeds, num_settings)`, `state_shardings(state)`,
`run_chunk(state, hyperparams, num_updates)`, `evaluate(params, key, num_envs)` and `settings`
(with `batch_size` and `num_updates`).

Each algorithm declares which config keys become its traced hyperparameters (`ALGORITHMS[name].keys`): those
are the keys a sweep varies inside one compiled program. Every other key is static.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from ml_collections import ConfigDict

import envs
from jaxrl import config as config_lib
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
                critic_input=c.critic_input, agent_id=config.network.agent_id, grad_clip=c.grad_clip,
                xla_options=config_lib.xla_options(config))


def _make_env(config: ConfigDict):
    env = envs.make(config.env.name, **config.env.kwargs.to_dict())
    return env, config.eval.max_steps or env.max_episode_steps or 1000


def _ppo(config: ConfigDict, mesh):
    env, eval_max_steps = _make_env(config)
    c = config.ppo
    settings = PPOSettings(**_shared_settings(config), normalize_advantages=c.normalize_advantages,
                           clip_value=c.clip_value, bootstrap_truncation=c.bootstrap_truncation,
                           returns_until=c.returns_until)
    network = make_network(config, env.num_actions)
    return PPO(env, network, settings, mesh, eval_max_steps=eval_max_steps)


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
    settings = GRPOSettings(
        **_shared_settings(config), **_group_relative_settings(config), returns=config.group.returns,
        constant_length=config.loss.constant_length or None)
    network = make_network(config, env.num_actions, critic=config.critic_weight > 0)
    return GRPO(env, network, settings, mesh, eval_max_steps=eval_max_steps)


def _text_settings(config: ConfigDict, settings_cls, value_head: bool = False, **extra):
    o = config.optim
    model = dict(config.model.to_dict(), d_ff=config.model.d_ff or None, value_head=value_head)
    return settings_cls(
        task=config.task.name, task_kwargs=tuple(sorted(config.task.kwargs.to_dict().items())),
        num_prompts=config.num_prompts,
        num_updates=config.total_steps // (config.num_prompts * extra.get("group_size", 1)),
        warmup_updates=o.warmup_updates, adam_eps=o.adam_eps, model_kwargs=tuple(sorted(model.items())),
        pass_k=config.eval.pass_k, xla_options=config_lib.xla_options(config), **extra)


def _text_sft(config: ConfigDict, mesh):
    from jaxrl.algos.text import TextSettings, TextSFT

    return TextSFT(_text_settings(config, TextSettings), mesh)


def _text_grpo(config: ConfigDict, mesh):
    import os

    from jaxrl.algos.text import TextGRPO, TextGRPOSettings, restore_text_params

    o, loss = config.optim, config.loss
    tokenizer = os.path.join(config.init_from, "tokenizer.json") if config.init_from else None
    settings = _text_settings(
        config, TextGRPOSettings, value_head=config.critic_weight > 0, **_group_relative_settings(config),
        tokenizer_path=tokenizer, oversample=config.group.oversample, top_k=config.sampling.top_k,
        reward_weights=tuple(config.reward_weights), kl=loss.kl, use_kl=loss.kl_coef > 0,
        num_epochs=o.num_epochs, num_minibatches=o.num_minibatches)
    init_params = restore_text_params(config.init_from, settings, mesh) if config.init_from else None
    return TextGRPO(settings, mesh, init_params)


def _text_hyperparams(name: str):
    from jaxrl.algos import text
    return getattr(text, name)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How a config becomes an algorithm: its static part (`build`) and its traced hyperparameters."""

    build: Callable  # (config, mesh) -> algorithm object
    hyperparams: Callable[[], type]  # the hyperparameter pytree class (imported on demand)
    keys: dict  # hyperparameter field -> the config key it is read from
    # Static choices that a hyperparameter's value also makes (e.g. critic_weight > 0 adds a value head):
    # two settings that differ in these cannot share a compiled program.
    static_of: Callable[[ConfigDict], tuple] = lambda config: ()


_GROUP_LOSS_KEYS = {"clip_high": "loss.clip_high", "ent_coef": "loss.ent_coef", "critic_weight": "critic_weight"}
_OPTIM_KEYS = {"learning_rate": "optim.learning_rate", "max_grad_norm": "optim.max_grad_norm",
               "weight_decay": "optim.weight_decay"}

ALGORITHMS = {
    "ppo": Recipe(_ppo, lambda: PPOHyperparams, {
        "learning_rate": "ppo.learning_rate", "gamma": "ppo.gamma", "gae_lambda": "ppo.gae_lambda",
        "clip_eps": "ppo.clip_eps", "vf_coef": "ppo.vf_coef", "ent_coef": "ppo.ent_coef",
        "max_grad_norm": "ppo.max_grad_norm"}),
    "grpo": Recipe(_grpo, lambda: GRPOHyperparams, {
        "learning_rate": "ppo.learning_rate", "gamma": "ppo.gamma", "clip_eps": "loss.clip_low",
        "vf_coef": "ppo.vf_coef", "max_grad_norm": "ppo.max_grad_norm", **_GROUP_LOSS_KEYS},
        static_of=lambda config: (config.critic_weight > 0,)),
    "text_sft": Recipe(_text_sft, lambda: _text_hyperparams("TextHyperparams"), _OPTIM_KEYS),
    "text_grpo": Recipe(_text_grpo, lambda: _text_hyperparams("TextGRPOHyperparams"), {
        **_OPTIM_KEYS, **_GROUP_LOSS_KEYS, "clip_low": "loss.clip_low", "kl_coef": "loss.kl_coef",
        "vf_coef": "loss.vf_coef", "temperature": "sampling.temperature", "top_p": "sampling.top_p"},
        static_of=lambda config: (config.critic_weight > 0, config.loss.kl_coef > 0)),
}


def hyperparams(config: ConfigDict):
    """The traced hyperparameters of `config` (float32 scalars), read from `ALGORITHMS[...].keys`."""
    recipe = ALGORITHMS[config.algorithm]
    fields = {field: config_lib.get_value(config, key) for field, key in recipe.keys.items()}
    return jax.tree.map(jnp.float32, recipe.hyperparams()(**fields))


def hyperparam_keys(config: ConfigDict) -> tuple[str, ...]:
    """The config keys a sweep can vary inside one compiled program."""
    return tuple(ALGORITHMS[config.algorithm].keys.values())


def static_signature(config: ConfigDict) -> str:
    """Equal for two configs exactly when they can share a compiled program (and its state layout): the
    config with its hyperparameter keys blanked, plus the static choices those keys make."""
    blank = config.copy_and_resolve_references()
    with blank.unlocked():
        for key in hyperparam_keys(config):
            config_lib.set_value(blank, key, None)
    return blank.to_json(sort_keys=True) + repr(ALGORITHMS[config.algorithm].static_of(config))


def build(config: ConfigDict, mesh):
    """(algorithm, hyperparams) for `config.algorithm`."""
    return ALGORITHMS[config.algorithm].build(config, mesh), hyperparams(config)


__all__ = ["ALGORITHMS", "GRPO", "GRPOHyperparams", "GRPOSettings", "NETWORKS", "PPO", "PPOHyperparams", "PPOSettings", "TrainState", "build"]
