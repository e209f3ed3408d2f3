"""jaxrl's PPO, set to Brax's rules, against Brax's own PPO loss (`brax.training.agents.ppo.losses`) on one rollout.

Brax's rules as jaxrl settings: advantages from the current critic (`returns.gae_values=current`) by V-trace's
form (`advantage.estimator=vtrace`), the update on observations normalised by statistics that include the rollout
(`normalize.obs_stats=updated`, no clipping), softplus stds, lecun-uniform layers, and a time limit that ends
returns (no truncation bootstrap; a 20-step rollout meets none). The network parameters are mapped leaf for
leaf into Brax's `make_ppo_networks` layout; the running statistics into Brax's `RunningStatisticsState`.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from brax.training import types  # the `dev` extra installs brax: a missing reference is a failure
from brax.training.acme import running_statistics
from brax.training.agents.ppo import losses, networks
from jax.sharding import PartitionSpec as P

from helpers import build, load_experiment, set_keys
from jaxrl import normalization
from jaxrl.algos.env_policy import trainable
from jaxrl.engine.minibatches import deal_minibatches
from jaxrl.mesh import RUN_AXIS

NUM_ENVS, NUM_STEPS, HIDDEN = 8, 20, (32, 32)


def brax_rules_config():
    config = load_experiment("brax_ppo", "halfcheetah")
    config.unlock()
    return set_keys(config, {
        "env.kwargs.backend": "spring", "num_envs": NUM_ENVS, "num_steps": NUM_STEPS,
        "total_steps": NUM_ENVS * NUM_STEPS * 4, "optim.num_epochs": 1, "optim.num_minibatches": 1,
        "network.hidden_sizes": HIDDEN, "returns.gae_values": "current", "advantage.estimator": "vtrace",
        "normalize.obs_stats": "updated", "normalize.obs_clip": 1e6, "network.kernel_init": "lecun_uniform",
        # std = softplus(head output) + 0.001 with the head's std outputs starting at 0, as Brax's policy starts
        "network.std_transform": "softplus", "network.init_log_std": math.log(math.log(2.0) + 0.001),
        "returns.bootstrap_truncation": False, "loss.ent_coef": 0.0, "log.progress_bar": False})


def jaxrl_gradient(algo, hp, state):
    """The next update's rollout, statistics and first gradient (one epoch of one minibatch), for seed 0."""
    def one_seed(st, hp):
        _, rollout_key, epoch_key = jax.random.split(st.key, 3)
        after, traj, _ = algo.parts.rollout(st, rollout_key)
        units, (obs_norm, _) = algo.parts.units(st, hp, after, traj)
        batch = jax.tree.map(lambda x: x[0], deal_minibatches(epoch_key, units, 1))
        (loss, aux), grads = jax.value_and_grad(algo.parts.loss, has_aux=True)(trainable(st.params), batch, hp)
        return loss, aux, grads, traj, after[1], obs_norm

    fn = jax.shard_map(jax.vmap(one_seed, in_axes=(0, None)), mesh=algo.mesh,
                       in_specs=(algo.state_specs(state), P()), out_specs=P(RUN_AXIS), check_vma=False)
    return jax.tree.map(lambda x: x[0], jax.jit(fn)(state, hp))


def brax_layers(tree):
    """jaxrl's MLP {Dense_0, ..., Dense_k} -> Brax's MLP {"params": {hidden_0, ..., hidden_k}}."""
    return {"params": {name.replace("Dense_", "hidden_"): leaf for name, leaf in tree.items()}}


def brax_statistics(moments):
    return running_statistics.RunningStatisticsState(mean=moments.mean, std=jnp.sqrt(normalization.variance(moments)),
                                                     count=moments.count, summed_variance=moments.m2)


def test_ppo_loss_and_gradient_equal_brax_s_on_the_same_rollout():
    config = brax_rules_config()
    algo, hp, state = build(config)
    loss, aux, grads, traj, obs_after, obs_norm = jaxrl_gradient(algo, hp, state)

    obs_dim, action_dim = traj.obs.shape[-1], traj.action.shape[-1]
    net = networks.make_ppo_networks(obs_dim, action_dim, preprocess_observations_fn=running_statistics.normalize,
                                     policy_hidden_layer_sizes=HIDDEN, value_hidden_layer_sizes=HIDDEN,
                                     activation=nn.swish)
    params = jax.tree.map(lambda x: x[0], state.params)
    brax_params = losses.PPONetworkParams(policy=brax_layers(params["params"]["actor"]),
                                          value=brax_layers(params["params"]["critic"]))
    batch_major = lambda x: jnp.swapaxes(x[:, :, 0], 0, 1)  # noqa: E731  [T, n, 1, ...] -> [n, T, ...]
    observation = batch_major(traj.obs)

    # acting: the rollout's log-probabilities and values are those of Brax's networks with the statistics
    # the rollout acted with
    acted_with = brax_statistics(params["obs_norm"]["obs"])

    @jax.jit  # (Brax's side in one program: run op by op, it costs more than compiling)
    def brax_acting(brax_params, observation, action):
        logits = net.policy_network.apply(acted_with, brax_params.policy, observation)
        log_prob = net.parametric_action_distribution.log_prob(logits, action)
        return logits, log_prob, net.value_network.apply(acted_with, brax_params.value, observation)

    logits, log_prob, value = brax_acting(brax_params, observation, batch_major(traj.action))
    np.testing.assert_allclose(log_prob, batch_major(traj.log_prob), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(value, batch_major(traj.value), rtol=1e-4, atol=1e-4)

    # the update: loss and gradient on the same data, with the statistics that include the rollout
    next_obs = jnp.concatenate([traj.obs[1:], obs_after[None]], 0)
    data = types.Transition(
        observation=observation, action=batch_major(traj.action), reward=batch_major(traj.reward),
        discount=1.0 - batch_major(traj.done.astype(jnp.float32)), next_observation=batch_major(next_obs),
        extras={"state_extras": {"truncation": jnp.zeros((NUM_ENVS, NUM_STEPS))},
                "policy_extras": {"raw_action": batch_major(traj.action), "log_prob": batch_major(traj.log_prob),
                                  "value": batch_major(traj.value), "distribution_params": logits}})
    updated = brax_statistics(obs_norm["obs"])

    def brax_loss(p):
        return losses.compute_ppo_loss(p, updated, data, jax.random.PRNGKey(0), net, entropy_cost=0.0,
                                       discounting=config.returns.gamma, reward_scaling=1.0,
                                       gae_lambda=config.returns.gae_lambda,
                                       clipping_epsilon=config.loss.clip_low, normalize_advantage=True,
                                       vf_coefficient=config.loss.vf_coef,
                                       clipping_epsilon_value=config.loss.value_clip)

    (brax_total, brax_aux), brax_grads = jax.jit(jax.value_and_grad(brax_loss, has_aux=True))(brax_params)
    assert float(aux["approx_kl"]) > 0  # the updated statistics move the policy: the ratios are not all one
    np.testing.assert_allclose(loss, brax_total, rtol=1e-5)
    np.testing.assert_allclose(aux["policy_loss"], brax_aux["policy_loss"], rtol=1e-4, atol=1e-7)
    ours = {"actor": brax_layers(grads["params"]["actor"]), "critic": brax_layers(grads["params"]["critic"])}
    theirs = {"actor": brax_grads.policy, "critic": brax_grads.value}
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ours), jax.tree.leaves(theirs)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.abs(b).max()),
                                   err_msg=jax.tree_util.keystr(path))
