"""Cooperative multi-agent Q-learning from replayed sequences: IQL, VDN and QMIX as one learner whose mixer is a
setting (the algorithm's name picks it, `MIXERS`), with recurrent agents, action masks and a mixing network on
the global state.

    iql  (mixer "none"): every agent learns its own Q from the team reward (independent Q-learners sharing
                         one network);
    vdn  (mixer "sum"):  Q_tot = sum over agents of Q_a (Sunehag et al., 2018);
    qmix (mixer "qmix"): Q_tot = a monotonic mix of the Q_a, weights from hypernetworks on the global state
                         (Rashid et al., 2018; `networks.QMixer`, sized by config.mixer).

One update, for one run on this device's n envs (inside `engine.compile_chunk`):

    rollout: T steps of every env, epsilon-greedy on each agent's Q, the agents' hidden states carried from
      update to update (`OffPolicyLearner.rollout`) -> `replay.add`
      -> G gradient steps (`DQN._train`), each on `batch_size / num_envs` sequences of L steps per env:
         the online and target networks run over each sequence from a zero hidden state, restarting at
         episode starts (`sequence_values`); the next observation's values continue from the hidden state its
         step left, so time limits and the sequence's last step bootstrap correctly; double-Q next values;
         targets `advantages.lambda_targets` over the sequence (q_lambda 0: one-step); squared or Huber loss
         on all but the first `burn_in` steps (those only warm the hidden state up).

The team reward is the mean of the agents' rewards (SMAX pays every agent the team's). Shapes: B sequences,
L steps, A agents, K actions, S global state size.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import struct
from ml_collections import ConfigDict

from jaxrl import knobs, mesh as mesh_lib
from jaxrl.knobs import Knob, knob
from jaxrl.algos.dqn import DQN, DQNHyperparams, DQNSettings, dqn_config
from jaxrl.algos.env_policy import trainable
from jaxrl.algos.env_setup import env_optimizer, make_env
from jaxrl.algos.off_policy import check_off_policy_config, check_replay_config, off_policy_settings
from jaxrl.algos.q_learning import (Q_LAMBDA, bootstrap_values, sequence_targets, team_reward,
                                    team_values)
from jaxrl.algos.registry import Recipe, register
from jaxrl.networks import QMixer, QNetwork, RecurrentQNetwork

MIXERS = {"iql": "none", "vdn": "sum", "qmix": "qmix"}  # algorithm name -> how agents' values make the team's
# QMIX's mixing network: an embedding, hypernetworks of one hidden layer, every layer's initial weights orthogonal
MIXER_KNOBS = (Knob("mixer.embed_size", 32, "QMIX: the mixing network's embedding size", minimum=1),
               Knob("mixer.hypernet_size", 64, "QMIX: the hypernetworks' hidden layer size", minimum=1),
               Knob("mixer.init_scale", 0.001, "QMIX: the gain of every mixing layer's initial orthogonal weights",
                    above=0.0))


@struct.dataclass
class ValueDecompositionHyperparams(DQNHyperparams):
    q_lambda: float = Q_LAMBDA.field()


@dataclasses.dataclass(frozen=True)
class ValueDecompositionSettings(DQNSettings):
    sequence_length: int = knob("replay.sequence_length", 64, "steps per sampled sequence (the recurrent "
                                "network unrolls over it)", minimum=1)
    mixer: str = "qmix"  # MIXERS: how the agents' values make the team's
    burn_in: int = knob("replay.burn_in", 0, "steps at each sequence's start that only warm the hidden state up",
                        minimum=0)


class ValueDecomposition(DQN):
    """IQL, VDN or QMIX (see the module's docstring); the gradient steps are DQN's, on sequences."""

    settings: ValueDecompositionSettings

    def __init__(self, env, network, mixer: QMixer | None, settings: ValueDecompositionSettings, mesh=None,
                 eval_max_steps: int = 1000, agent_id: str = "actor"):
        # the global state is stored with every step when the mixer reads it
        critic_input = "global_state" if settings.mixer == "qmix" else "obs"
        super().__init__(env, network, settings, mesh, eval_max_steps, agent_id=agent_id, critic_input=critic_input)
        self.mixer = mixer

    @property
    def learned_steps_per_sequence(self) -> int:
        return self.settings.sequence_length - self.settings.burn_in

    def init_learned(self, key: jax.Array, obs: jax.Array, env_state) -> tuple:
        agent_key, mixer_key = jax.random.split(key)
        params = self.policy.init_params(agent_key, self.env, obs, env_state)
        if self.mixer is not None:  # a collection of its own: acting, evaluation and loaded policies ignore it
            state = self.policy.global_state(self.env, env_state)  # [n, S]
            params = {**params, "mixer": self.mixer.init(mixer_key, jnp.zeros(obs.shape[:2]), state)["params"]}
        optimizer = env_optimizer(self.settings, ValueDecompositionHyperparams(), jnp.int32(0))
        return params, params, optimizer.init(trainable(params))

    def sequence_q(self, params, seq: dict) -> tuple[jax.Array, jax.Array]:
        """(masked Q [B, L, A, K] of each step's obs, of its next obs) over sequences [B, L, ...] from a zero
        hidden state that restarts at episode starts."""
        B, L, A = seq["obs"].shape[:3]
        time_major = lambda x: jnp.swapaxes(self.policy.actor_inputs(x), 0, 1)  # noqa: E731  [L, B, A, d]
        first = jnp.broadcast_to(jnp.swapaxes(seq["first"], 0, 1)[..., None], (L, B, A))
        start = mesh_lib.varying(self.network.initial_carry((B, A)))  # (per device, like the sequences)
        q, next_q = self.network.apply(params, start, time_major(seq["obs"]),
                                       time_major(seq["next_obs"]), first, method="sequence_values")
        dist = self.policy.dist
        return (dist.with_mask(jnp.swapaxes(q, 0, 1), seq.get("mask")),
                dist.with_mask(jnp.swapaxes(next_q, 0, 1), seq.get("next_mask")))

    def mix(self, params, agent_values: jax.Array, state: jax.Array | None) -> jax.Array:
        """The team's value [B, L] of the agents' values [B, L, A]; the agents' own without a mixer."""
        if self.settings.mixer == "qmix":
            return self.mixer.apply({"params": params["mixer"]}, agent_values, state)
        return team_values(agent_values, self.settings.mixer)

    def _td(self, params, target_params, seq: dict, hp: ValueDecompositionHyperparams):
        """(Q of the stored actions, its targets) for sequences [B, L, ...] past the burn-in: [B, L', A] without
        a mixer, else the team's [B, L']."""
        q, online_next_q = self.sequence_q(params, seq)
        target_next_q = self.sequence_q(target_params, seq)[1]
        next_values = jax.lax.stop_gradient(
            bootstrap_values(target_next_q, online_next_q if self.settings.double else None))  # [B, L, A]
        chosen = jnp.take_along_axis(q, seq["action"][..., None], axis=-1)[..., 0]  # [B, L, A]
        q = self.mix(params, chosen, seq.get("state"))
        next_values = jax.lax.stop_gradient(self.mix(target_params, next_values, seq.get("next_state")))
        targets = sequence_targets(team_reward(seq["reward"], self.settings.mixer), next_values, seq["terminated"],
                                   seq["done"], hp.gamma, hp.q_lambda)
        burn_in = self.settings.burn_in
        return q[:, burn_in:], targets[:, burn_in:]


# -------------------------------------------------------------------------------------------------
# From a config


def value_decomposition_config(name: str) -> ConfigDict:
    """IQL, VDN or QMIX (`name`) on SMAX 3m, with recurrent agents (PyMARL's sizes) and JaxMARL's SMAX settings."""
    config = dqn_config()
    config.algorithm = name
    config.env.name = "smax"
    config.env.kwargs = ConfigDict({"scenario": "3m"})
    config.num_envs, config.num_steps = 16, 128
    # kind "gru": fc_size -> GRU rnn_size -> fc_size -> Q; "mlp": hidden_sizes. agent_id: the agents' one-hot
    # ids appended to their observations ("actor") or not ("none")
    config.network = ConfigDict({"kind": "gru", "fc_size": 64, "rnn_size": 64, "hidden_sizes": (64, 64),
                                 "activation": "relu", "agent_id": "actor", "layer_norm": False})
    knobs.fill(config, *MIXER_KNOBS)
    config.replay.update({"buffer_size": 327_680, "batch_size": 32, "gradient_steps": 8, "learning_starts": 10_240,
                          "sequence_length": 64, "burn_in": 0})
    config.returns.update({"q_lambda": 0.0, "reward_scale": 10.0})
    del config.returns["n_step"]
    config.target.every = 80
    config.loss.td = "squared"
    config.explore.update({"epsilon_start": 1.0, "epsilon_end": 0.05, "fraction": 0.1})
    config.optim.update({"learning_rate": 5e-4, "max_grad_norm": 10.0})
    config.total_steps = 2_000_000
    return config


def build_value_decomposition(config: ConfigDict, mesh) -> ValueDecomposition:
    env, eval_max_steps = make_env(config)
    n, space = config.network, env.action_space()
    if n.kind == "gru":
        network = RecurrentQNetwork(space.n, n.fc_size, n.rnn_size, n.activation)
    else:
        network = QNetwork(space.n, tuple(n.hidden_sizes), n.activation, layer_norm=n.layer_norm)
    kind = MIXERS[config.algorithm]
    m = config.mixer
    mixer = QMixer(m.embed_size, m.hypernet_size, m.init_scale) if kind == "qmix" else None
    settings = knobs.read(ValueDecompositionSettings, config, **off_policy_settings(config), mixer=kind)
    return ValueDecomposition(env, network, mixer, settings, mesh, eval_max_steps, agent_id=n.agent_id)


def check_value_decomposition_config(config: ConfigDict) -> None:
    check_off_policy_config(config)
    check_replay_config(config, config.replay.sequence_length, "replay.sequence_length")
    r = config.replay
    if not 0 <= r.burn_in < r.sequence_length:
        raise ValueError(f"config.replay.burn_in = {r.burn_in} must lie in [0, replay.sequence_length = "
                         f"{r.sequence_length}): the loss needs at least one step")


for _name in MIXERS:
    register(_name, Recipe(build_value_decomposition, ValueDecompositionHyperparams,
                           check=check_value_decomposition_config,
                           defaults=functools.partial(value_decomposition_config, _name)))
