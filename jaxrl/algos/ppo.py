"""Proximal policy optimisation, written for a device mesh and for many seeds at once.

`build_ppo` makes an `engine.Algorithm` of `PPO`'s `init` and `update`; one call of its `run_chunk` runs K
updates (K traced: one program for every K), compiled by `engine.compile_chunk`:

    shard_map over the (runs, data) mesh (seeds split over `runs`, environments over `data`, parameters
    replicated along `data`)
      over this device's seeds (each with its own hyperparameters: a sweep is a seed axis)
        lax.fori_loop over K updates:  rollout (lax.scan over T steps, `EnvPolicy.step`) -> GAE
                                       -> epochs x minibatches (`engine.optimise`)

Shapes: S seeds, N environments (n = N / devices on one device), T steps per rollout, A agents (1 for
single-agent envs), K discrete actions (or D action dimensions).
Numbers a sweep may vary live in `PPOHyperparams` (a pytree); sizes and code-path choices live in
`PPOSettings` (static).

With `loss.teacher` (RPD, "Refined Policy Distillation: From VLA Generalists to RL Experts"), a frozen teacher, an
earlier feed-forward PPO run of the same env, gives its greedy action at every rollout step, and the loss adds
`loss.teacher_coef` x the student's negative log-likelihood of it (`losses.behaviour_cloning`): on-policy RL guided
towards the teacher's behaviour while it explores, free to go beyond it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P
from ml_collections import ConfigDict

import envs
from jaxrl import engine, knobs, losses, normalization
from jaxrl import advantages as advantages_lib
from jaxrl.algos.env_policy import (NETWORK_SIZED, EnvOnMesh, EnvPolicy, distinct_critic_in, init_run,
                                    policy_functions, sequence_units, step_randomness, step_units, trainable)
from jaxrl.algos.env_setup import (GAMMA, NUM_ENVS, NUM_STEPS, RESET_RATIO, REWARD_SCALE, ROLLOUT_UNROLL,
                                   check_env_config, check_minibatch_split, env_config,
                                   make_env, make_policy, run_sizes, sample_trajectory)
from jaxrl.algos.registry import Recipe, register, saved_config
from jaxrl.config import NUM_EPOCHS, NUM_MINIBATCHES
from jaxrl.engine import OptimizerSettings, normalize, optimise, staleness
from jaxrl.knobs import Knob, knob
from jaxrl.mesh import DATA_AXIS, RUN_AXIS, RUNS


# "episode": an agent's advantages and value targets take in every team reward up to the end of the episode,
# also after it died (SMAX rewards dead agents: a sacrifice that wins the battle is credited). "agent_done":
# they stop at the agent's own done flag, as if its death ended its episode.
RETURNS_UNTIL = ("episode", "agent_done")
# "rollout": the update trains on the observations as the rollout's policy saw them, normalised by the statistics
# before the rollout. "updated": it normalises them again with the rollout's own observations added to the
# statistics, the ones the next rollout acts with (Brax's PPO); the rollout's log-probabilities stay the
# behaviour policy's.
OBS_STATS = ("rollout", "updated")
# "rollout": advantages and value targets are computed once per update, from the values the critic gave during
# the rollout. "current": every minibatch recomputes them from the critic as it is at that gradient step (Brax's
# PPO; Andrychowicz et al. 2021 found recomputing advantages helps); minibatches then hold whole env sequences,
# and the value of an episode cut by a time limit is the rollout's.
GAE_VALUES = ("rollout", "current")

VALUE_CLIP = Knob("loss.value_clip", 0.2, "values move at most this far from the rollout's; 0: an unclipped value "
                  "loss", traced=True, minimum=0.0)
SCALE_NUM_ENVS = Knob("scale.num_envs", 0, "train with this many envs per seed, the other keys co-scaled from the "
                      "tuned num_envs (Beukman et al. 2026); 0: off", minimum=0)


@struct.dataclass
class PPOHyperparams:
    """Dynamic numbers: traced, so one compiled program serves a whole sweep over them."""

    learning_rate: float = knobs.declared("optim.learning_rate").field()
    gamma: float = GAMMA.field()
    gae_lambda: float = knob("returns.gae_lambda", 0.95, "GAE's lambda (and the value targets' lambda-returns)",
                             traced=True, minimum=0.0, maximum=1.0)
    clip_low: float = losses.CLIP_LOW.field()
    clip_high: float = losses.CLIP_HIGH.field()
    value_clip: float = VALUE_CLIP.field()  # (when settings.clip_value)
    vf_coef: float = losses.VF_COEF.field()
    ent_coef: float = losses.ENT_COEF.field()
    max_grad_norm: float = knobs.declared("optim.max_grad_norm").field()
    weight_decay: float = knobs.declared("optim.weight_decay").field()
    reward_scale: float = REWARD_SCALE.field()
    teacher_coef: float = losses.TEACHER_COEF.field()  # (with settings.teacher)


@dataclasses.dataclass(frozen=True)
class PPOSettings:
    """PPO's static sizes and choices: changing one compiles a new program."""

    num_envs: int = NUM_ENVS.field()
    num_steps: int = NUM_STEPS.field()
    rollout_unroll: int = ROLLOUT_UNROLL.field()
    reset_ratio: int = RESET_RATIO.field()  # training envs: one restart per reset_ratio envs per step
    num_epochs: int = NUM_EPOCHS.field()
    num_minibatches: int = NUM_MINIBATCHES.field()
    optimizer: OptimizerSettings = OptimizerSettings()
    num_updates: int = 1  # over the run (`run_sizes`)
    xla_options: tuple[tuple[str, str | bool], ...] | str = ()  # the training program's XLA options, or "auto"
    normalize_advantages: bool = knob("loss.normalize_advantages", True, "advantages standardised per minibatch")
    clip_value: bool = VALUE_CLIP.field(convert=lambda value_clip: value_clip > 0)
    bootstrap_truncation: bool = knob("returns.bootstrap_truncation", True, "bootstrap from V(final obs) when a "
                                      "time limit cuts an episode")
    returns_until: str = knob("returns.until", "episode", "multi-agent: an agent's returns run to the episode's "
                              "end, or stop at its own done flag", choices=RETURNS_UNTIL)
    normalize_obs: bool = knob("normalize.obs", False, "the policy sees observations (and global state) "
                               "normalised by running statistics")
    obs_clip: float = knob("normalize.obs_clip", 10.0, "normalised observations are clipped to [-obs_clip, "
                           "obs_clip]", above=0.0)
    obs_stats: str = knob("normalize.obs_stats", "rollout", "the statistics the update normalises the rollout's "
                          "observations with: the ones it acted with, or updated with them (Brax's)",
                          choices=OBS_STATS)
    normalize_reward: bool = knob("normalize.reward", False, "rewards divided by the running std of the "
                                  "discounted return (SB3's VecNormalize)")
    gae_values: str = knob("returns.gae_values", "rollout", "the critic values GAE starts from: the rollout's, or "
                           "the current critic's at every minibatch (Brax's)", choices=GAE_VALUES)
    advantage: str = advantages_lib.ESTIMATOR.field()  # gae or vtrace (the value targets: lambda-returns either way)
    max_staleness: int = staleness.MAX_STALENESS.field()
    split_actor: bool = staleness.SPLIT_ACTOR.field()
    teacher: str = losses.TEACHER.field()  # RPD: the run directory of a frozen teacher; "" for none

    @property
    def batch_size(self) -> int:
        """Environment steps per update, over all devices."""
        return self.num_envs * self.num_steps


