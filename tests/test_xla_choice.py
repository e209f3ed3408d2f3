"""config.xla_options "auto": the chunk program compiled with each candidate set of XLA options, timed on the
run's first state, the faster kept only when the states they reach are bitwise equal (`engine.ChunkRunner`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_same_state
from experiments import cartpole_ppo
from jaxrl import algos, config as config_lib, mesh as mesh_lib
from jaxrl.engine import algorithm as algorithm_lib, chunks


def test_the_fastest_program_is_kept_only_when_the_results_are_equal():
    seconds = [[0.30, 0.20, 0.25], [0.19, 0.40, 0.22], [0.50, 0.21, 0.60]]
    assert chunks.fastest_if_equal(seconds, equal=True) == 1  # the fastest timing of each, compared
    assert chunks.fastest_if_equal(seconds, equal=False) == 0  # XLA's defaults, whatever the timings
    assert chunks.fastest_if_equal([[0.1]], equal=True) == 0


def test_bitwise_equal_tells_apart_one_ulp_and_takes_nan_as_equal():
    x = jnp.arange(6, dtype=jnp.float32).reshape(2, 3) / 7
    tree = {"a": x, "b": jnp.array([1, 2], jnp.int32), "c": jnp.array([jnp.nan])}
    assert chunks.bitwise_equal(tree, jax.tree.map(jnp.copy, tree))
    nudged = dict(tree, a=x.at[1, 2].set(jnp.nextafter(x[1, 2], jnp.inf)))
    assert not chunks.bitwise_equal(tree, nudged)
    assert not chunks.bitwise_equal(tree, dict(tree, b=jnp.array([1, 3], jnp.int32)))


def _ppo(xla_options: str):
    config = cartpole_ppo.get_config()
    config.xla_options = xla_options
    config.num_envs, config.num_steps, config.total_steps = 4, 16, 4 * 16 * 8
    algos.validate(config)
    return algos.build(config, mesh_lib.make_mesh())


def test_auto_is_a_config_value():
    algo, _ = _ppo("auto")
    assert algo.settings.xla_options == config_lib.XLA_AUTO
    mixed = cartpole_ppo.get_config()
    mixed.xla_options = "auto,xla_cpu_enable_fast_math=false"
    with pytest.raises(ValueError, match="'auto' is not name=value"):
        algos.validate(mixed)
    # compiles without most optimisations (as this test session does) are not worth timing: XLA's defaults
    assert jax.config.values.get("jax_disable_most_optimizations")
    assert algo.xla_candidates() == ((),)


@pytest.mark.parametrize("results_equal", [True, False])
def test_auto_times_each_candidate_and_trains_as_the_default_does(monkeypatch, results_equal):
    candidates = ((), (("xla_cpu_enable_concurrency_optimized_scheduler", False),))
    algo, hp = _ppo("auto")
    monkeypatch.setattr(type(algo), "xla_candidates", lambda self: candidates)
    if not results_equal:  # as if the second program's state differed: the first (XLA's defaults) is kept
        monkeypatch.setattr(algorithm_lib, "bitwise_equal", lambda a, b: False)  # (where engine.Algorithm reads it)
    state = algo.init_seeds(0, 2)
    auto_state, _ = algo.run_chunk(state, hp, 3)
    choice = algo.xla_choice
    assert choice["candidates"] == candidates
    assert len(choice["seconds"]) == 2  # each candidate's fastest of 3 timings
    assert choice["equal"] is results_equal
    if results_equal:  # the faster of the two (by their fastest timings)
        assert choice["options"] == candidates[int(np.argmin(choice["seconds"]))]
    else:
        assert choice["options"] == ()
    # the choice's time counts as compiling: at least the 3 timings of each candidate (no less than its fastest)
    assert algo.compile_seconds >= 3 * sum(choice["seconds"])
    default, _ = _ppo("")
    default_state, _ = default.run_chunk(default.init_seeds(0, 2), hp, 3)
    assert_same_state(auto_state, default_state)
    algo.run_chunk(auto_state, hp, 1)  # chosen once: no more timing
    assert algo.xla_choice is choice


def test_the_choice_is_told_in_one_line():
    candidates = config_lib.XLA_AUTO_CHOICES
    kept = chunks.describe_xla_choice({"options": candidates[1], "candidates": candidates, "equal": True,
                                       "seconds": [0.0514, 0.0457]})
    assert kept == ("xla_options auto: kept xla_cpu_experimental_ynn_fusion_type= (one update: XLA's defaults "
                    "0.0514 s, xla_cpu_experimental_ynn_fusion_type= 0.0457 s)")
    differed = chunks.describe_xla_choice({"options": (), "candidates": candidates, "equal": False,
                                           "seconds": [0.0614, 0.0544]})
    assert differed.startswith("xla_options auto: kept XLA's defaults (one update: XLA's defaults 0.0614 s")
    assert differed.endswith("the states after it differed, so the first is kept whatever the times)")
