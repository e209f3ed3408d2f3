"""Group-relative policy optimisation on environments: GRPO and its variants, critic-free by default.

Each update samples B groups of G episodes. The members of a group start from the identical state (one
reset key) and share the env's own randomness (one step key per group and step); only their action
noise differs, so the spread of their returns measures the policy's choices. Each episode's return is
turned into an advantage relative to its group by an estimator of `jaxrl.advantages` (grpo, dr_grpo,
rloo, median, per_agent, calibrated, ...), and the policy is trained with the loss parts of
`jaxrl.losses.policy_loss` (clip-higher, dual clip, GSPO sequence ratios, token / sequence / constant
aggregation). One compiled program per choice:

    shard_map over the `data` axis (groups split over devices)
      vmap over seeds
        lax.fori_loop over K updates:
          group rollout (T steps, no auto-reset; stops once every episode has ended) -> group advantages
          -> epochs x minibatches of whole (episode, agent) sequences, cut to the longest episode
             (`jaxrl.loops.call_trimmed`: one of a few compiled lengths)

Advantages are per episode and broadcast to every step (`returns="episode"`), or per step: returns-to-go
with a separate group baseline at every time step (`returns="to_go"`). A learned value baseline can be
mixed in (`critic_weight` w > 0): advantages = (1 - w) * group advantages + w * standardised
(returns-to-go - V), so critic-free and critic-based training share one code path.

`build_grpo` makes an `engine.Algorithm` of `GRPO`'s `init` and `update`. The networks and what they see
(parameter sharing, agent ids, action masks, greedy evaluation) are `EnvPolicy`'s, shared with PPO; the
optimiser, minibatch dealing and the chunk program are the engine's.
Shapes: B groups (b on one device), G group size, N = B * G envs (n on one device, group-major), T steps
(the episode cap), A agents, K actions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import einops
import jax
import jax.numpy as jnp
from flax import struct
from ml_collections import ConfigDict

import envs
from envs.wrappers import select
from jaxrl import advantages as advantages_lib, engine, knobs, losses, mesh as mesh_lib, rollout
from jaxrl.algos.env_policy import (NETWORK_SIZED, EnvPolicy, distinct_critic_in, init_run, policy_functions,
                                    sequence_units, step_randomness)
from jaxrl.algos.env_setup import (GAMMA, NUM_ENVS, NUM_STEPS, RESET_RATIO, ROLLOUT_UNROLL,
                                   check_env_config, check_minibatch_split, env_config, make_policy,
                                   run_sizes, sample_trajectory)
from jaxrl.algos.group import (CRITIC_WEIGHT, GROUP_SIZE, advantage_options, check_group_estimator, check_objective,
                               group_relative_keys)
from jaxrl.algos.registry import Recipe, register
from jaxrl.config import NUM_EPOCHS, NUM_MINIBATCHES
from jaxrl.engine import OptimizerSettings, global_mean, optimise, standardise
from jaxrl.engine.algorithm import every_leaf_over_runs
from jaxrl.knobs import knob
from jaxrl.loops import call_trimmed, scan_until, trim_lengths
from jaxrl.mesh import DATA_AXIS

RETURNS = ("episode", "to_go")
# Groups roll out whole episodes from fresh starts and never auto-reset
ONE_RESET = RESET_RATIO.only(1, "GRPO's groups roll out whole episodes from fresh starts and never auto-reset; "
                             "reset_ratio applies to PPO's envs")


@struct.dataclass
class GRPOHyperparams:
    """Traced numbers: the clip bounds of the policy ratio, the weight of the learned value baseline
    (0: critic-free) and of its loss, the entropy bonus, the optimiser's learning rate and clipping norm."""

    learning_rate: float = knobs.declared("optim.learning_rate").field()
    gamma: float = GAMMA.field()
    clip_low: float = losses.CLIP_LOW.field()
    clip_high: float = losses.CLIP_HIGH.field()
    vf_coef: float = losses.VF_COEF.field()
    ent_coef: float = losses.ENT_COEF.field()
    max_grad_norm: float = knobs.declared("optim.max_grad_norm").field()
    critic_weight: float = CRITIC_WEIGHT.field()
    weight_decay: float = knobs.declared("optim.weight_decay").field()