@struct.dataclass
class TrainState:
    """Everything needed to continue training exactly. Leaves carry a leading seed axis [S, ...]."""

    params: Any
    opt_state: Any
    env_state: Any  # [S, N, ...]
    obs: jax.Array  # [S, N, A, obs_dim] (A = 1 for single-agent envs)
    carry: Any  # the network's hidden state, leaves [S, N, A, ...]; () for feed-forward networks
    first: jax.Array  # [S, N] bool: `obs` is the first of an episode (recurrent state restarts)
    key: jax.Array  # [S, 2]
    update_step: jax.Array  # [S] int32
    reward_norm: Any = None  # RewardNorm with `normalize_reward`, else None
    # With actor.max_staleness = eta > 0: the rollouts sampled and not yet learned from, oldest first
    # (`jaxrl.engine.staleness`; `PPO.sample`'s batch with leaves [eta, ...]); else None
    pending: Any = None


@struct.dataclass
class TeacherTrainState(TrainState):
    """`TrainState` of a run with loss.teacher: the frozen teacher's parameters [S, ...] beside it (a class of its
    own, so that the checkpoints of runs without one keep their layout)."""

    teacher: Any = None


@struct.dataclass
class RewardNorm:
    """Reward scaling's state (SB3's VecNormalize): the moments of the discounted return (d = 1) over every env
    and agent, and each one's running discounted return."""

    moments: normalization.Moments  # [S, ...]
    returns: jax.Array  # [S, N, A]


