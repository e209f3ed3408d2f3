"""Algorithms by name. Each algorithm module registers a `Recipe` for its `config.algorithm` name; the
training loop, sweeps and benchmarks go through `validate`, `build` and `hyperparams` here.

A recipe says which config keys become the algorithm's traced hyperparameters (`keys`): those are the keys a
sweep varies inside one compiled program. Every other key is static.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from ml_collections import ConfigDict

from jaxrl import config as config_lib, knobs


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How a config becomes an algorithm."""

    build: Callable  # (config, mesh) -> the `jaxrl.engine.Algorithm` record
    hyperparams: type  # the traced hyperparameters' pytree class
    # hyperparameter field -> the config key it is read from; None: the class's traced knobs (`jaxrl.knobs`)
    keys: dict | None = None
    check: Callable[[ConfigDict], None] = lambda config: None  # the algorithm's own checks (ValueError naming the key)
    defaults: Callable[[], ConfigDict] = ConfigDict  # every key the algorithm reads, with defaults (`default_config`)
    # Static choices that a hyperparameter's value also makes (e.g. critic_weight > 0 adds a value head):
    # two settings that differ in these cannot share a compiled program.
    static_of: Callable[[ConfigDict], tuple] = lambda config: ()
    # (config, mesh, run_dir) -> the algorithm of a saved run, from the files its `write_files` left in
    # run_dir (e.g. a tokenizer) rather than from what its config points to; None: `build` serves.
    rebuild: Callable | None = None
    # config -> the config as it trains, with derived keys filled in (e.g. PPO's `scale.num_envs`); must
    # return a config it maps to itself, since a saved run's config goes through it again on resuming
    resolve: Callable[[ConfigDict], ConfigDict] = lambda config: config

    def __post_init__(self):
        if self.keys is None:
            object.__setattr__(self, "keys", knobs.traced_keys(self.hyperparams))


ALGORITHMS: dict[str, Recipe] = {}


def register(name: str, recipe: Recipe) -> Recipe:
    """Make `config.algorithm = name` build with `recipe` (an experiment file may register its own)."""
    ALGORITHMS[name] = recipe
    return recipe


def recipe(name: str) -> Recipe:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown config.algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}")
    return ALGORITHMS[name]


def default_config(name: str) -> ConfigDict:
    """The config of algorithm `name` with every key at its default (unlocked: an experiment sets its own)."""
    config = recipe(name).defaults()
    config.algorithm = name
    return config


def saved_config(path: str):
    """A saved run's (or exported policy's) config.json, with every key its algorithm declares today that it lacks
    (added since it was saved) at its default: the behaviour the run had, as the key did not exist."""
    config = config_lib.load(path)

    def fill(saved: dict, defaults: dict) -> dict:
        out = dict(saved)
        for key, value in defaults.items():
            if key not in out:
                out[key] = value
            elif isinstance(value, dict) and isinstance(out[key], dict):
                out[key] = fill(out[key], value)
        return out

    filled = ConfigDict(fill(config.to_dict(), default_config(config.algorithm).to_dict()))
    filled.lock()
    return filled


def validate(config: ConfigDict) -> None:
    """Check everything that can be checked without compiling; raise ValueError naming the key."""
    algorithm = recipe(config.algorithm)
    config_lib.validate_shared(config)
    algorithm.check(config)


def resolve(config: ConfigDict) -> ConfigDict:
    """The config as it trains (`Recipe.resolve`); validate it first, since the rules assume valid keys."""
    return recipe(config.algorithm).resolve(config)


def hyperparams(config: ConfigDict):
    """The traced hyperparameters of `config` (float32 scalars), read from the recipe's `keys`."""
    algorithm = recipe(config.algorithm)
    fields = {field: config_lib.get_value(config, key) for field, key in algorithm.keys.items()}
    return jax.tree.map(jnp.float32, algorithm.hyperparams(**fields))


def hyperparam_keys(config: ConfigDict) -> tuple[str, ...]:
    """The config keys a sweep can vary inside one compiled program."""
    return tuple(recipe(config.algorithm).keys.values())


def static_signature(config: ConfigDict) -> str:
    """Equal for two configs exactly when they can share a compiled program (and its state layout): the
    config with its hyperparameter keys blanked, plus the static choices those keys make."""
    blank = config.copy_and_resolve_references()
    with blank.unlocked():
        for key in hyperparam_keys(config):
            config_lib.set_value(blank, key, None)
    # A weight decay of 0 leaves the decay out of the optimiser (and its state): another program.
    static = (config.optim.weight_decay > 0, *recipe(config.algorithm).static_of(config))
    return blank.to_json(sort_keys=True) + repr(static)


def build(config: ConfigDict, mesh, run_dir: str | None = None):
    """(the `engine.Algorithm`, hyperparams) for `config.algorithm`; with `run_dir`, the algorithm of the run
    saved there (`Recipe.rebuild`)."""
    chosen = recipe(config.algorithm)
    if run_dir is not None and chosen.rebuild is not None:
        return chosen.rebuild(config, mesh, run_dir), hyperparams(config)
    return chosen.build(config, mesh), hyperparams(config)
