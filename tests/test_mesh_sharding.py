"""The update is written for a device mesh: 8 (fake CPU) devices give the same result as 1."""

import json

import numpy as np

import pytest

# Recurrent MAPPO: sequences dealt to minibatches, hidden states and the global state per device.
SMAX_MAPPO = """
import sys; sys.path.insert(0, "tests")
from helpers import small_smax_config
config = small_smax_config("3m", num_envs=16, num_steps=16)
config.total_steps, config.optim.num_minibatches = 16 * 16 * 6, 2  # 2 envs x 3 agents per device, 2 minibatches
# One seed: float noise (summation order differs with the per-device batch) can flip a relu or clip
# decision for some other seeds' data, and Adam then turns that into visible parameter differences.
num_seeds = 1
"""

# GRPO: groups (not single envs) split over devices, sequence-level losses aggregated over devices.
CARTPOLE_GRPO = """
import sys; sys.path.insert(0, "tests")
from helpers import small_grpo_config
config = small_grpo_config("cartpole_grpo", num_envs=16, num_steps=32, group_size=2, **{"loss.aggregate": "sequence"})
num_seeds = 2
"""

SMAX_GRPO = """
import sys; sys.path.insert(0, "tests")
from helpers import small_grpo_config
config = small_grpo_config("smax_grpo", "3m", num_envs=16, num_steps=16, group_size=2,
                      **{"loss.ratio": "sequence", "group.returns": "to_go", "loss.critic_weight": 0.5})
num_seeds = 1  # (see SMAX_MAPPO)
"""

# Feed-forward PPO with two seeds on the runs axis, continuous actions (a Gaussian policy), observation and
# reward statistics combined over devices.
PENDULUM_NORMALIZED = """
import sys; sys.path.insert(0, "tests")
from helpers import load_experiment, set_keys
config = load_experiment("gymnax_ppo", "Pendulum-v1")
config.unlock()
set_keys(config, {"num_envs": 16, "num_steps": 32, "total_steps": 16 * 32 * 6, "optim.num_minibatches": 4,
                  "normalize.obs": True, "normalize.reward": True})
num_seeds = 2
"""

CODE = r"""
import json, sys, jax, numpy as np
from jaxrl import algos, mesh as mesh_lib, normalization
sys.path.insert(0, "tests")
from helpers import set_keys

assert len(jax.devices()) == 8
""" + "{setup}" + r"""
params = {}
for devices in (1, 8):
    if devices == 8:  # (a setup may change a key for the 8-device run, e.g. a mesh option)
        config = set_keys(config, globals().get("on_eight_devices", {}))
    algo, hp = algos.build(config, mesh_lib.make_mesh(devices, split_actor=config.mesh.get("split_actor", False)))
    state = algo.init_seeds(0, num_seeds)
    state = globals().get("prepare", lambda algo, state: state)(algo, state)
    state, metrics = algo.run_chunk(state, hp, 3)
    state, metrics = algo.run_chunk(state, hp, 3)
    globals().get("after", lambda algo, devices: None)(algo, devices)
    if devices == 8 and hasattr(state, "obs"):  # environments (text algorithms split prompts per update)
        assert len(state.obs.sharding.device_set) == 8, state.obs.sharding
        local = 16 // algo.mesh.shape["data"]  # 16 envs / 8 devices (/ 4 with actor and learner devices)
        assert state.obs.sharding.shard_shape(state.obs.shape)[1] == local
        for leaf in jax.tree.leaves(state.carry):
            assert leaf.sharding.shard_shape(leaf.shape)[1] == local
    # Running statistics' means are compared in units of their std: their float32 sums over 4,096 vs 8 x 512
    # observations round differently, by ~1e-6 of the data's scale, whatever the mean itself is.
    standardised = jax.tree.map(
        lambda m: m.replace(mean=m.mean * jax.lax.rsqrt(normalization.variance(m))) if isinstance(m, normalization.Moments)
        else m, state.params, is_leaf=lambda m: isinstance(m, normalization.Moments))
    memory = getattr(state, "memory", None)  # rollout strategies' memory (text GRPO)
    params[devices] = [np.asarray(x, np.float64) for x in jax.tree.leaves((standardised, memory))]
    params[f"{devices}_metrics"] = {k: np.asarray(v).tolist() for k, v in metrics.items()}
diffs = [float(np.max(np.abs(a - b), initial=0.0)) for a, b in zip(params[1], params[8])]  # (a leaf may be empty)
scale = [float(np.max(np.abs(a), initial=0.0)) for a in params[1]]
print(json.dumps({"diffs": diffs, "scale": scale, "m1": params["1_metrics"], "m8": params["8_metrics"]}))
"""


