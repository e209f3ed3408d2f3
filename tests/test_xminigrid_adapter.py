"""XLand-MiniGrid through `envs.make("xminigrid", ...)`: the same episodes as xminigrid's own auto-reset."""

import os

import pytest

import envs
from helpers import ROOT, auto_reset_parity

import xminigrid  # the `dev` extra installs it: a missing reference is a failure
from xminigrid.wrappers import GymAutoResetWrapper


@pytest.mark.parametrize("env_id, max_steps", [("MiniGrid-Empty-5x5", 12), ("MiniGrid-DoorKey-5x5", 15)])
def test_episodes_match_xminigrid_gym_auto_reset(env_id, max_steps):
    """xminigrid's `GymAutoResetWrapper` env and `envs.AutoReset(FromXMiniGrid)`: equal observations, rewards,
    done, terminated and truncated flags and next TimeSteps, with the same random actions, through goals
    reached, step limits and the resets after them."""
    ours = envs.make("xminigrid", env_id=env_id, params={"max_steps": max_steps})
    assert (ours.obs_dim, ours.num_actions, ours.max_episode_steps) == (7 * 7 * 2, 6, max_steps)
    env, params = xminigrid.make(env_id)
    params = params.replace(max_steps=max_steps)
    ref = GymAutoResetWrapper(env)

    def ref_step(key, timestep, action):
        timestep = ref.step(params, timestep, action)
        done = timestep.last()
        terminated = done & (timestep.discount == 0)
        # GymAutoResetWrapper keeps the ended step's type, reward and discount in the new episode's TimeStep;
        # its next step reads only the state, which is what the next states are compared on
        return ({"obs": timestep.observation, "reward": timestep.reward, "done": done, "terminated": terminated,
                 "truncated": done & ~terminated}, timestep)

    def ref_reset(key):
        timestep = ref.reset(params, key)
        return timestep.observation, timestep

    counts = auto_reset_parity(ours, ref_reset, ref_step, num_envs=16, num_steps=60,
                               ignore_state_fields=("step_type", "reward", "discount"))
    assert counts["truncated"] >= 16  # every env hit the step limit at least once
    if env_id == "MiniGrid-Empty-5x5":
        assert counts["terminated"] >= 1  # random walks reach the goal of the small empty room


def test_unknown_id_and_param_are_errors():
    with pytest.raises(ValueError, match="MiniGrid-Empty-8x8"):
        envs.make("xminigrid", env_id="MiniGrid-Emty-8x8")
    with pytest.raises(ValueError, match=r"no env params \['max_step'\]"):
        envs.make("xminigrid", env_id="MiniGrid-Empty-8x8", params={"max_step": 5})


def test_ppo_solves_the_small_empty_room(tmp_path):
    """End to end through the learners (sharded rollouts): PPO reaches the goal of MiniGrid-Empty-5x5 by the
    shortest path, return 1 - 0.9 * 5 / 100 = 0.955, within 64k env steps."""
    from jaxrl import config as config_lib, train

    config = config_lib.from_file(os.path.join(ROOT, "experiments", "gymnax_ppo.py:CartPole-v1"))
    config_lib.set_values(config, {"env.name": "xminigrid", "env.kwargs": {"env_id": "MiniGrid-Empty-5x5"},
                                   "total_steps": 65536, "log.every_steps": 32768, "log.progress_bar": False,
                                   "checkpoint.every_steps": 65536, "eval.episodes": 8})
    result = train.run(config, str(tmp_path / "run"))
    assert result.metrics[-1]["eval_return"] >= 0.9, result.metrics[-1]
