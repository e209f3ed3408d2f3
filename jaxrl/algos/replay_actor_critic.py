"""Off-policy actor-critics from a replay buffer: SAC (Haarnoja et al., 2018; with discrete actions, Christodoulou,
2019), TD3 (Fujimoto et al., 2018) and TQC (Kuznetsov et al., 2020), as one learner whose rules are settings:

    policy      "stochastic": a tanh-squashed Gaussian (a softmax for discrete actions) with an entropy bonus
                whose temperature is learned towards a target entropy (SAC, TQC);
                "deterministic": tanh of the mean, explored with Gaussian noise; target actions smoothed with
                clipped noise; the actor and the targets move every `policy_delay` gradient steps (TD3)
    critics     E critics of N atoms each, one vmapped module (`networks.ActorAndCritics`). N = 1: action
                values, the target takes their minimum (clipped double Q); N > 1: quantiles, the target pools
                the E N atoms of the next state and drops the largest `drop_per_critic` x E (TQC), and each
                critic fits the kept atoms by quantile Huber regression
    actor_value what the actor maximises: "min" over the critics (SAC), the "first" critic (TD3), the "mean" of
                all atoms (TQC)

One update, for one run on this device's n envs (`engine.acting.replay_update`): T steps of every env (uniform
random actions before learning_starts) into the buffer, then G gradient steps, each on replay_batch transitions:
the critics towards r + gamma (1 - terminated) (Z_target(s', a') - alpha log pi(a'|s')) (prioritised: weighted,
new priorities |TD|), then (when due) the actor, the temperature and the target networks (Polyak, `target.tau`).

Continuous actions are stored as the squashed action a in [-1, 1]^D that the critics see; the env gets a
rescaled to its bounds. Shapes: n envs, A agents, D action dimensions (K actions), E critics, N atoms, B
transitions in a batch (this device's share).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from flax import struct
from ml_collections import ConfigDict

from jaxrl import config as config_lib, engine, knobs, mesh as mesh_lib, replay
from jaxrl.algos.env_policy import EnvOnMesh, EnvPolicy, PolicyStep
from jaxrl.algos.env_setup import ACTIVATION, HIDDEN_SIZES, LAYER_NORM, make_env
from jaxrl.algos.off_policy import (GAMMA, PRIORITY_ALPHA, PRIORITY_BETA, REWARD_SCALE, TAU, OffPolicySettings,
                                    ReplaySettings, check_off_policy_config, off_policy_algorithm, off_policy_config,
                                    off_policy_settings, replay_config)
from jaxrl.algos.registry import Recipe, register
from jaxrl.engine import acting as acting_lib
from jaxrl.knobs import knob
from jaxrl.networks import ActorAndCritics

POLICIES = ("stochastic", "deterministic")
ACTOR_VALUES = ("min", "first", "mean")
# Each part (PARTS) has an optimiser of its own, which clips that part's gradient norm by itself
ONE_CLIP = knobs.declared("optim.grad_clip").only("joint", "SAC, TD3 and TQC give the critics, the actor and the "
                                                  "temperature an optimiser each, each clipping its own gradients "
                                                  "to optim.max_grad_norm")


@struct.dataclass
class ReplayActorCriticHyperparams:
    """Traced numbers: one compiled program serves a sweep over them."""

    actor_learning_rate: float = knobs.declared("optim.learning_rate").field()
    critic_learning_rate: float = knob("optim.critic_learning_rate", 1e-3, "the critics' learning rate "
                                       "(optim.learning_rate is the actor's)", traced=True, above=0.0)
    temperature_learning_rate: float = knob("optim.temperature_learning_rate", 1e-3, "the entropy "
                                            "temperature's learning rate", traced=True, above=0.0)
    gamma: float = GAMMA.field()
    reward_scale: float = REWARD_SCALE.field()
    tau: float = TAU.field()
    max_grad_norm: float = knobs.declared("optim.max_grad_norm").field()
    weight_decay: float = knobs.declared("optim.weight_decay").field()  # the actor's and the critics'
    priority_alpha: float = PRIORITY_ALPHA.field()
    priority_beta: float = PRIORITY_BETA.field()
    target_entropy_scale: float = knob("temperature.target_scale", 1.0, "target entropy: -scale x D (continuous) "
                                       "or scale x log K (discrete actions)", traced=True, above=0.0)
    explore_noise: float = knob("policy.explore_noise", 0.1, "deterministic policies: std of the exploration noise, "
                                "in [-1, 1] units", traced=True, minimum=0.0)
    target_noise: float = knob("policy.target_noise", 0.2, "deterministic policies: std of the target-action "
                               "smoothing noise", traced=True, minimum=0.0)
    target_noise_clip: float = knob("policy.target_noise_clip", 0.5, "deterministic policies: the smoothing noise "
                                    "is clipped to +-this", traced=True, minimum=0.0, maximum=1.0)


@dataclasses.dataclass(frozen=True)
class ActorCriticRules:
    """The static choices that make SAC, TD3 or TQC (see the module's docstring)."""

    policy: str = knob("policy.kind", "stochastic", "a tanh-squashed Gaussian (softmax for discrete actions) with "
                       "an entropy bonus (SAC, TQC), or deterministic with noise (TD3)", choices=POLICIES)
    learn_temperature: bool = knob("temperature.learn", True, "learn the entropy temperature towards the target "
                                   "entropy, or keep it at temperature.init")
    init_temperature: float = knob("temperature.init", 1.0, "the entropy temperature alpha at the start", above=0.0)
    policy_delay: int = knob("policy.delay", 1, "critic steps per actor (and temperature) step", minimum=1)
    num_critics: int = knob("network.num_critics", 2, "critics E (clipped double Q: the minimum over them)",
                            minimum=1)
    num_quantiles: int = knob("network.num_quantiles", 1, "atoms N per critic; N > 1: quantile critics (TQC)",
                              minimum=1)
    drop_per_critic: int = knob("network.drop_per_critic", 0, "quantile critics: atoms per critic dropped from the "
                                "pooled target", minimum=0)
    actor_value: str = knob("policy.actor_value", "min", "what the actor maximises: the min over the critics (SAC), "
                            "the first critic (TD3), the mean of all atoms (TQC)", choices=ACTOR_VALUES)
    hidden_sizes: tuple = HIDDEN_SIZES.field()
    activation: str = ACTIVATION.field()
    layer_norm: bool = LAYER_NORM.field()  # (the critics')


# Where each trained part of the parameters lives (it has an optimiser of its own): the critics and the actor are
# the network's submodules; the temperature is a collection of its own, which flax's modules never read.
PARTS = {"critic": ("params", "ensemble"), "actor": ("params", "actor"), "temperature": ("temperature",)}


def part_of(params: dict, part: str):
    """The subtree of `params` that `part` (PARTS) names."""
    return functools.reduce(lambda tree, key: tree[key], PARTS[part], params)


def with_part(params: dict, part: str, value) -> dict:
    """`params` with the subtree that `part` names replaced by `value` (nothing else copied)."""
    def put(tree: dict, keys: tuple) -> dict:
        return {**tree, keys[0]: value if len(keys) == 1 else put(tree[keys[0]], keys[1:])}
    return put(params, PARTS[part])


def quantile_huber_loss(atoms: jax.Array, targets: jax.Array, weights: jax.Array | None = None) -> jax.Array:
    """Quantile regression with the Huber loss (kappa 1; Dabney et al., 2018): atoms [..., N] at quantile
    levels (i + 1/2) / N fit target samples [..., M]; the mean over every pair and leading axis, each pair's loss
    times `weights` (broadcast to [..., 1, 1]: importance weights) when given."""
    N = atoms.shape[-1]
    levels = (jnp.arange(N, dtype=atoms.dtype) + 0.5) / N
    delta = targets[..., None, :] - atoms[..., :, None]  # [..., N, M]
    weight = jnp.abs(levels[:, None] - (delta < 0).astype(atoms.dtype))
    losses = weight * optax.huber_loss(delta)
    return jnp.mean(losses if weights is None else losses * weights)


def truncated_atoms(atoms: jax.Array, drop: int) -> jax.Array:
    """The E critics' atoms [E, ..., N] pooled and sorted, the `drop` largest left out: [..., E N - drop]."""
    pooled = jnp.moveaxis(atoms, 0, -2).reshape(*atoms.shape[1:-1], -1)
    # The smallest E N - drop, ascending, as a top-k of the negated atoms: XLA:CPU's partial sort, where a full
    # sort runs its comparator per element pair (1.9 of TQC's 8.3 ms per step at 64-64, 2 critics x 25 atoms).
    return -jax.lax.top_k(-pooled, pooled.shape[-1] - drop)[0]


@dataclasses.dataclass(frozen=True, eq=False)
class ReplayActorCritic:
    """SAC, TD3 or TQC (see the module's docstring), single- or multi-agent (agents share the networks): the static
    parts (the policy on the env, the envs on the mesh, the settings) and the computations;
    `build_replay_actor_critic` makes its `engine.Algorithm`."""

    policy: EnvPolicy  # its network: `networks.ActorAndCritics`
    envs: EnvOnMesh
    settings: OffPolicySettings

    @property
    def rules(self) -> ActorCriticRules:
        """`settings.rules` (shorthand: the computations read them throughout)."""
        return self.settings.rules

    @property
    def discrete(self) -> bool:
        """Whether the env's actions are discrete (a softmax policy) rather than continuous."""
        return hasattr(self.policy.dist, "num_actions")

    # ----------------------------------------------------------------------------------------------
    # The networks

    def _policy_out(self, params, obs: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        """Policy outputs [..., A, P] of observations [..., A, d] (illegal actions masked)."""
        actor_in = self.policy.actor_inputs(obs)
        return self.policy.dist.with_mask(self.policy.network.apply(params, (), actor_in)[1], mask)

    def _critics(self, params, obs: jax.Array, action: jax.Array | None) -> jax.Array:
        """[E, ..., A, N] for continuous actions [..., A, D]; [E, ..., A, K, N] for discrete ones (action None)."""
        actor_in = self.policy.actor_inputs(obs)
        return self.policy.network.apply(params, actor_in, action, method="critics")

    def temperature(self, params) -> jax.Array:
        return jnp.exp(params["temperature"]["log_alpha"])

    def target_entropy(self, hp) -> jax.Array:
        dist = self.policy.dist
        if self.discrete:
            return hp.target_entropy_scale * jnp.log(jnp.float32(dist.num_actions))
        return -hp.target_entropy_scale * dist.action_dim

    def _noise(self, key: jax.Array, batch: int, shape: tuple[int, ...]) -> jax.Array:
        """N(0, 1) noise [batch, *shape] for a batch of this device's n envs' samples (env-major): drawn per env
        from its global index, so a batch gets the same noise on one device or on eight."""
        n = self.envs.local_envs
        keys = replay.env_keys(key, n)
        return jax.vmap(lambda k: jax.random.normal(k, (batch // n, *shape)))(keys).reshape(batch, *shape)

    # ----------------------------------------------------------------------------------------------
    # Acting

    def act(self, key: jax.Array, policy: PolicyStep, hp, update_step: jax.Array):
        """One env's exploring action from the networks' outputs on it ([A, P]): uniform before learning_starts,
        then the policy's, sampled (stochastic) or with Gaussian noise (deterministic). Returns (the action
        stored for learning [A, ...], in [-1, 1]^D when continuous; the action the env is given [A, ...])."""
        s, dist = self.settings, self.policy.dist
        warm_up = update_step * s.num_steps * s.num_envs < s.replay.learning_starts
        random_key, noise_key = jax.random.split(key)
        out = policy.policy_out  # [A, P]
        if self.discrete:
            legal = jnp.ones(out.shape, bool) if policy.mask is None else policy.mask
            uniform = jax.random.categorical(random_key, jnp.where(legal, 0.0, -jnp.inf)).astype(jnp.int32)
            action = jnp.where(warm_up, uniform, dist.sample(noise_key, out))
            return action, action
        uniform = jax.random.uniform(random_key, (*out.shape[:-1], dist.action_dim), minval=-1.0, maxval=1.0)
        if self.rules.policy == "stochastic":
            squashed = jnp.tanh(dist.sample(noise_key, out))
        else:
            noise = hp.explore_noise * jax.random.normal(noise_key, uniform.shape)
            squashed = jnp.clip(jnp.tanh(dist.mode(out)) + noise, -1.0, 1.0)
        action = jnp.where(warm_up, uniform, squashed)
        return action, dist.from_unit_box(action)

    # ----------------------------------------------------------------------------------------------
    # Learning

    def _next_value(self, params, target_params, items: dict, hp, key: jax.Array) -> jax.Array:
        """Target atoms [B, A, M] of the next observations: Z_target(s', a') - alpha log pi(a'|s')."""
        r, dist = self.rules, self.policy.dist
        next_obs, alpha = items["next_obs"], self.temperature(params)
        if self.discrete:  # the expectation over the policy's actions, exactly
            log_pi = jax.nn.log_softmax(self._policy_out(params, next_obs, items.get("next_mask")))  # [B, A, K]
            q = jnp.min(self._critics(target_params, next_obs, None)[..., 0], axis=0)
            return jnp.sum(jnp.exp(log_pi) * (q - alpha * log_pi), axis=-1)[..., None]
        B, A = next_obs.shape[:2]
        noise = self._noise(key, B, (A, dist.action_dim))
        if r.policy == "stochastic":
            out = self._policy_out(params, next_obs)
            u = dist.sample_with_noise(out, noise)
            action, entropy_bonus = jnp.tanh(u), -alpha * dist.log_prob(out, u)  # [B, A, D], [B, A]
        else:
            smoothing = jnp.clip(hp.target_noise * noise, -hp.target_noise_clip, hp.target_noise_clip)
            action = jnp.clip(jnp.tanh(dist.mode(self._policy_out(target_params, next_obs))) + smoothing, -1.0, 1.0)
            entropy_bonus = jnp.zeros((B, A))
        atoms = self._critics(target_params, next_obs, action)  # [E, B, A, N]
        if r.num_quantiles == 1:
            kept = jnp.min(atoms, axis=0)  # [B, A, 1]
        else:
            kept = truncated_atoms(atoms, r.drop_per_critic * r.num_critics)
        return kept + entropy_bonus[..., None]

    def _critic_atoms(self, params, batch: dict, hp) -> tuple[jax.Array, jax.Array]:
        """(the critics' atoms of the stored actions [E, B, A, N], their targets [B, A, M])."""
        items = batch["items"]
        reward, terminated = items["reward"], items["terminated"]  # [B, A], [B]
        targets = jax.lax.stop_gradient(reward[..., None] + hp.gamma * (1.0 - terminated[:, None, None])
                                        * batch["next_value"])  # [B, A, M]
        if self.discrete:
            atoms = self._critics(params, items["obs"], None)  # [E, B, A, K, N]
            index = jnp.broadcast_to(items["action"][None, ..., None, None], (*atoms.shape[:-2], 1, atoms.shape[-1]))
            return jnp.take_along_axis(atoms, index, axis=-2)[..., 0, :], targets
        return self._critics(params, items["obs"], items["action"]), targets  # [E, B, A, N]

    def _critic_loss(self, critic_params, batch: dict, hp):
        """The critics' loss, each sample weighted by its importance weight when prioritised (`batch["weights"]`)."""
        # (the other parameters: fixed here, but per device like the loss)
        params = with_part(mesh_lib.varying(batch["params"]), "critic", critic_params)
        atoms, targets = self._critic_atoms(params, batch, hp)
        weights = batch.get("weights")  # [B]
        if self.rules.num_quantiles == 1:
            squares = jnp.square(atoms[..., 0] - targets[..., 0])  # [E, B, A]
            loss = jnp.sum(jnp.mean(squares if weights is None else squares * weights[:, None], axis=(1, 2)))
        else:
            loss = quantile_huber_loss(atoms, jnp.broadcast_to(targets, (atoms.shape[0], *targets.shape)),
                                       None if weights is None else weights[:, None, None, None])
        q = atoms.mean(-1)
        return loss, {"critic_loss": loss, "q_mean": jnp.mean(q), "td_error": jnp.mean(jnp.abs(targets.mean(-1) - q))}

    def _actor_value(self, params, obs: jax.Array, action: jax.Array | None) -> jax.Array:
        """What the actor maximises, [B, A] (continuous) or [B, A, K] (discrete, per action)."""
        atoms = self._critics(params, obs, action)
        rule = self.rules.actor_value
        if rule == "first":
            return atoms[0].mean(-1)
        if rule == "min":
            return jnp.min(atoms.mean(-1), axis=0)
        return atoms.mean(axis=(0, -1))

    def _actor_loss(self, actor_params, batch: dict, hp):
        obs, dist = batch["items"]["obs"], self.policy.dist
        params = with_part(mesh_lib.varying(batch["params"]), "actor", actor_params)
        alpha = self.temperature(params)
        if self.discrete:
            log_pi = jax.nn.log_softmax(self._policy_out(params, obs, batch["items"].get("mask")))  # illegal: pi 0
            pi = jnp.exp(log_pi)
            loss = jnp.mean(jnp.sum(pi * (alpha * log_pi - self._actor_value(params, obs, None)), axis=-1))
            entropy = -jnp.sum(pi * log_pi, axis=-1)
        elif self.rules.policy == "stochastic":
            out = self._policy_out(params, obs)
            u = dist.sample_with_noise(out, batch["noise"])
            log_p = dist.log_prob(out, u)
            loss = jnp.mean(alpha * log_p - self._actor_value(params, obs, jnp.tanh(u)))
            entropy = -log_p
        else:
            action = jnp.tanh(dist.mode(self._policy_out(params, obs)))
            loss = -jnp.mean(self._actor_value(params, obs, action))
            entropy = jnp.zeros(obs.shape[:2])
        return loss, {"actor_loss": loss, "entropy": jnp.mean(entropy)}

    def _temperature_loss(self, temperature, batch: dict, hp):
        """log alpha (H - target): alpha rises while the policy's entropy H is below the target."""
        gap = jax.lax.stop_gradient(batch["entropy"] - self.target_entropy(hp))
        loss = temperature["log_alpha"] * gap
        return loss, {"temperature_loss": loss}

    def optimizers(self, hp, update_step: jax.Array) -> dict:
        """The env optimiser (`settings.optimizer`) for the critics, the actor and the temperature, each at its
        own learning rate and clipping its own gradients (optim.grad_clip stays "joint", `ONE_CLIP`); with
        optim.weight_decay the critics' and the actor's decay their weights, the temperature's does not."""
        optimizer = functools.partial(self.settings.optimizer, hp, update_step)
        return {"critic": optimizer(hp.critic_learning_rate), "actor": optimizer(hp.actor_learning_rate),
                "temperature": optimizer(hp.temperature_learning_rate, decays=False)}

    def init(self, key: jax.Array) -> acting_lib.ReplayState:
        def learned(key, obs, env_state):
            params = self.policy.init_params(key, self.envs.env, obs, env_state)
            # a collection of its own (flax reads only "params"), so that evaluation and loaded actors ignore it
            params = {**params, "temperature": {"log_alpha": jnp.log(jnp.float32(self.rules.init_temperature))}}
            optimizers = self.optimizers(ReplayActorCriticHyperparams(), jnp.int32(0))
            return params, params, {part: optimizers[part].init(part_of(params, part)) for part in PARTS}

        return acting_lib.init_replay(self, learned, key)

    def _part_step(self, part: str, loss_fn, params, opt_state, batch: dict, hp, optimizers: dict):
        """One gradient step of `loss_fn` on one part of the parameters (PARTS), the rest held fixed. Returns
        (params, opt_state, metrics with the gradient norm as `<part>_grad_norm`)."""
        trained, part_opt, aux = engine.gradient_step(loss_fn, optimizers[part], part_of(params, part),
                                                      opt_state[part], batch, hp)
        aux[f"{part}_grad_norm"] = aux.pop("grad_norm")
        return with_part(params, part, trained), {**opt_state, part: part_opt}, aux

    def _critic_step(self, params, target_params, opt_state, buffer, batch: dict, sample, hp, key: jax.Array,
                     optimizers: dict):
        """One gradient step of the critics on transitions [B, ...] (`batch["items"]`; prioritised: new
        priorities from this device's |TD| before it). Returns (params, opt_state, buffer, metrics)."""
        batch = {**batch, "params": params,
                 "next_value": self._next_value(params, target_params, batch["items"], hp, key)}
        if self.settings.replay.prioritised:
            atoms, targets = self._critic_atoms(params, batch, hp)
            buffer = acting_lib.reprioritised(buffer, sample, jnp.abs(targets.mean(-1) - atoms.mean(-1)).mean(0))
        else:
            del batch["weights"]  # (ones)
        return *self._part_step("critic", self._critic_loss, params, opt_state, batch, hp, optimizers), buffer

    def _policy_step(self, params, opt_state, items: dict, hp, key: jax.Array, optimizers: dict):
        """One gradient step of the actor, then of the temperature (when learned), on observations [B, A, d].
        Returns (params, opt_state, metrics)."""
        batch = {"items": items, "params": params}
        if not self.discrete:
            B, A = items["obs"].shape[:2]
            batch["noise"] = self._noise(key, B, (A, self.policy.dist.action_dim))
        params, opt_state, aux = self._part_step("actor", self._actor_loss, params, opt_state, batch, hp, optimizers)
        if self.rules.learn_temperature and self.rules.policy == "stochastic":
            params, opt_state, temperature_aux = self._part_step("temperature", self._temperature_loss, params,
                                                                 opt_state, {"entropy": aux["entropy"]}, hp, optimizers)
            aux["temperature_loss"] = temperature_aux["temperature_loss"]
        return params, opt_state, aux

    def train(self, state: acting_lib.ReplayState, buffer: replay.Buffer, hp, key: jax.Array):
        """G gradient steps in G / policy_delay rounds: in each, policy_delay critic steps, each on its own
        batch, then one policy step on the last batch; the targets move after each step that `target.every`
        picks (after the round's policy step for its last)."""
        s, delay = self.settings, self.rules.policy_delay
        rounds = s.replay.gradient_steps // delay
        optimizers = self.optimizers(hp, state.update_step)

        def round_of_steps(carry, xs):
            params, target_params, opt_state, buffer = carry
            keys, counts = xs  # [policy_delay, 2], [policy_delay]
            critic_aux = []
            for i in range(delay):
                sample_key, next_key, actor_key = jax.random.split(keys[i], 3)
                batch, sample = acting_lib.sample_batch(s, buffer, sample_key, hp.priority_alpha, hp.priority_beta)
                batch["items"] = jax.tree.map(lambda x: x[:, 0], batch["items"])  # sequences of one step: [B, ...]
                params, opt_state, aux, buffer = self._critic_step(params, target_params, opt_state, buffer, batch,
                                                                   sample, hp, next_key, optimizers)
                critic_aux.append(aux)
                if i == delay - 1:
                    params, opt_state, policy_aux = self._policy_step(params, opt_state, batch["items"], hp, actor_key,
                                                                      optimizers)
                target_params = acting_lib.moved_target(s, params, target_params, hp.tau, counts[i])
            critic_aux = jax.tree.map(lambda *steps: sum(steps) / len(steps), *critic_aux)
            return (params, target_params, opt_state, buffer), {**critic_aux, **policy_aux}

        keys = jax.random.split(key, s.replay.gradient_steps).reshape(rounds, delay, -1)
        counts = acting_lib.gradient_counts(s, state.update_step).reshape(rounds, delay)
        carry = (state.params, state.target_params, state.opt_state, buffer)
        (*learned, buffer), aux = jax.lax.scan(round_of_steps, carry, (keys, counts))
        metrics = jax.tree.map(jnp.mean, aux)
        if self.rules.policy == "stochastic":
            metrics["temperature"] = self.temperature(learned[0])
        return tuple(learned), buffer, metrics

    def update(self, state: acting_lib.ReplayState, hp):
        return acting_lib.replay_update(self, state, hp)


# -------------------------------------------------------------------------------------------------
# From a config


def replay_actor_critic_config(name: str) -> ConfigDict:
    """Every key SAC, TD3 and TQC read, at SAC's defaults (the declared ones but where set here); `td3_config`
    and `tqc_config` set the rest."""
    config = off_policy_config(name)
    config.update({"num_envs": 1, "num_steps": 1})
    config.network = ConfigDict({"hidden_sizes": (256, 256), "activation": "relu"})
    config.replay = replay_config()
    knobs.fill(config, ReplayActorCriticHyperparams, ActorCriticRules, ReplaySettings)
    config.env.update({"name": "gymnax", "kwargs": ConfigDict({"env_id": "Pendulum-v1"})})
    config.replay.update({"buffer_size": 1_000_000, "batch_size": 256, "learning_starts": 5_000})
    config.optim.update({"learning_rate": 3e-4, "max_grad_norm": float("inf"), "adam_eps": 1e-8,
                         "schedule": "constant"})
    return config


def td3_config() -> ConfigDict:
    config = replay_actor_critic_config("td3")
    config.policy.update({"kind": "deterministic", "actor_value": "first", "delay": 2})
    config.num_steps, config.replay.gradient_steps = 2, 2  # an update: 2 env steps, 2 critic steps, 1 policy step
    config.temperature.learn = False  # (a deterministic policy has no entropy term)
    config.target.every = 2
    config.optim.critic_learning_rate = 3e-4
    return config


def tqc_config() -> ConfigDict:
    config = replay_actor_critic_config("tqc")
    # SB3-contrib's and sbx's defaults (the paper used 5 critics on MuJoCo; --config.network.num_critics=5)
    config.network.update({"num_critics": 2, "num_quantiles": 25, "drop_per_critic": 2})
    config.policy.actor_value = "mean"
    config.optim.critic_learning_rate = 3e-4
    config.optim.temperature_learning_rate = 3e-4
    # The quantile loss's [critics, batch, atoms, kept atoms] pairs and their sums ran slower as XLA:CPU's
    # YNNPACK fusions than as XLA's own kernels: 1 seed of Pendulum, 2 cores (Intel Xeon, 2026-11-27), 3.7-4.1
    # against 4.3-4.9 ms per step at 64-64, 8.1-8.8 against 9.1-9.9 at 256-256. (SAC's products are faster
    # with YNNPACK, 5.5 against 6.0 ms at 256-256, so this is TQC's default only.)
    config.xla_options = config_lib.WITHOUT_YNNPACK
    return config


def build_replay_actor_critic(config: ConfigDict, mesh) -> engine.Algorithm:
    env, eval_max_steps = make_env(config)
    space = env.action_space()
    discrete = hasattr(space, "n")
    rules = knobs.read(ActorCriticRules, config)
    if discrete and rules.policy == "deterministic":
        raise ValueError(f"policy.kind = 'deterministic': a deterministic policy needs continuous actions; "
                         f"{env!r} has {space!r}")
    if discrete and rules.policy == "stochastic" and not 0 < config.temperature.target_scale < 1:
        raise ValueError(f"temperature.target_scale = {config.temperature.target_scale}: with discrete actions the "
                         "target entropy is target_scale x log K, which must lie below the uniform policy's log K "
                         "(e.g. 0.3 to 0.9)")
    if discrete and rules.num_quantiles > 1:
        raise ValueError(f"network.num_quantiles = {rules.num_quantiles}: quantile critics take continuous "
                         f"actions; {config.env.name!r} has {space!r}")
    num_outputs = int(space.n) if discrete else 2 * int(space.shape[0])
    network = ActorAndCritics(num_outputs, int(space.n) if discrete else None, tuple(rules.hidden_sizes),
                              rules.activation, rules.num_critics, rules.num_quantiles, rules.layer_norm)
    policy = EnvPolicy(env, network, eval_max_steps=eval_max_steps, squash=not discrete)
    settings = off_policy_settings(config, rules)
    on_mesh = EnvOnMesh.of(policy, settings.num_envs, settings.reset_ratio, mesh)
    return off_policy_algorithm(ReplayActorCritic(policy, on_mesh, settings))


def check_replay_actor_critic_config(config: ConfigDict) -> None:
    check_off_policy_config(config)
    ONE_CLIP.check(config)
    n, p = config.network, config.policy
    if config.replay.gradient_steps % p.delay:
        raise ValueError(f"config.replay.gradient_steps = {config.replay.gradient_steps} must be a multiple of "
                         f"policy.delay = {p.delay}: an update's gradient steps come in rounds of policy.delay critic "
                         "steps and one policy step")
    if n.num_quantiles > 1 and p.actor_value != "mean":
        raise ValueError(f"policy.actor_value = {p.actor_value!r}: with quantile critics (network.num_quantiles = "
                         f"{n.num_quantiles}) the actor maximises the mean of all atoms ('mean')")
    if not n.drop_per_critic < n.num_quantiles and n.num_quantiles > 1:
        raise ValueError(f"network.drop_per_critic = {n.drop_per_critic} must lie in [0, num_quantiles = "
                         f"{n.num_quantiles})")
    if n.num_quantiles == 1 and n.drop_per_critic:
        raise ValueError("network.drop_per_critic applies to quantile critics (network.num_quantiles > 1)")


for _name, _defaults in (("sac", functools.partial(replay_actor_critic_config, "sac")), ("td3", td3_config),
                         ("tqc", tqc_config)):
    register(_name, Recipe(build_replay_actor_critic, ReplayActorCriticHyperparams,
                           check=check_replay_actor_critic_config, defaults=_defaults))