def one_and_eight_devices(python_subprocess, setup: str) -> dict:
    """Train `setup`'s config on 1 and on 8 devices; assert equal parameters; return both runs' metrics."""
    out = python_subprocess(CODE.replace("{setup}", setup), devices=8)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for diff, scale in zip(result["diffs"], result["scale"]):
        assert diff <= 1e-5 * max(1.0, scale), result["diffs"]
    return result


# Cleanba's lag-one PPO on gymnasium's CartPole stepped on the host: on 8 devices, 4 actor devices step the envs
# (host callbacks) while 4 learner devices learn from the rollout before: the same run as on 1 device.
GYMNASIUM_LAG_ONE = """
import sys; sys.path.insert(0, "tests")
from helpers import load_experiment, set_keys
config = set_keys(load_experiment("gymnasium_ppo", "CartPole-v1"), {"num_envs": 16, "num_steps": 16,
    "total_steps": 16 * 16 * 6, "optim.num_minibatches": 2, "actor.max_staleness": 1})
on_eight_devices = {"mesh.split_actor": True}
num_seeds = 2

def after(algo, devices):  # (8 devices: the actors' and the learners' programs ran in two threads)
    assert (algo._threaded is not None) == (devices == 8)
"""

# GRPO's Generate strategies for environments: the leader's noise shared (prefixes, all agents but one).
CARTPOLE_GRPO_VINE = CARTPOLE_GRPO + """
config.rollout.generate = "vine"
"""
SMAX_GRPO_COUNTERFACTUAL = SMAX_GRPO + """
config.rollout.generate = "counterfactual"
"""


# CARTPOLE_GRPO's sequence-level aggregation runs within the vine setup, and its independent groups in SMAX_GRPO.
@pytest.mark.parametrize("setup", [SMAX_MAPPO, SMAX_GRPO, PENDULUM_NORMALIZED, CARTPOLE_GRPO_VINE,
                                   SMAX_GRPO_COUNTERFACTUAL, GYMNASIUM_LAG_ONE],
                         ids=["smax_mappo_gru", "smax_grpo_gru", "pendulum_normalized", "cartpole_grpo_vine",
                              "smax_grpo_counterfactual", "gymnasium_lag_one_split"])
def test_eight_devices_match_one_device(python_subprocess, setup):
    result = one_and_eight_devices(python_subprocess, setup)
    # Episode statistics are summed over devices: the same episodes end in both runs.
    assert result["m1"]["episodes"] == result["m8"]["episodes"]
    assert abs(sum(result["m1"]["episode_return_sum"]) - sum(result["m8"]["episode_return_sum"])) < 1e-3
    # Gradients are averaged, not summed, over devices (clipping and Adam would hide a factor of 8 in the
    # parameters for a while, not in the gradient norm).
    np.testing.assert_allclose(result["m8"]["grad_norm"], result["m1"]["grad_norm"], rtol=1e-4)


def test_groups_that_do_not_divide_over_devices_fail_before_compiling(python_subprocess):
    code = r"""
import sys; sys.path.insert(0, "tests")
from helpers import small_grpo_config as small_config
from jaxrl import algos, mesh as mesh_lib
config = small_config(num_envs=24, group_size=4)  # 24 envs divide over 8 devices, 6 groups do not
try:
    algos.build(config, mesh_lib.make_mesh(8))
except ValueError as e:
    print("ERROR", e)
"""
    out = python_subprocess(code, devices=8)
    assert out.returncode == 0, out.stderr
    assert "ERROR the number of groups (num_envs / group_size)=6 does not divide over the 8 devices of the data axis" in out.stdout


# Text: prompts split over devices; sampling keys drawn per prompt from its global index.
TEXT_SFT = """
import sys; sys.path.insert(0, "tests")
from helpers import tiny_sft_config
config = tiny_sft_config()
config.num_prompts = 16
num_seeds = 2
"""

TEXT_GRPO = """
import sys; sys.path.insert(0, "tests")
from helpers import load_experiment
config = load_experiment("text_grpo", "addition")
config.num_prompts, config.group.size, config.group.oversample = 16, 4, 2
config.model.num_layers, config.model.d_model, config.model.num_heads = 1, 64, 2
config.optim.num_minibatches, config.total_steps = 2, 16 * 4 * 6
num_seeds = 1  # (text SFT's case has two seeds on the runs axis; each text GRPO case one, as the sampling is the point)
"""