@struct.dataclass
class Transition:
    """One rollout step for n local envs and A agents: leaves [n, A, ...] (stacked to [T, ...] by the scan)."""

    actor_in: jax.Array  # [n, A, d_actor]
    critic_in: jax.Array | None  # [n, A, d_critic]; None when the critic sees the actor's inputs
    first: jax.Array  # [n]
    action: jax.Array  # [n, A] (discrete) or [n, A, D] (continuous, before `dist.to_env`)
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    done: jax.Array  # [n, A]: the step ends this agent's returns (the episode's end, or see `returns_until`)
    mask: jax.Array | None  # [n, A, K] (discrete actions)
    truncated: jax.Array | None  # [n]
    final_value: jax.Array | None  # [n, A]: value of the last obs of an episode cut by the time limit
    obs: jax.Array | None = None  # [n, A, d] as the env gives them (`normalize_obs`: for the statistics)
    global_state: jax.Array | None = None  # [n, G] likewise, when the critic sees it
    teacher_action: jax.Array | None = None  # [n, A] or [n, A, D]: loss.teacher's greedy action (RPD)


@dataclasses.dataclass(frozen=True)
class Teacher:
    """RPD's frozen teacher: a feed-forward policy of the student's env (`loss.teacher`), of which only the actor
    runs (its critic tower is fed zeros `critic_size` wide, as a loaded policy's is)."""

    policy: EnvPolicy
    critic_size: int

    def actions(self, params, obs: jax.Array, first: jax.Array, mask: jax.Array | None) -> jax.Array:
        """The teacher's greedy actions for n envs' raw observations obs [n, A, d] (first [n], legal actions mask
        [n, A, K] or None): [n, A], or [n, A, D] for continuous actions (its Gaussian's mean, unclipped: the
        action space the student's log-density reads)."""
        carry = self.policy.network.initial_carry(obs.shape[:2])
        out, _ = self.policy.actor_out(params, obs, carry, first, mask, self.critic_size)
        return self.policy.dist.mode(out)