@struct.dataclass
class GroupState:
    """What GRPO carries between updates (every update starts fresh episodes). Leaves [S, ...]."""

    params: Any
    opt_state: Any
    key: jax.Array  # [S, 2]
    update_step: jax.Array  # [S] int32


@dataclasses.dataclass(frozen=True)
class GRPOSettings:
    """Env GRPO's static sizes and choices (num_envs = B * G envs, num_steps = the episode cap T)."""

    num_envs: int = NUM_ENVS.field()  # B * G
    group_size: int = GROUP_SIZE.field()
    num_steps: int = NUM_STEPS.field()  # the episode cap T
    rollout_unroll: int = ROLLOUT_UNROLL.field()
    num_epochs: int = NUM_EPOCHS.field()
    num_minibatches: int = NUM_MINIBATCHES.field()
    optimizer: OptimizerSettings = OptimizerSettings()
    num_updates: int = 1  # over the run (`run_sizes`)
    xla_options: tuple[tuple[str, str | bool], ...] | str = ()  # the training program's XLA options, or "auto"
    advantage: str = advantages_lib.ESTIMATOR.field()
    advantage_options: tuple[tuple[str, Any], ...] = ()  # its keyword options, as (name, value) pairs
    returns: str = knob("group.returns", "episode", "one advantage per episode, or a group baseline per step over "
                        "returns-to-go (to_go)", choices=RETURNS)
    ratio: str = losses.RATIO.field()
    aggregate: str = losses.AGGREGATE.field()
    constant_length: int | None = knob("loss.constant_length", 0, "aggregate constant: the length divided by; 0: "
                                       "num_steps", minimum=0, convert=lambda length: length or None)
    dual_clip: float | None = losses.DUAL_CLIP.field(convert=lambda bound: bound or None)
    objective: str = losses.OBJECTIVE.field()
    # The Generate strategy of jaxrl.rollout's "env" domain: (("generate", (name,)),) (`rollout.settings_of`)
    rollout: tuple[tuple[str, tuple[str, ...]], ...] = ()
    rollout_options: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()  # (strategy, ((key, value), ...))

    @property
    def num_groups(self) -> int:
        return self.num_envs // self.group_size

    @property
    def batch_size(self) -> int:
        """Environment steps per update (at most: episodes may end sooner), over all devices."""
        return self.num_envs * self.num_steps


@struct.dataclass
class GroupStep:
    """One step of the group rollout for n local envs: leaves [n, A, ...] (stacked to [T, ...])."""

    actor_in: jax.Array  # [n, A, d_actor]
    critic_in: jax.Array | None  # [n, A, d_critic]; None when the critic sees the actor's inputs
    action: jax.Array  # [n, A]
    log_prob: jax.Array  # [n, A]
    value: jax.Array  # [n, A] (zeros without a critic)
    mask: jax.Array | None  # [n, A, K] legal actions
    reward: jax.Array  # [n, A]; zero once the episode has ended
    running: jax.Array  # [n, A] float: the episode is still running at this step
    acting: jax.Array  # [n, A] float: running, and the agent is alive (its action counts)