# Every rollout strategy at once (dynamic sampling is TEXT_GRPO_PARTIAL's base), on a pool of 8 problems (revisited
# often). The correct-answer memory starts full (the reference answers, drawn by a policy that gave each token
# probability 1/2) so that an untrained model's all-wrong groups get replays; hints rise after one failure. Each update
# learns from the batch sampled two updates before, with AReaL's decoupled objective; on 8 devices, 4 actors sample
# while 4 learners learn (their queue split over the data axis as the actors sampled it): the same run. AHPO's expert
# term learns the reference answers of the groups at pass rate <= 0.5 (one row per prompt in the queue and the loss).
TEXT_GRPO_STRATEGIES = TEXT_GRPO + """
config.rollout.filter, config.rollout.replay, config.rollout.pool_size = "rank_ties,success_predictor", "curriculum,correct,hints", 8
config.loss.expert_coef, config.loss.expert_below = 0.1, 0.5
config.rollout.options.curriculum.every = 2
config.rollout.control, config.rollout.generate = "variance_budget", "tree"
config.rollout.options.tree.min_entropy = 1.0  # branches split at their first uncertain token
config.rollout.options.hints.patience = 1
config.actor.max_staleness, config.loss.correction = 2, "decoupled"
on_eight_devices = {"mesh.split_actor": True}

def prepare(algo, state):
    import jax, jax.numpy as jnp
    grpo = algo.parts
    answers = grpo.task.reference_answers(grpo.pool, grpo.vocab)
    mask = (answers != grpo.vocab.pad_id).astype(jnp.float32)  # the answer and its EOS
    full = {"tokens": answers, "log_probs": jnp.log(0.5) * mask, "mask": mask,
            "rewards": jnp.ones((8, 2)), "stored": jnp.ones(8, bool)}
    memory = dict(state.memory, correct={k: jnp.broadcast_to(v, state.memory["correct"][k].shape)
                                         for k, v in full.items()})
    return jax.device_put(state.replace(memory=memory), algo.state_shardings(state))
"""


# Partial rollouts with hints (which a resumed group keeps) and pruning by a value head from the second update,
# balanced (ARRoL: each group keeps one going member on each side of predicted success 1/2): decoding stops on every
# device at once. Each update learns from the batch before (actor.max_staleness=1), and on
# 8 devices 4 actors decode while 4 learners learn: a carried sequence goes on with the newer parameters the
# actors received (in-flight weight updates), the same on 1 device and on 8.
TEXT_GRPO_PARTIAL = TEXT_GRPO + """
config.rollout.control, config.rollout.replay, config.rollout.pool_size = "partial,prune", "hints", 8
config.rollout.options.hints.patience = 1
config.loss.critic_weight, config.rollout.options.prune.warmup, config.rollout.options.prune.below = 0.5, 1, 0.0
config.rollout.options.prune.balance = 1
config.actor.max_staleness = 1
on_eight_devices = {"mesh.split_actor": True}
"""


# Multi-turn episodes with tools (table lookups, the calculator), GiGPO's step groups and turn-level ratios (Rank-GRPO),
# beside a turn-level critic:
# episodes split over devices by prompt, each drawn from its prompt's key; learned one update late with AReaL's
# decoupled objective, on 8 devices by 4 learners while 4 actors play the next episodes.
TEXT_GRPO_TURNS = """
import sys; sys.path.insert(0, "tests")
from helpers import load_experiment
config = load_experiment("text_grpo", "lookup")
config.num_prompts, config.group.size, config.group.oversample = 16, 4, 2
config.model.num_layers, config.model.d_model, config.model.num_heads = 1, 64, 2
config.optim.num_minibatches, config.total_steps = 2, 16 * 4 * 6
config.advantage.estimator, config.loss.critic_weight, config.loss.ratio = "gigpo", 0.5, "turn"
config.actor.max_staleness, config.loss.correction = 1, "decoupled"
on_eight_devices = {"mesh.split_actor": True}
num_seeds = 1
"""


# A reward model: the sampler's completions split over devices by prompt, the pointwise loss averaged over all of
# them (an untrained sampler's completions are all wrong: pairs would leave nothing to learn).
TEXT_REWARD_MODEL = """
import sys; sys.path.insert(0, "tests")
from helpers import load_experiment
config = load_experiment("text_reward_model", "addition")
config.num_prompts, config.group.size, config.reward_model.objective = 16, 4, "generative"  # (its critiques too)
config.model.num_layers, config.model.d_model, config.model.num_heads = 1, 64, 2
config.total_steps = 16 * 4 * 6
num_seeds = 1
"""


