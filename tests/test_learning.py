"""Learning that actually happens (marked slow; CI runs them)."""

import pytest

from experiments import cartpole_ppo
from jaxrl import train


@pytest.mark.slow
def test_main_cartpole_config_reaches_475_within_500k_steps(tmp_path):
    config = cartpole_ppo.get_config()
    config.log.progress_bar = False
    assert config.total_steps == 500_000
    result = train.run(config, str(tmp_path / "run"))
    last = result.metrics[-1]
    assert last["env_steps"] <= 500_000
    assert last["episode_return"] >= 475, last
    assert last["eval_return"] >= 475, last
    first = next(r for r in result.metrics if r.get("episode_return") is not None)
    assert first["episode_return"] < 200, "the curve should start low: learning happened in this run"
