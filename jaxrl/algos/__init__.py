"""Algorithms by name: each module registers its recipe (`registry.register`) for `config.algorithm`.

    config = algos.default_config("ppo")   # every key PPO reads, with defaults
    algos.validate(config)                 # every check that needs no compiling (ValueError naming the key)
    algo, hyperparams = algos.build(config, mesh)

`build` returns an `engine.Algorithm` record (an algorithm as a value: its settings, mesh and functions) and
the traced hyperparameters. An experiment file can register an algorithm of its own with
`algos.register(name, algos.Recipe(...))`.
"""

# importing the algorithm modules registers them
from jaxrl.algos import grpo, ppo, q_learning, replay_actor_critic, reward_model, text  # noqa: F401
from jaxrl.algos.env_setup import NETWORKS, make_network
from jaxrl.algos.grpo import GRPO, GRPOHyperparams, GRPOSettings
from jaxrl.algos.ppo import PPO, PPOHyperparams, PPOSettings, TrainState
from jaxrl.algos.registry import (ALGORITHMS, Recipe, build, default_config, hyperparam_keys, hyperparams, recipe,
                                  register, resolve, saved_config, static_signature, validate)

__all__ = ["ALGORITHMS", "GRPO", "GRPOHyperparams", "GRPOSettings", "NETWORKS", "PPO", "PPOHyperparams", "PPOSettings",
           "Recipe", "TrainState", "build", "default_config", "hyperparam_keys", "hyperparams", "make_network", "recipe", "register",
           "resolve", "saved_config", "static_signature", "validate"]