# (plain text GRPO, dynamic sampling on fresh problems, is the base of the strategies' and the partial rollouts' cases)
@pytest.mark.parametrize("setup", [TEXT_SFT, TEXT_GRPO_STRATEGIES, TEXT_GRPO_PARTIAL, TEXT_GRPO_TURNS, TEXT_REWARD_MODEL],
                         ids=["text_sft", "text_grpo_strategies_stale_split", "text_grpo_partial_stale_split",
                              "text_grpo_multi_turn", "text_reward_model"])
def test_text_algorithms_on_eight_devices_match_one_device(python_subprocess, setup):
    result = one_and_eight_devices(python_subprocess, setup)
    # The same samples were drawn and scored, and gradients are averaged (not summed) over devices.
    for key in ("reward_correct", "tokens", "completion_length") if "tokens" in result["m1"] else ("loss",):
        np.testing.assert_allclose(result["m8"][key], result["m1"][key], rtol=1e-5)
    np.testing.assert_allclose(result["m8"]["grad_norm"], result["m1"]["grad_norm"], rtol=1e-4)
    if setup is TEXT_GRPO_STRATEGIES:  # the strategies acted, the same way on 1 and 8 devices
        for key in ("replayed", "replay_weight", "hinted", "hint_tier", "ranked", "sampled_tokens", "predictor_loss",
                    "curriculum_level", "probe_accuracy",
                    "predictor_error", "budget_skipped", "budget_most_groups", "expert_share", "expert_nll"):
            np.testing.assert_allclose(result["m8"][key], result["m1"][key], rtol=1e-5)
        assert min(result["m1"]["replayed"]) > 0 and max(result["m1"]["hinted"]) > 0, result["m1"]
        assert max(result["m1"]["expert_share"]) > 0 and min(result["m1"]["expert_nll"]) > 0, result["m1"]
    if setup is TEXT_GRPO_PARTIAL:
        for key in ("decode_steps", "resumed", "carried", "resumed_candidates", "sampled_tokens", "hinted", "pruned"):
            np.testing.assert_allclose(result["m8"][key], result["m1"][key], rtol=1e-5)
        assert max(result["m1"]["resumed"]) > 0 and max(result["m1"]["hinted"]) > 0, result["m1"]
        assert 0 < max(result["m1"]["pruned"]) < 1, result["m1"]
    if setup is TEXT_GRPO_TURNS:
        for key in ("turns", "tool_calls", "tool_error_rate", "solved", "value_loss"):
            np.testing.assert_allclose(result["m8"][key], result["m1"][key], rtol=1e-5)
        assert min(result["m1"]["turns"]) > 1 and max(result["m1"]["tool_calls"]) > 0, result["m1"]


def test_a_model_axis_is_refused_where_no_model_is_split(python_subprocess):
    """mesh.model_devices splits a pretrained language model: environment algorithms (PPO, GRPO on envs) and a
    small text model trained from scratch say so before compiling, and a size that does not divide the devices
    is named."""
    code = r"""
import sys; sys.path.insert(0, "tests")
from helpers import small_cartpole, small_grpo_config, tiny_sft_config
from jaxrl import algos, mesh as mesh_lib
for config in (small_cartpole(), small_grpo_config(), tiny_sft_config()):
    try:
        algos.build(config, mesh_lib.make_mesh(4, model_devices=2))
    except ValueError as e:
        print("ERROR", e)
try:
    mesh_lib.make_mesh(4, model_devices=3)
except ValueError as e:
    print("ERROR", e)
mesh = mesh_lib.make_mesh(4, model_devices=2)
print("AXES", dict(mesh.shape))
"""
    out = python_subprocess(code, devices=4)
    assert out.returncode == 0, out.stderr
    errors = [line for line in out.stdout.splitlines() if line.startswith("ERROR")]
    assert errors[:2] == ["ERROR mesh.model_devices=2 splits a pretrained language model's layers over devices; "
                          "environment algorithms have none: leave it at 1"] * 2
    assert errors[2] == ("ERROR mesh.model_devices=2 splits a pretrained language model's layers over devices; "
                         "this run trains a small model from scratch: leave it at 1")
    assert errors[3] == ("ERROR mesh.model_devices=3 does not divide the 4 devices left for each run's data groups "
                         "(mesh.num_devices / mesh.run_devices)")
    assert "AXES {'runs': 1, 'data': 2, 'model': 2}" in out.stdout
