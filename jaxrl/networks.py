"""Flax linen policy and value networks (pure `init`/`apply`)."""

from __future__ import annotations

import functools
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl.dot import Dense, bias_grad, weight_grad

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "gelu": nn.gelu, "swish": nn.swish, "elu": nn.elu}


def activation_fn(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; known: {', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name]


def orthogonal(scale: float = 1.0):
    """Flax's orthogonal initialiser (the same values), whose vmapped calls run one matrix after another.

    Under vmap (a critic ensemble, several seeds) the initialiser's QR becomes one batched LAPACK call, which
    splits its batch over XLA:CPU's intra-op thread pool and waits; two such calls running at once on a
    2-thread pool each wait for work queued behind the other, and the program never finishes (jaxlib 0.10.2:
    SAC's and TQC's init hung on 2 cores, both pool threads in `ParallelBatchMap` under `lapack_sgeqrf_ffi`).
    The vmap rule maps the initialiser over the batch with `lax.map` instead, so every QR is of one matrix."""
    base = nn.initializers.orthogonal(scale)

    def init(key, shape, dtype=jnp.float32):
        @jax.custom_batching.custom_vmap
        def one(key):
            return base(key, shape, dtype)

        @one.def_vmap
        def one_after_another(axis_size, in_batched, key):  # (called only where the key is batched)
            return jax.lax.map(one, key), True

        return one(key)

    return init


def orthogonal_dense(features: int, scale: float, name: str | None = None) -> Dense:
    """Dense layer with orthogonal weights of gain `scale` and zero bias (the PPO convention)."""
    return Dense(features, kernel_init=orthogonal(scale), bias_init=nn.initializers.zeros, name=name)


# How an MLP's weights start: "orthogonal" (gain sqrt(2) for hidden layers, the head's own gain: the PPO
# convention) or "lecun_uniform" (variance 1 / fan_in for every layer, the heads included: Brax's networks).
# Biases start at zero.
KERNEL_INITS = ("orthogonal", "lecun_uniform")


def dense(features: int, scale: float, kernel_init: str = "orthogonal") -> Dense:
    """A dense layer started by `kernel_init` (`scale`: the orthogonal gain; lecun_uniform has none)."""
    if kernel_init == "lecun_uniform":
        return Dense(features, kernel_init=nn.initializers.lecun_uniform(), bias_init=nn.initializers.zeros)
    if kernel_init != "orthogonal":
        raise ValueError(f"unknown kernel_init {kernel_init!r}; known: {', '.join(KERNEL_INITS)}")
    return orthogonal_dense(features, scale)


def hidden_layers(x: jax.Array, sizes: Sequence[int], activation: str, layer_norm: bool,
                  kernel_init: str = "orthogonal") -> jax.Array:
    """Dense layers (orthogonal with gain sqrt(2), or `kernel_init`) with LayerNorm before each activation if
    `layer_norm`, inside the calling module's compact scope. [..., in] -> [..., sizes[-1]]"""
    act = activation_fn(activation)
    for size in sizes:
        x = dense(size, np.sqrt(2), kernel_init)(x)
        x = act(nn.LayerNorm()(x) if layer_norm else x)
    return x


class MLP(nn.Module):
    """Hidden layers with gain sqrt(2) (LayerNorm before each activation if `layer_norm`), then a linear head
    with gain `head_scale` (or every layer lecun-uniform: `kernel_init`, see `KERNEL_INITS`).

    [..., in] -> [..., out_dim]
    """

    hidden_sizes: Sequence[int]
    out_dim: int
    activation: str = "tanh"
    head_scale: float = 1.0
    layer_norm: bool = False
    kernel_init: str = "orthogonal"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = hidden_layers(x, self.hidden_sizes, self.activation, self.layer_norm, self.kernel_init)
        return dense(self.out_dim, self.head_scale, self.kernel_init)(x)


# -------------------------------------------------------------------------------------------------
# Actor-critics with one calling convention, feed-forward or recurrent:
#
#     carry, logits, value = net.apply(params, carry, actor_in, critic_in, first)
#
# Inputs are time-major: actor_in [T, *B, d_actor], critic_in [T, *B, d_critic], first bool [T, *B]
# (true where the input is the first of an episode, so the hidden state restarts there); `carry` is
# `net.initial_carry(B)` or what the previous call returned. Outputs: the policy's outputs [T, *B, num_outputs]
# (a `jaxrl.distributions` object reads them: logits, or means and log-stds), value [T, *B]. Feed-forward nets
# carry () and ignore `first` (any leading shape works for them).
#
# `log_std` says where a Gaussian policy's std outputs (the second half of its outputs: log-stds, or what a
# softplus turns into stds, `distributions.DiagGaussian.std_transform`) come from: None (not a Gaussian: every
# output is the head's), "param" (one learned number per action dimension, whatever the state) or "state"
# (the head computes them). They start at `init_std_output` (`DiagGaussian.std_output` of the initial log-std).

LOG_STDS = ("param", "state")


def head_size(num_outputs: int, log_std: str | None) -> int:
    """How many of the policy's outputs its last layer computes (the free log-stds are not among them)."""
    return num_outputs // 2 if log_std == "param" else num_outputs


def policy_outputs(module: nn.Module, head: jax.Array, log_std: str | None, init_std_output: float) -> jax.Array:
    """The actor head's outputs [..., head_size] -> the policy's outputs [..., num_outputs] (see above)."""
    if log_std == "param":
        free = module.param("log_std", nn.initializers.constant(init_std_output), (head.shape[-1],))
        return jnp.concatenate([head, jnp.broadcast_to(free, head.shape).astype(head.dtype)], axis=-1)
    if log_std == "state":
        mean, from_state = jnp.split(head, 2, axis=-1)
        return jnp.concatenate([mean, from_state + init_std_output], axis=-1)
    return head


class ActorCritic(nn.Module):
    """Separate policy and value MLPs.

    (carry=(), actor_in [..., d_a], critic_in [..., d_c], first) -> ((), policy outputs [..., P], value [...])
    With `critic=False` (critic-free algorithms) there is no value network and value is 0.
    """

    num_outputs: int
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    critic: bool = True
    log_std: str | None = None
    init_std_output: float = 0.0
    kernel_init: str = "orthogonal"  # KERNEL_INITS

    recurrent = False

    def initial_carry(self, batch_shape: tuple[int, ...]) -> tuple:
        return ()

    @nn.compact
    def __call__(self, carry, actor_in: jax.Array, critic_in: jax.Array, first: jax.Array | None = None):
        head = MLP(self.hidden_sizes, head_size(self.num_outputs, self.log_std), self.activation, head_scale=0.01,
                   kernel_init=self.kernel_init, name="actor")(actor_in)
        out = policy_outputs(self, head, self.log_std, self.init_std_output)
        if not self.critic:
            return carry, out, jnp.zeros(out.shape[:-1], out.dtype)
        value = MLP(self.hidden_sizes, 1, self.activation, head_scale=1.0, kernel_init=self.kernel_init,
                    name="critic")(critic_in)
        return carry, out, jnp.squeeze(value, -1)


class QNetwork(nn.Module):
    """Action values on the actor-critic calling convention, so that what serves actor-critics (the inputs an
    agent sees, action masks, greedy evaluation, loaded actors) serves Q-learning too: the policy outputs are
    the Q-values [..., K] (the greedy action is their argmax), the value is their maximum; critic_in is unused.

    dueling: Q = V + A - mean(A) over actions (Wang et al., 2016). layer_norm: LayerNorm before each hidden
    activation (PQN's stabiliser in place of a target network).
    """

    num_actions: int
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "relu"
    dueling: bool = False
    layer_norm: bool = False

    recurrent = False

    def initial_carry(self, batch_shape: tuple[int, ...]) -> tuple:
        return ()

    @nn.compact
    def __call__(self, carry, actor_in: jax.Array, critic_in: jax.Array | None = None, first: jax.Array | None = None):
        x = hidden_layers(actor_in, self.hidden_sizes, self.activation, self.layer_norm)
        if self.dueling:
            value = orthogonal_dense(1, 1.0)(x)
            advantage = orthogonal_dense(self.num_actions, 1.0)(x)
            q = value + advantage - jnp.mean(advantage, axis=-1, keepdims=True)
        else:
            q = orthogonal_dense(self.num_actions, 1.0)(x)
        return carry, q, jnp.max(q, axis=-1)

    def sequence_values(self, carry, x: jax.Array, next_x: jax.Array, first: jax.Array | None = None):
        """(q of inputs x [..., d], q of next inputs next_x [..., d]), each [..., K] (`RecurrentQNetwork`'s
        method; without a hidden state the two are independent)."""
        return self(carry, x)[1], self(carry, next_x)[1]


class QMixer(nn.Module):
    """QMIX's mixing network (Rashid et al., 2018): the agents' chosen action values into the team's,

        Q_tot = w2(s) . elu(q W1(s) + b1(s)) + V(s),

    with W1 [A, E] and w2 [E] the absolute values of hypernetworks' outputs on the global state s, so that
    dQ_tot / dq_a >= 0 for every agent: each agent's greedy action is then the team's (monotonicity).

    (agent_q [..., A], state [..., S]) -> [...]

    Every layer starts orthogonal with gain `init_scale`: a small one (JaxMARL's 0.001) starts the mix near
    zero whatever the scale of the state (SMAX's holds raw map positions), so early targets stay small.
    """

    embed_size: int = 32
    hypernet_size: int = 64
    init_scale: float = 1.0

    @nn.compact
    def __call__(self, agent_q: jax.Array, state: jax.Array) -> jax.Array:
        A, E = agent_q.shape[-1], self.embed_size
        state = state.astype(agent_q.dtype)
        scale = self.init_scale

        def hypernet(out: int, name: str) -> jax.Array:
            layers = [orthogonal_dense(self.hypernet_size, scale), nn.relu, orthogonal_dense(out, scale)]
            return nn.Sequential(layers, name=name)(state)

        w1 = jnp.abs(hypernet(A * E, "w1")).reshape(*state.shape[:-1], A, E)
        hidden = nn.elu(jnp.einsum("...a,...ae->...e", agent_q, w1) + orthogonal_dense(E, scale, "b1")(state))
        w2 = jnp.abs(hypernet(E, "w2"))
        return jnp.sum(hidden * w2, axis=-1) + hypernet(1, "v")[..., 0]


class ActorAndCritics(nn.Module):
    """A policy and an ensemble of E action-value critics, as SAC, TD3 and TQC use them.

    On the actor-critic calling convention it is the policy (value is 0), so that what serves actor-critics
    (evaluation, loaded actors) serves it: (carry, actor_in [..., d], critic_in (unused), first) -> ((),
    policy outputs [..., P], zeros [...]). `critics` is the ensemble:

        net.apply(params, obs_in [..., d], action [..., D], method="critics")  -> [E, ..., N]      (continuous)
        net.apply(params, obs_in [..., d], None, method="critics")            -> [E, ..., K, N]   (discrete)

    each critic giving N atoms (N = 1: the action value; N > 1: quantiles of the return). The E critics are one
    vmapped MLP (parameters [E, ...]): one batched matmul per layer, and each starts from its own weights.
    `num_actions` K for discrete actions (a critic gives one value per action), None for continuous ones (the
    action is an input). Continuous policies output a mean and a state-dependent log-std per dimension.
    `layer_norm`: LayerNorm before each hidden activation of the critics.
    """

    num_outputs: int
    num_actions: int | None = None
    hidden_sizes: Sequence[int] = (256, 256)
    activation: str = "relu"
    num_critics: int = 2
    num_quantiles: int = 1
    layer_norm: bool = False

    recurrent = False

    def initial_carry(self, batch_shape: tuple[int, ...]) -> tuple:
        return ()

    def setup(self):
        self.actor = MLP(self.hidden_sizes, self.num_outputs, self.activation, head_scale=0.01)
        per_action = 1 if self.num_actions is None else self.num_actions
        ensemble = nn.vmap(MLP, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=None,
                           out_axes=0, axis_size=self.num_critics)
        self.ensemble = ensemble(self.hidden_sizes, per_action * self.num_quantiles, self.activation,
                                 layer_norm=self.layer_norm)

    def __call__(self, carry, actor_in: jax.Array, critic_in: jax.Array | None = None, first: jax.Array | None = None):
        out = self.actor(actor_in)
        if self.num_actions is None:  # the mean and log-std halves, the log-std computed from the state
            out = policy_outputs(self, out, "state", 0.0)
        if self.is_initializing():  # create the critics' parameters too
            continuous = self.num_actions is None
            self.critics(actor_in, jnp.zeros((*actor_in.shape[:-1], self.num_outputs // 2)) if continuous else None)
        return carry, out, jnp.zeros(out.shape[:-1], out.dtype)

    def critics(self, obs_in: jax.Array, action: jax.Array | None) -> jax.Array:
        x = obs_in if action is None else jnp.concatenate([obs_in, action.astype(obs_in.dtype)], axis=-1)
        out = self.ensemble(x)  # [E, ..., per_action * N]
        if self.num_actions is None:
            return out
        return out.reshape(*out.shape[:-1], self.num_actions, self.num_quantiles)


def _gates(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """[..., 3H] -> the reset, update and candidate parts, each [..., H]."""
    H = x.shape[-1] // 3
    return x[..., :H], x[..., H:2 * H], x[..., 2 * H:]


def _gru_step(h, x_gates, restart, w_gates, b_hn):
    """One GRU step, restarting from zero where `restart` is true; returns (h, what the backward pass needs).

    h [*B, H], x_gates: the input's projection per gate (3 x [*B, H]), restart bool [*B], w_gates: the
    recurrent kernel per gate (3 x [H, H]). Gates as in flax's GRUCell: r, z = sigmoid(.),
    n = tanh(W_in x + r * (W_hn h + b_hn)).

    Each gate is its own matmul and array: XLA:CPU runs the step about 2.5x slower when the gates are slices
    of one [*B, 3H] array (its fused element-wise loops over strided slices are not vectorised well).
    """
    (x_r, x_z, x_n), (w_r, w_z, w_n) = x_gates, w_gates
    h = jnp.where(restart[..., None], 0.0, h)
    r = nn.sigmoid(x_r + h @ w_r)
    z = nn.sigmoid(x_z + h @ w_z)
    hn = h @ w_n + b_hn
    n = jnp.tanh(x_n + r * hn)
    return (1.0 - z) * n + z * h, (h, r, z, n, hn)


def _gru_step_grad(dh, saved, w_gates_t):
    """The step's backward: dh [*B, H] (gradient of its output), w_gates_t the transposed kernels ->
    (gradient of the restarted previous h, gradients of the gates' pre-activations (r, z, n) and of
    W_hn h + b_hn, each [*B, H])."""
    h, r, z, n, hn = saved
    dn = dh * (1.0 - z) * (1.0 - n * n)  # through tanh
    dz = dh * (h - n) * z * (1.0 - z)
    dr = dn * hn * r * (1.0 - r)
    dhn = dn * r
    w_r_t, w_z_t, w_n_t = w_gates_t
    return dh * z + dr @ w_r_t + dz @ w_z_t + dhn @ w_n_t, (dr, dz, dn, dhn)


@jax.custom_vjp
def scan_grus(hs: tuple, x_projs: tuple, first: jax.Array, weights: tuple) -> tuple[tuple, tuple]:
    """Several GRUs over one time-major sequence in a single loop: (h_T per GRU, outputs [T, *B, H] per GRU).

    hs: ([*B, H], ...), x_projs: ([T, *B, 3H], ...), first bool [T, *B] (the state restarts at zero there),
    weights: ((w_h [H, 3H], b_hn [H]), ...). One loop rather than one per GRU, and a hand-written backward
    pass whose loop carries only the hidden states' gradients: the recurrent kernels' gradient is one
    matmul over all steps afterwards. On a CPU the sequential steps, not their arithmetic, bound the speed.
    """
    return _scan_grus_fwd(hs, x_projs, first, weights)[0]


def _scan_grus_fwd(hs, x_projs, first, weights):
    x_gates = tuple(_gates(x) for x in x_projs)
    w_gates = tuple((_gates(w_h), b_hn) for w_h, b_hn in weights)

    def step(hs, inputs):
        x_gates, restart = inputs
        new, saved = zip(*(_gru_step(h, x, restart, *w) for h, x, w in zip(hs, x_gates, w_gates)))
        return new, (new, saved)

    hs, (outs, saved) = jax.lax.scan(step, tuple(hs), (x_gates, first))
    return (hs, outs), (saved, first, weights)


def _scan_grus_bwd(residuals, cotangents):
    saved, first, weights = residuals
    d_hs, d_outs = cotangents
    w_gates_t = tuple(tuple(w.T for w in _gates(w_h)) for w_h, _ in weights)

    def step(d_hs, inputs):
        d_outs, saved, restart = inputs
        grads = [_gru_step_grad(dh + dy, s, w) for dh, dy, s, w in zip(d_hs, d_outs, saved, w_gates_t)]
        d_prev = tuple(jnp.where(restart[..., None], 0.0, d_h) for d_h, _ in grads)
        return d_prev, tuple(g for _, g in grads)

    d_h0, per_step = jax.lax.scan(step, tuple(d_hs), (tuple(d_outs), saved, first), reverse=True)
    d_x_projs, d_weights = [], []
    for (dr, dz, dn, dhn), s in zip(per_step, saved):
        d_x_projs.append(jnp.concatenate([dr, dz, dn], axis=-1))
        h = s[0].reshape(-1, s[0].shape[-1])  # [T * B, H] the restarted previous states
        d_w_h = jnp.concatenate([weight_grad(h, d.reshape(h.shape[0], -1)) for d in (dr, dz, dhn)], axis=1)
        d_weights.append((d_w_h, bias_grad(dhn.reshape(h.shape[0], -1))))
    return d_h0, tuple(d_x_projs), None, tuple(d_weights)


scan_grus.defvjp(_scan_grus_fwd, _scan_grus_bwd)


class ResetGRU(nn.Module):
    """A GRU over a time-major sequence whose state restarts at zero where `first` is true.

    (h [*B, H], x [T, *B, d], first bool [T, *B]) -> (h_T [*B, H], outputs [T, *B, H])

    The input projections of all T steps are one matmul before the loop (`project`); only the recurrent
    projection runs step by step (`scan_grus`), so that several GRUs can share one loop.
    """

    features: int

    def setup(self):
        H = self.features
        self.input = Dense(3 * H, kernel_init=orthogonal(np.sqrt(2)), bias_init=nn.initializers.zeros)
        self.recurrent_kernel = self.param("recurrent_kernel", orthogonal(), (H, 3 * H))
        self.recurrent_bias = self.param("recurrent_bias", nn.initializers.zeros, (H,))

    def project(self, x: jax.Array) -> jax.Array:
        """[T, *B, d] -> [T, *B, 3H]"""
        return self.input(x)

    def weights(self) -> tuple[jax.Array, jax.Array]:
        return self.recurrent_kernel, self.recurrent_bias

    def __call__(self, h: jax.Array, x: jax.Array, first: jax.Array):
        (h,), (out,) = scan_grus((h,), (self.project(x),), first, (self.weights(),))
        return h, out


class RecurrentTower(nn.Module):
    """Dense -> GRU -> Dense -> linear head (the recurrent SMAX baselines' layout).

    (h [*B, H], x [T, *B, d], first [T, *B]) -> (h, out [T, *B, out_dim]). `project` and `read_out` are the
    parts before and after the GRU, so that `RecurrentActorCritic` can step two towers' GRUs in one loop.
    """

    out_dim: int
    fc_size: int = 128
    rnn_size: int = 128
    activation: str = "relu"
    head_scale: float = 1.0

    def setup(self):
        self.embed = orthogonal_dense(self.fc_size, np.sqrt(2))
        self.gru = ResetGRU(self.rnn_size)
        self.hidden = orthogonal_dense(self.fc_size, np.sqrt(2))
        self.head = orthogonal_dense(self.out_dim, self.head_scale)

    def project(self, x: jax.Array) -> jax.Array:
        """[T, *B, d] -> the GRU's input projection [T, *B, 3H]"""
        return self.gru.project(activation_fn(self.activation)(self.embed(x)))

    def gru_weights(self) -> tuple[jax.Array, jax.Array]:
        return self.gru.weights()

    def read_out(self, h_seq: jax.Array) -> jax.Array:
        """GRU outputs [T, *B, H] -> [T, *B, out_dim]"""
        return self.head(activation_fn(self.activation)(self.hidden(h_seq)))

    def __call__(self, h, x, first):
        (h,), (out,) = scan_grus((h,), (self.project(x),), first, (self.gru_weights(),))
        return h, self.read_out(out)


class RecurrentActorCritic(nn.Module):
    """Separate recurrent actor and critic towers; the carry is (actor h, critic h), each [*B, rnn_size].
    Outputs as `ActorCritic`'s.

    The two GRUs step in one loop (`scan_grus`). With `critic=False` there is no critic tower, value is 0
    and the critic's h stays 0.
    """

    num_outputs: int
    fc_size: int = 128
    rnn_size: int = 128
    activation: str = "relu"
    critic: bool = True
    log_std: str | None = None
    init_std_output: float = 0.0

    recurrent = True

    def initial_carry(self, batch_shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
        zeros = jnp.zeros((*batch_shape, self.rnn_size), jnp.float32)
        return zeros, zeros

    @nn.compact
    def __call__(self, carry, actor_in: jax.Array, critic_in: jax.Array, first: jax.Array):
        actor_h, critic_h = carry
        tower = functools.partial(RecurrentTower, fc_size=self.fc_size, rnn_size=self.rnn_size,
                                  activation=self.activation)
        actor = tower(head_size(self.num_outputs, self.log_std), head_scale=0.01, name="actor")
        if not self.critic:
            actor_h, head = actor(actor_h, actor_in, first)
            out = policy_outputs(self, head, self.log_std, self.init_std_output)
            return (actor_h, critic_h), out, jnp.zeros(out.shape[:-1], out.dtype)
        critic = tower(1, head_scale=1.0, name="critic")
        hs, (actor_out, critic_out) = scan_grus(carry, (actor.project(actor_in), critic.project(critic_in)), first,
                                                (actor.gru_weights(), critic.gru_weights()))
        out = policy_outputs(self, actor.read_out(actor_out), self.log_std, self.init_std_output)
        return hs, out, jnp.squeeze(critic.read_out(critic_out), -1)


class RecurrentQNetwork(nn.Module):
    """Action values from a recurrent tower (Dense -> GRU -> Dense -> head, the recurrent agents of PyMARL's and
    JaxMARL's value-decomposition baselines), on the actor-critic calling convention:

        (h [*B, H], actor_in [T, *B, d], critic_in (unused), first [T, *B]) -> (h_T, q [T, *B, K], max q [T, *B])

    `sequence_values` is what learning from stored sequences reads.
    """

    num_actions: int
    fc_size: int = 64
    rnn_size: int = 64
    activation: str = "relu"

    recurrent = True

    def initial_carry(self, batch_shape: tuple[int, ...]) -> jax.Array:
        return jnp.zeros((*batch_shape, self.rnn_size), jnp.float32)

    def setup(self):
        self.tower = RecurrentTower(self.num_actions, self.fc_size, self.rnn_size, self.activation)

    def __call__(self, carry, actor_in: jax.Array, critic_in: jax.Array | None = None, first: jax.Array | None = None):
        h, q = self.tower(carry, actor_in, first)
        return h, q, jnp.max(q, axis=-1)

    def sequence_values(self, carry, x: jax.Array, next_x: jax.Array, first: jax.Array):
        """(q [T, *B, K] of each step's inputs x [T, *B, d], q [T, *B, K] of each step's next inputs next_x)
        over a sequence from hidden state `carry` [*B, H], restarting where `first` [T, *B]. The next inputs
        continue from the hidden state their step left (one GRU step for all T at once), so that next values
        are right at the sequence's last step and at episode ends, where next_x is the final observation."""
        tower = self.tower
        _, (hs,) = scan_grus((carry,), (tower.project(x),), first, (tower.gru_weights(),))  # [T, *B, H]
        _, (next_hs,) = scan_grus((hs,), (tower.project(next_x[None]),), jnp.zeros((1, *first.shape), bool),
                                  (tower.gru_weights(),))
        return tower.read_out(hs), tower.read_out(next_hs[0])