@dataclasses.dataclass(frozen=True, eq=False)
class GRPO:
    """Env GRPO's computations, bound to what is static (see the module docstring): the record's `init` and
    `update` are its methods; the Generate strategy's hooks read it as their `algo`."""

    settings: GRPOSettings
    policy: EnvPolicy
    mesh: jax.sharding.Mesh
    pipeline: rollout.Pipeline  # `settings.rollout`: the Generate strategy, of the "env" domain

    @property
    def num_agents(self) -> int:
        return self.policy.num_agents

    @property
    def use_critic(self) -> bool:
        """A learned value baseline is mixed in (critic_weight > 0 gave the network a value head)."""
        return bool(getattr(self.policy.network, "critic", True))

    def strategy_options(self, name: str) -> dict:
        """The options of the Generate strategy `name` (registered defaults, overridden by the config)."""
        return self.pipeline.options_of(name)

    def init(self, key: jax.Array) -> GroupState:
        """A fresh state for one seed (no seed axis), from the same parameters as PPO's for the same seed."""
        params, _, _, state_key = init_run(self.policy, self.policy.agent_env, key, self.settings.num_envs)
        optimizer = self.settings.optimizer(GRPOHyperparams(), jnp.int32(0))
        return GroupState(params, optimizer.init(params), state_key, jnp.int32(0))

    # ----------------------------------------------------------------------------------------------
    # Group rollout

    def rollout(self, params, key):
        """G episodes from each of the b local groups' start states, T steps, no auto-reset.

        Returns (trajectory GroupStep [T, n, A, ...], episode sums and the Generate strategy's metrics, trained
        [T, n, A] float: the steps the loss learns from). Once an episode ends, its env stays at the state
        before its last step: later steps are still computed (static shapes) but discarded and masked out by
        `running`, and no step ever starts from a terminal state; once every episode on this device has ended,
        no more steps are computed. The Generate strategy (`settings.rollout`)
        may make members draw their group leader's action noise (shared prefixes, counterfactual agents).
        """
        s, env, A, dist = self.settings, self.policy.agent_env, self.num_agents, self.policy.dist
        G, B = s.group_size, s.num_groups
        reset_key, step_key = jax.random.split(key)
        # Drawn for all B groups and N envs, then sliced, so that each env sees the same numbers on any mesh.
        group_keys = mesh_lib.local_share(jax.random.split(reset_key, B))  # [b, 2]
        env_keys, action_noise = step_randomness(step_key, dist, s.num_steps, B, s.num_envs, A)  # a key per group
        sharing = self.pipeline.generator.members(self, jax.random.fold_in(key, 7))
        trained, strategy_metrics = 1.0, {}  # (1.0: every step trained)
        if sharing is not None:  # members draw their leader's noise where `shared`
            shared, trained, strategy_metrics = sharing
            action_noise = rollout.share_leader_noise(action_noise, shared, G)
            trained = trained.astype(jnp.float32)

        def per_member(x):  # [b, ...] -> [n, ...]: every group member gets its group's value
            return jnp.repeat(x, G, axis=0)

        obs, env_state = jax.vmap(env.reset)(per_member(group_keys))
        n = obs.shape[0]

        def step(carry, xs):
            env_state, obs, net_carry, first, running, alive = carry
            env_key, noise = xs
            policy = self.policy.step(params, env, env_state, obs, net_carry, first)
            action = dist.sample_with_noise(policy.policy_out, noise)
            next_obs, next_state, reward, done, info = jax.vmap(env.step)(per_member(env_key), env_state,
                                                                          dist.to_env(action))
            ended = running & envs.episode_over(done, info)
            record = GroupStep(
                actor_in=policy.actor_in,
                critic_in=distinct_critic_in(policy.actor_in, policy.critic_in),
                action=action, log_prob=dist.log_prob(policy.policy_out, action), value=policy.value,
                mask=policy.mask, reward=reward * running[:, None],
                running=jnp.broadcast_to(running[:, None], (n, A)).astype(jnp.float32),
                acting=(running[:, None] & alive).astype(jnp.float32))
            won = ended & info["won"] if self.policy.reports_wins else None
            still = running & ~ended
            env_state, obs = jax.vmap(select)(still, (next_state, next_obs), (env_state, obs))
            return (env_state, obs, policy.carry, jnp.zeros_like(first), still, alive & ~done), (record, won)

        init = mesh_lib.varying((env_state, obs, self.policy.network.initial_carry((n, A)), jnp.ones(n, bool),
                                 jnp.ones(n, bool), jnp.ones((n, A), bool)))
        # Steps stop once every local episode has ended (`scan_until`): the steps not taken record zeros, which
        # every use of the trajectory masks out as it masks a finished episode's steps.
        _, (traj, won) = scan_until(step, init, (env_keys, action_noise), lambda carry: ~carry[4].any(),
                                    unroll=s.rollout_unroll)
        episode = {"episode_return_sum": jnp.sum(traj.reward.sum(0).mean(-1)),
                   "episode_length_sum": jnp.sum(traj.running[:, :, 0]),
                   "episodes": jnp.int32(n)}
        if self.policy.reports_wins:
            episode["win_rate_sum"] = jnp.sum(won)
        return traj, {**episode, **strategy_metrics}, trained

    # ----------------------------------------------------------------------------------------------
    # Advantages

    def advantages(self, traj: GroupStep, hp: GRPOHyperparams):
        """Returns (advantages [T, n, A], loss weights [T, n, A], returns-to-go [T, n, A] or None when
        neither the baseline nor a critic needs them, metrics)."""
        s, G = self.settings, self.settings.group_size
        returns_to_go = None
        if s.returns == "to_go" or self.use_critic:
            returns_to_go = advantages_lib.returns_to_go(traj.reward, traj.running, hp.gamma)
        if s.returns == "episode":  # the episode's undiscounted return, the same advantage at every step
            episode_return = einops.rearrange(traj.reward.sum(0), "(b g) a -> b g a", g=G)
            group = advantages_lib.group_advantages(s.advantage, episode_return, None, **dict(s.advantage_options))
            advantages, weight = (jnp.broadcast_to(einops.rearrange(x, "b g a -> (b g) a"), traj.reward.shape)
                                  for x in (group.advantages, group.weight))
        else:  # a group baseline at every step over the members still running then
            to_groups = lambda x: einops.rearrange(x, "t (b g) a -> b g t a", g=G)
            group = advantages_lib.stepwise_group_advantages(
                s.advantage, to_groups(returns_to_go), to_groups(traj.running) > 0, **dict(s.advantage_options))
            advantages, weight = (einops.rearrange(x, "b g t a -> t (b g) a")
                                  for x in (group.advantages, group.weight))
        if self.use_critic:
            critic = standardise(returns_to_go - traj.value, traj.acting)
            advantages = (1.0 - hp.critic_weight) * advantages + hp.critic_weight * critic
        metrics = {"zero_variance_fraction": jax.lax.pmean(jnp.mean(group.zero_variance.astype(jnp.float32)),
                                                           DATA_AXIS)}
        return advantages, weight * traj.acting, returns_to_go, metrics

    # ----------------------------------------------------------------------------------------------
    # Loss and update

    def loss(self, params, batch, hp: GRPOHyperparams):
        """batch: whole sequences, leaves [M, T, ...] (M = (env, agent) pairs) plus the start carry."""
        s = self.settings
        time_major = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1),
                                  {k: batch[k] for k in ("actor_in", "critic_in", "first", "action", "mask")})
        critic_in = time_major["actor_in"] if time_major["critic_in"] is None else time_major["critic_in"]
        dist = self.policy.dist
        _, out, values = self.policy.network.apply(params, batch["carry"], time_major["actor_in"], critic_in,
                                            time_major["first"])
        out = dist.with_mask(out, time_major["mask"])
        log_prob = jnp.swapaxes(dist.log_prob(out, time_major["action"]), 0, 1)  # [M, T]
        entropy = jnp.swapaxes(dist.entropy(out), 0, 1)
        total, aux = losses.policy_loss(
            log_prob, batch["log_prob"], batch["advantages"], batch["weight"],
            clip_low=hp.clip_low, clip_high=hp.clip_high, dual_clip=s.dual_clip, ratio=s.ratio,
            aggregate=s.aggregate, constant_length=s.constant_length or s.num_steps, entropy=entropy,
            ent_coef=hp.ent_coef, objective=s.objective, axis_name=DATA_AXIS)
        if self.use_critic:
            errors = losses.value_loss(jnp.swapaxes(values, 0, 1), None, batch["returns"], None)  # unclipped
            value_loss = losses.aggregate(errors, batch["acting"], "token", axis_name=DATA_AXIS)
            total = total + hp.vf_coef * value_loss
            aux = dict(aux, value_loss=value_loss)
        return total, aux

    def update(self, state: GroupState, hp: GRPOHyperparams):
        """One GRPO update for one seed on this device's groups: returns (state, metrics)."""
        key, rollout_key, epoch_key = jax.random.split(state.key, 3)
        traj, episode, trained = self.rollout(state.params, rollout_key)
        advantages, weight, returns_to_go, metrics = self.advantages(traj, hp)
        weight = weight * trained
        T, n, A = traj.log_prob.shape
        first = jnp.broadcast_to((jnp.arange(T) == 0)[:, None, None], (T, n, A))
        samples = {"actor_in": traj.actor_in, "critic_in": traj.critic_in, "first": first,
                   "action": traj.action, "log_prob": traj.log_prob, "mask": traj.mask,
                   "advantages": advantages, "weight": weight}
        if self.use_critic:  # what the value loss reads
            samples.update(returns=returns_to_go, acting=traj.acting)
        start_carry = mesh_lib.varying(self.policy.network.initial_carry((n, A)))
        s = self.settings
        optimizer = s.optimizer(hp, state.update_step)

        def learn(samples):
            return optimise(self.loss, optimizer, state.params, state.opt_state,
                            sequence_units(samples, start_carry), hp, epoch_key, s.num_epochs, s.num_minibatches)

        # Learn from the steps of the longest episode only (of every run and device that must agree), cut to
        # one of a few compiled lengths: the steps after it are masked out of every loss term.
        steps_taken = mesh_lib.agreed_max(jnp.sum(jnp.any(traj.running > 0, axis=(1, 2)), dtype=jnp.int32))
        (params, opt_state, aux), learned_steps = call_trimmed(learn, samples, steps_taken, trim_lengths(T))
        metrics.update(jax.tree.map(jnp.mean, aux))
        metrics["learned_steps"] = learned_steps.astype(jnp.float32)
        metrics.update(jax.lax.psum(episode, DATA_AXIS))  # a strategy's metrics too (*_sum keys, per episode)
        metrics["acting_fraction"] = global_mean(traj.acting)  # the share of computed steps that train
        return GroupState(params, opt_state, key, state.update_step + 1), metrics

    def sample_trajectory(self, state: GroupState) -> GroupStep:
        """The group rollout the next update will train on, nothing updated: leaves [S, T, N, A, ...]."""
        return sample_trajectory(lambda st, key: self.rollout(st.params, key)[0], state, every_leaf_over_runs(state),
                                 self.mesh, self.policy.agent_env.supports_vma_checks)