@dataclasses.dataclass(frozen=True, eq=False)
class PPO:
    """PPO's computations, bound to what is static: the record's `init` and `update` are its methods.

    Recurrent networks train on whole rollouts per (env, agent), starting from the hidden state the rollout
    started with and restarting it at episode starts; feed-forward ones on shuffled steps.
    """

    settings: PPOSettings
    policy: EnvPolicy
    env: envs.Environment  # the policy's env, auto-resetting with episode statistics (`EnvOnMesh`)
    mesh: jax.sharding.Mesh
    teacher: Teacher | None = None  # loss.teacher's policy (RPD)

    @property
    def sequence_minibatches(self) -> bool:
        """Minibatches hold whole (env, agent) sequences (recurrent networks, advantages from the current
        critic) rather than single agent-steps."""
        return self.policy.recurrent or self.settings.gae_values == "current"

    def init(self, key: jax.Array, teacher=None) -> TrainState:
        """A fresh TrainState for one seed (no seed axis); with loss.teacher, beside the teacher's parameters
        `teacher` (those of its run; a fresh network of their shapes when not given: what a checkpoint restores
        into)."""
        s, A = self.settings, self.policy.num_agents
        params, obs, env_state, state_key = init_run(self.policy, self.env, key, s.num_envs)
        optimizer = s.optimizer(PPOHyperparams(), jnp.int32(0))
        reward_norm = RewardNorm(normalization.init((1,)), jnp.zeros((s.num_envs, A))) if s.normalize_reward else None
        state = TrainState(params, optimizer.init(trainable(params)), env_state, obs,
                           self.policy.network.initial_carry((s.num_envs, A)), jnp.ones((s.num_envs,), bool),
                           state_key, jnp.int32(0), reward_norm)
        if self.teacher is not None:
            if teacher is None:
                teacher = self.teacher.policy.init_params(jax.random.fold_in(key, 4), self.env, obs, env_state)
            state = TeacherTrainState(**vars(state), teacher=teacher)
        if not s.max_staleness:
            return state
        return state.replace(pending=staleness.empty_queue(self.sample, state, PPOHyperparams, s.max_staleness))

    def state_specs(self, state: TrainState) -> TrainState:
        split = P(RUN_AXIS, DATA_AXIS)  # [S, N, ...]: seeds over the runs axis, envs over the data axis
        reward_norm = None if state.reward_norm is None else RewardNorm(RUNS, split)
        pending = None
        if state.pending is not None:  # a rollout's steps [S, T, N, ...], the rest [S, N, ...], the epoch key [S]
            batch = state.pending["batches"]
            pending = staleness.queue_specs({
                "traj": jax.tree.map(lambda _: P(RUN_AXIS, None, DATA_AXIS), batch["traj"]),
                "after": jax.tree.map(lambda _: split, batch["after"]),
                "carry": jax.tree.map(lambda _: split, batch["carry"]), "epoch_key": RUNS})
        specs = TrainState(params=RUNS, opt_state=RUNS, env_state=split, obs=split,
                           carry=jax.tree.map(lambda _: split, state.carry), first=split, key=RUNS, update_step=RUNS,
                           reward_norm=reward_norm, pending=pending)
        return TeacherTrainState(**vars(specs), teacher=RUNS) if isinstance(state, TeacherTrainState) else specs

    # ----------------------------------------------------------------------------------------------
    # One update on this device's share of the envs (inside shard_map, one seed)

    def rollout(self, state: TrainState, key):
        """T steps of n local envs from `state`. Returns ((env_state, obs, carry, first) after, trajectory,
        episode sums)."""
        s, params, dist = self.settings, state.params, self.policy.dist
        env_keys, action_noise = step_randomness(key, dist, s.num_steps, s.num_envs, s.num_envs, self.policy.num_agents)

        def step(carry, xs):
            env_state, obs, net_carry, first = carry
            env_key, noise = xs
            policy = self.policy.step(params, self.env, env_state, obs, net_carry, first)
            action = dist.sample_with_noise(policy.policy_out, noise)
            next_obs, env_state, reward, done, info = self.env.batch_step(env_key, env_state, dist.to_env(action))
            final_value = None
            if s.bootstrap_truncation:  # the critic's value of the obs a time limit cut off
                final_value = self.policy.step(params, self.policy.agent_env, info["final_state"], info["final_obs"],
                                               policy.carry, jnp.zeros_like(first)).value
            teacher_action = None
            if self.teacher is not None:  # RPD: what the teacher would do in this state, for the update to clone
                teacher_action = self.teacher.actions(state.teacher, obs, first, policy.mask)
            ended = info["returned_episode"]
            if s.returns_until == "episode":
                done = jnp.broadcast_to(ended[:, None], done.shape)
            transition = Transition(
                actor_in=policy.actor_in,
                critic_in=distinct_critic_in(policy.actor_in, policy.critic_in),
                first=first, action=action, log_prob=dist.log_prob(policy.policy_out, action),
                value=policy.value, reward=reward, done=done, mask=policy.mask,
                truncated=info["truncated"] if s.bootstrap_truncation else None, final_value=final_value,
                obs=obs if s.normalize_obs else None,
                global_state=policy.global_state if s.normalize_obs else None, teacher_action=teacher_action)
            episode = self.policy.episode_sums(ended, info)
            return (env_state, next_obs, policy.carry, ended), (transition, episode)

        init = (state.env_state, state.obs, state.carry, state.first)
        after, (traj, episode) = jax.lax.scan(step, init, (env_keys, action_noise), unroll=s.rollout_unroll)
        return after, traj, jax.tree.map(jnp.sum, episode)

    def loss(self, params, batch, hp: PPOHyperparams):
        carry, after = (), None
        if self.sequence_minibatches:  # batch leaves [B, T, ...] -> time-major, from the carry each sequence began with
            carry, after = batch["carry"], batch.get("after")
            batch = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1),
                                 {k: v for k, v in batch.items() if k not in ("carry", "after")})
        def inputs(part):  # (actor_in, critic_in, first); the critic reads the actor's input unless it has its own
            return part["actor_in"], part["actor_in"] if part["critic_in"] is None else part["critic_in"], part["first"]
        actor_in, critic_in, first = inputs(batch)
        if after is not None:  # one more step: the inputs after the sequence, for its bootstrap value
            actor_in, critic_in, first = (jnp.concatenate([x, y[None]]) for x, y in zip(
                (actor_in, critic_in, first), inputs(after)))
        dist = self.policy.dist
        _, out, values = self.policy.network.apply(params, carry, actor_in, critic_in, first)
        if after is not None:
            out, current, values = out[:-1], jax.lax.stop_gradient(values), values[:-1]
        out = dist.with_mask(out, batch["mask"])
        log_ratio = dist.log_prob(out, batch["action"]) - batch["log_prob"]
        if after is not None:
            estimator = advantages_lib.ESTIMATORS[self.settings.advantage]
            # an off-policy estimator (impala) corrects for how far this epoch's policy has moved from the rollout's
            off_policy = {"log_rhos": jax.lax.stop_gradient(log_ratio)} if estimator.off_policy else {}
            advantages, targets = estimator.core(batch["reward"], current[:-1], batch["done"], current[-1],
                                                 hp.gamma, hp.gae_lambda, **off_policy)
        else:
            advantages, targets = batch["advantages"], batch["targets"]
        if self.settings.normalize_advantages:
            advantages = normalize(advantages)
        policy_loss = jnp.mean(losses.ppo_clip_loss(log_ratio, advantages, hp.clip_low, hp.clip_high))
        clip = hp.value_clip if self.settings.clip_value else None
        value_loss = jnp.mean(losses.value_loss(values, batch["value"], targets, clip))
        entropy = jnp.mean(dist.entropy(out))
        total = policy_loss + hp.vf_coef * value_loss - hp.ent_coef * entropy
        aux = {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy,
               "approx_kl": jnp.mean(jnp.expm1(log_ratio) - log_ratio),
               "clip_fraction": jnp.mean(losses.clip_fraction(log_ratio, hp.clip_low, hp.clip_high))}
        if self.teacher is not None:  # RPD: behaviour cloning of the teacher's actions on the rollout's states
            teacher_bc = jnp.mean(losses.behaviour_cloning(dist, out, batch["teacher_action"]))
            total, aux = total + hp.teacher_coef * teacher_bc, dict(aux, teacher_bc=teacher_bc)
        return total, aux

    def units(self, state: TrainState, hp: PPOHyperparams, after, traj: Transition):
        """The update's minibatch units [n, U, ...] from the rollout `traj` that left the envs at `after`
        ((env_state, obs, carry, first)), and the running statistics with it added: (units, (obs_norm,
        reward_norm))."""
        s = self.settings
        env_state, obs, carry, first = after
        obs_norm = self.updated_obs_norm(state.params, traj)
        actor_in, critic_in, normalizing_params = traj.actor_in, traj.critic_in, state.params
        if obs_norm is not None and s.obs_stats == "updated":
            actor_in, critic_in = self.policy.inputs(traj.obs, traj.global_state, obs_norm)
            critic_in = distinct_critic_in(actor_in, critic_in)
            normalizing_params = {**state.params, "obs_norm": obs_norm}
        reward, reward_norm = self.scaled_reward(traj.reward * hp.reward_scale, traj.first, state.reward_norm,
                                                  hp.gamma)
        if s.bootstrap_truncation:  # a time limit is not a terminal state: add the value it cut off
            reward = reward + hp.gamma * traj.final_value * traj.truncated[..., None]
        samples = {"actor_in": actor_in, "critic_in": critic_in,
                   "first": jnp.broadcast_to(traj.first[..., None], traj.value.shape),
                   "action": traj.action, "log_prob": traj.log_prob, "value": traj.value, "mask": traj.mask}
        if self.teacher is not None:
            samples["teacher_action"] = traj.teacher_action
        if s.gae_values == "current":  # each minibatch computes them (`_loss`) from what it needs
            samples.update(reward=reward, done=traj.done)
        else:
            last_value = self.policy.step(state.params, self.env, env_state, obs, carry, first).value
            estimate = advantages_lib.ESTIMATORS[s.advantage].core(reward, traj.value, traj.done, last_value, hp.gamma,
                                                      hp.gae_lambda)
            samples.update(zip(("advantages", "targets"), estimate))
        if not self.sequence_minibatches:
            return step_units(samples), (obs_norm, reward_norm)
        units = sequence_units(samples, state.carry)
        if s.gae_values == "current":  # the inputs after each (env, agent) sequence: leaves [n, A, ...]
            actor_in, critic_in, first, _ = self.policy.step_inputs(normalizing_params, self.env, env_state, obs, first)
            units["after"] = {"actor_in": actor_in, "critic_in": distinct_critic_in(actor_in, critic_in),
                              "first": first}
        return units, (obs_norm, reward_norm)

    def updated_obs_norm(self, params, traj: Transition) -> dict | None:
        """The observation statistics in `params` with the rollout's raw observations [T, n, A, d] (and global
        states [T, n, G]) added over every device's envs; None without `normalize_obs`."""
        if not self.settings.normalize_obs:
            return None
        stats = params["obs_norm"]
        updated = {"obs": normalization.update(stats["obs"], traj.obs, DATA_AXIS)}
        if "global_state" in stats:
            updated["global_state"] = normalization.update(stats["global_state"], traj.global_state, DATA_AXIS)
        return updated

    def scaled_reward(self, reward: jax.Array, first: jax.Array, reward_norm: RewardNorm | None, gamma):
        """Without `normalize_reward`: (reward, None). With it: each env and agent's discounted return runs on
        through the rollout (restarting where `first` [T, n] starts an episode), its moments take in the T
        returns of every env and agent, and the rewards [T, n, A] are divided by the updated std (SB3's
        VecNormalize). Returns (rewards, RewardNorm after the rollout)."""
        if reward_norm is None:
            return reward, None

        def discount(running, step):
            reward, first = step
            running = running * gamma * (1.0 - first[:, None]) + reward
            return running, running

        running, returns = jax.lax.scan(discount, reward_norm.returns, (reward, first.astype(reward.dtype)))
        moments = normalization.update(reward_norm.moments, returns[..., None], DATA_AXIS)
        return normalization.scale(moments, reward), RewardNorm(moments, running)

    def update(self, state: TrainState, hp: PPOHyperparams):
        """One PPO update for one seed on this device's envs: `sample` a rollout, then `learn` from it (with
        `actor.max_staleness` = eta > 0: from the rollout sampled eta updates before, on devices of its own with
        `mesh.split_actor`; `jaxrl.engine.staleness`). Returns (state, metrics)."""
        s = self.settings
        return staleness.update(self.sample, self.learn, PPO_ROLES, state, hp, s.max_staleness, s.split_actor)

    def sample(self, state: TrainState, hp: PPOHyperparams):
        """A rollout of this device's envs with the parameters the update starts from: (state with the envs and
        the key moved on, batch {"traj", "after": (env_state, obs, carry, first) after it, "carry" it started
        from, "epoch_key"}, the episodes that ended, summed over devices)."""
        key, rollout_key, epoch_key = jax.random.split(state.key, 3)
        after, traj, episode = self.rollout(state, rollout_key)
        batch = {"traj": traj, "after": after, "carry": state.carry, "epoch_key": epoch_key}
        env_state, obs, carry, first = after
        state = state.replace(env_state=env_state, obs=obs, carry=carry, first=first, key=key)
        return state, batch, jax.lax.psum(episode, DATA_AXIS)

    def learn(self, state: TrainState, batch: dict, hp: PPOHyperparams):
        """Advantages, then epochs x minibatches of `loss` (gradients averaged over devices) on `sample`'s batch:
        (state with the parameters, optimiser and running statistics moved on, metrics)."""
        s = self.settings
        units, (obs_norm, reward_norm) = self.units(state.replace(carry=batch["carry"]), hp, batch["after"],
                                                    batch["traj"])
        optimizer = s.optimizer(hp, state.update_step)
        trained, opt_state, aux = optimise(self.loss, optimizer, trainable(state.params), state.opt_state, units,
                                           hp, batch["epoch_key"], s.num_epochs, s.num_minibatches)
        params = {**state.params, **trained}
        if obs_norm is not None:
            params = {**params, "obs_norm": obs_norm}
        state = state.replace(params=params, opt_state=opt_state, update_step=state.update_step + 1,
                              reward_norm=reward_norm)
        return state, jax.tree.map(jnp.mean, aux)

    def sample_trajectory(self, state: TrainState) -> Transition:
        """The rollout the next update will train on, nothing updated (for inspection and tests): leaves
        [S, T, N, ...]."""
        return sample_trajectory(lambda st, key: self.rollout(st, key)[1], state, self.state_specs(state), self.mesh,
                                 self.policy.agent_env.supports_vma_checks)


