"""An algorithm defined outside jaxrl registers itself and trains through the whole loop (`jaxrl.train.run`):
a policy gradient on a K-armed Gaussian bandit, on the engine's optimiser, gradient step and chunk compiler."""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from flax import struct
from ml_collections import ConfigDict

from jaxrl import algos, config as config_lib, engine, mesh as mesh_lib, train
from jaxrl.mesh import DATA_AXIS

ARM_MEANS = (0.1, 0.9, 0.4)


@struct.dataclass
class BanditHyperparams:
    learning_rate: float = 0.1
    max_grad_norm: float = 1.0


@struct.dataclass
class BanditState:
    params: Any  # {"logits": [K]}
    opt_state: Any
    key: jax.Array
    update_step: jax.Array


@dataclasses.dataclass(frozen=True)
class BanditSettings:
    num_pulls: int  # per update, over all devices
    num_updates: int

    @property
    def batch_size(self) -> int:
        return self.num_pulls


def bandit_optimizer(hp):
    return engine.make_optimizer(hp.learning_rate, hp.max_grad_norm, 1e-8)


def bandit_init(key):
    params = {"logits": jnp.zeros(len(ARM_MEANS))}
    return BanditState(params, bandit_optimizer(BanditHyperparams()).init(params), key, jnp.int32(0))


def bandit_update(settings: BanditSettings, mesh, state, hp):
    """REINFORCE with the mean reward as baseline; pulls split over the mesh's data axis."""
    key, pull_key, noise_key = jax.random.split(state.key, 3)
    local = settings.num_pulls // mesh.shape[DATA_AXIS]
    arms = jax.random.categorical(pull_key, state.params["logits"], shape=(local,))
    rewards = jnp.asarray(ARM_MEANS)[arms] + 0.1 * jax.random.normal(noise_key, (local,))

    def loss(params, batch, hp):
        log_probs = jax.nn.log_softmax(params["logits"])[batch["arms"]]
        advantages = batch["rewards"] - engine.global_mean(batch["rewards"])
        return -jnp.mean(log_probs * advantages), {"reward": jnp.mean(batch["rewards"])}

    params, opt_state, aux = engine.gradient_step(loss, bandit_optimizer(hp), state.params, state.opt_state,
                                                  {"arms": arms, "rewards": rewards}, hp)
    best = jax.nn.softmax(params["logits"])[jnp.argmax(jnp.asarray(ARM_MEANS))]
    return BanditState(params, opt_state, key, state.update_step + 1), {**aux, "best_arm_probability": best}


def bandit_evaluate(params, key, num):
    return {"eval_return": jnp.asarray(ARM_MEANS)[jnp.argmax(params["logits"], axis=-1)]}


def bandit_config() -> ConfigDict:
    config = config_lib.base_config()
    config.update(ConfigDict({"num_pulls": 64}))
    config.optim.learning_rate = 0.1
    return config


def check_bandit_config(config):
    config_lib.positive(config, "num_pulls")


def build_bandit(config, mesh):
    settings = BanditSettings(config.num_pulls, config.total_steps // config.num_pulls)
    return engine.Algorithm(settings, mesh, init=bandit_init, update=functools.partial(bandit_update, settings, mesh),
                            evaluate=bandit_evaluate, actor=lambda params: params)


@pytest.fixture
def registered():
    algos.register("bandit_pg", algos.Recipe(
        build_bandit, BanditHyperparams, {"learning_rate": "optim.learning_rate",
                                          "max_grad_norm": "optim.max_grad_norm"},
        check_bandit_config, defaults=bandit_config))
    yield
    del algos.ALGORITHMS["bandit_pg"]


def test_an_algorithm_registered_outside_jaxrl_trains_through_the_loop(registered, tmp_path):
    config = algos.default_config("bandit_pg")
    config.experiment, config.num_seeds, config.total_steps = "bandit", 2, 64 * 60
    config.log.every_steps, config.log.progress_bar = 64 * 20, False
    config.lock()
    assert isinstance(algos.build(config, mesh_lib.make_mesh())[0], engine.Algorithm)

    result = train.run(config, str(tmp_path))

    rows = result.metrics
    assert [row["update"] for row in rows] == [20, 40, 60]
    # Learning happened: the best arm's probability rose from 1/3 for both seeds, and greedy picks it.
    assert rows[0]["best_arm_probability"] < rows[-1]["best_arm_probability"]
    assert rows[-1]["best_arm_probability"] > 0.9
    assert rows[-1]["eval_return"] == pytest.approx(max(ARM_MEANS))
    assert (tmp_path / "metrics.jsonl").exists()


def test_its_checks_run_before_building(registered):
    config = algos.default_config("bandit_pg")
    config.num_pulls = 0
    with pytest.raises(ValueError, match="num_pulls must be a positive integer"):
        algos.validate(config)