# -------------------------------------------------------------------------------------------------
# From a config


def grpo_config() -> ConfigDict:
    """The env algorithms' keys plus the group, the advantage estimator and the loss parts, chosen by name."""
    config = env_config()
    config.algorithm = "grpo"
    config.update(group_relative_keys())
    config.returns.gamma = 1.0  # discount of returns-to-go (group.returns="to_go")
    knobs.fill(config, GRPOSettings)
    config.rollout = rollout.config_keys("env")  # (rollout.generate: how a group's members act; its options)
    return config


def build_grpo(config: ConfigDict, mesh) -> engine.Algorithm:
    settings = knobs.read(GRPOSettings, config, **run_sizes(config), advantage_options=advantage_options(config),
                          **rollout.settings_of(config, "env"))
    policy = make_policy(config, critic=config.loss.critic_weight > 0)
    mesh = mesh if mesh is not None else mesh_lib.make_mesh()
    mesh_lib.check_no_model_axis(mesh, "environment algorithms have none")
    mesh_lib.check_divisible("the number of groups (num_envs / group_size)", settings.num_groups, mesh)
    check_minibatch_split(settings.num_envs, settings.num_steps, settings.num_minibatches, policy.num_agents, True,
                          mesh)  # (whole episodes: sequence ratios, aggregates)
    grpo = GRPO(settings, policy, mesh, rollout.Pipeline.of(settings.rollout, settings.rollout_options, "env"))
    return engine.Algorithm(settings, mesh, init=grpo.init, update=grpo.update, sized_by=NETWORK_SIZED, parts=grpo,
                            **policy_functions(policy))


def check_grpo_config(config: ConfigDict) -> None:
    check_env_config(config)
    check_group_estimator(config, text=False)
    rollout.check_config(config, "env")
    if config.num_envs % config.group.size:
        raise ValueError(f"config.num_envs = {config.num_envs} must be a multiple of config.group.size = "
                         f"{config.group.size}: every group is group.size envs from one start state")
    ONE_RESET.check(config)
    check_objective(config, text=False)


register("grpo", Recipe(build_grpo, GRPOHyperparams, check=check_grpo_config, defaults=grpo_config,
                        static_of=lambda config: (config.loss.critic_weight > 0,)))