# -------------------------------------------------------------------------------------------------
# From a config


# The state fields a rollout moves on, and those learning does (`jaxrl.engine.staleness`).
PPO_ROLES = staleness.Roles(actor=("env_state", "obs", "carry", "first", "key"),
                            learner=("params", "opt_state", "update_step", "reward_norm"))


def ppo_config() -> ConfigDict:
    """The env algorithms' keys plus PPO's: GAE, the clipped surrogate, value clipping, normalisation."""
    config = env_config()
    config.algorithm = "ppo"
    config = knobs.fill(config, PPOHyperparams, PPOSettings, SCALE_NUM_ENVS)
    config.advantage.estimator = "gae"
    return config


def co_scaled(config: ConfigDict) -> ConfigDict:
    """The config with `scale.num_envs` applied: more samples between policy updates, the inner loop unchanged.

    Following Beukman et al. (2026), "Preventing Learning Stagnation in PPO by Scaling to 1 Million Parallel
    Environments": plateaus come from too few samples per policy update, and when `num_envs` grows by a factor
    k the minibatch size, learning rate, epochs and rollout length stay as tuned and `num_minibatches` grows by k
    (the naive alternative, bigger minibatches with the same optimiser, changes the inner loop and can degrade
    learning). A learning-rate warm-up keeps its length in env steps (`warmup_updates` / k, rounded up); the
    schedules over the whole run follow the run. The result has `num_envs = scale.num_envs`, so applying it
    twice changes nothing.
    """
    target, tuned = config.scale.num_envs, config.num_envs
    if not target or target == tuned:
        return config
    scaled = config.copy_and_resolve_references()
    scaled.optim.num_minibatches = config.optim.num_minibatches * target // tuned
    scaled.optim.warmup_updates = math.ceil(config.optim.warmup_updates * tuned / target)
    scaled.num_envs = target
    scaled.lock()
    return scaled


def build_ppo(config: ConfigDict, mesh) -> engine.Algorithm:
    settings = knobs.read(PPOSettings, config, **run_sizes(config))
    policy = make_policy(config, normalize_obs=settings.normalize_obs, obs_clip=settings.obs_clip)
    on_mesh = EnvOnMesh.of(policy, settings.num_envs, settings.reset_ratio, mesh)
    staleness.check_layout(settings.split_actor, on_mesh.mesh)
    teacher = teacher_of(config) if settings.teacher else None
    ppo = PPO(settings, policy, on_mesh.env, on_mesh.mesh, teacher)
    check_minibatch_split(settings.num_envs, settings.num_steps, settings.num_minibatches, policy.num_agents,
                          ppo.sequence_minibatches, on_mesh.mesh)
    eta = settings.max_staleness
    stale = staleness.StaleUpdate(ppo.sample, ppo.learn, PPO_ROLES, eta) if eta else None
    # (the run layer reads the teacher's parameters from its run and hands them to `init`: `frozen_from`)
    frozen = {} if teacher is None else {"init_from_params": lambda key, params, teacher: ppo.init(key, teacher),
                                         "frozen_from": (("teacher", settings.teacher),)}
    return engine.Algorithm(settings, on_mesh.mesh, init=ppo.init, update=ppo.update, state_specs=ppo.state_specs,
                            stale=stale,
                            sized_by={**NETWORK_SIZED, "env_state": "num_envs", "obs": "num_envs", "carry": "num_envs",
                                      "teacher": "the teacher's network (loss.teacher's run)"},
                            parts=ppo, **frozen, **policy_functions(policy))


def teacher_of(config: ConfigDict) -> Teacher:
    """config.loss.teacher's policy (RPD): the network its run's config.json builds (and the observation
    statistics it normalised with, which its parameters carry), acting in this run's env."""
    saved = saved_config(os.path.join(config.loss.teacher, "config.json"))
    policy = make_policy(saved, normalize_obs=saved.normalize.obs, obs_clip=saved.normalize.obs_clip)
    return Teacher(policy, policy.critic_input_size())


def check_teacher(config: ConfigDict) -> None:
    """config.loss.teacher is a feed-forward ppo run (or policy exported from one) of this run's env and action
    space: ValueError naming the key otherwise, before anything is restored or compiled."""
    path = config.loss.teacher
    named = f"config.loss.teacher={path!r}"
    if not os.path.exists(os.path.join(path, "config.json")):
        raise ValueError(f"{named} is not a run directory (no config.json): the teacher is an earlier ppo run of "
                         "this env")
    saved = saved_config(os.path.join(path, "config.json"))
    if saved.algorithm != "ppo":
        raise ValueError(f"{named} is a {saved.algorithm} run; env PPO's teacher is a ppo run")
    env = lambda c: (c.env.name, json.dumps(c.env.kwargs.to_dict(), sort_keys=True))  # noqa: E731  (tuples as saved)
    if env(saved) != env(config):
        raise ValueError(f"{named} acted in env {saved.env.name} {saved.env.kwargs.to_dict()}, this run in "
                         f"{config.env.name} {config.env.kwargs.to_dict()}: a teacher acts in the student's env")
    continuous = not hasattr(envs.as_multi_agent(make_env(config)[0]).action_space(), "n")
    if continuous and saved.network.squash != config.network.squash:  # (its mean would be read as another action)
        raise ValueError(f"{named} acts in another action space: network.squash={saved.network.squash} there, "
                         f"{config.network.squash} here")
    if saved.network.kind != "mlp":
        raise ValueError(f"{named} is a recurrent policy (network.kind={saved.network.kind}); a teacher must be "
                         "feed-forward (mlp): its hidden state is not carried through the rollouts")


def check_ppo_config(config: ConfigDict) -> None:
    check_env_config(config)
    advantages_lib.check_estimator(config.advantage.estimator, needs_critic=True, family="PPO")
    staleness.check_config(config)
    if config.loss.teacher:
        check_teacher(config)
    target, minibatches = config.scale.num_envs, config.optim.num_minibatches
    if target and (minibatches * target) % config.num_envs:
        step = config.num_envs // math.gcd(minibatches, config.num_envs)
        raise ValueError(f"config.scale.num_envs={target}: the co-scaled optim.num_minibatches (num_minibatches * "
                         f"scale.num_envs / num_envs = {minibatches} * {target} / {config.num_envs}) must be a whole "
                         f"number; choose a multiple of {step}")
    batch = config.num_envs * config.num_steps
    # (recurrent networks and gae_values "current" deal whole sequences; the algorithm checks those against the
    # agent count)
    steps_dealt = config.network.kind == "mlp" and config.returns.gae_values == "rollout"
    if steps_dealt and batch % config.optim.num_minibatches:
        raise ValueError(f"num_envs * num_steps = {config.num_envs} * {config.num_steps} = {batch} is not "
                         f"divisible by optim.num_minibatches = {config.optim.num_minibatches}")


register("ppo", Recipe(build_ppo, PPOHyperparams, check=check_ppo_config, defaults=ppo_config, resolve=co_scaled,
                       static_of=lambda config: (config.loss.value_clip > 0,)))
