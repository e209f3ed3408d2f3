"""The Generate strategies of environment group rollouts (domain "env", `jaxrl.algos.grpo.GRPO`), registered
on import: how the G members of a group act from their identical start state.

    independent     nothing shared: G independent episodes, every step trained
    vine            members act alike until a branch step drawn per group, then on their own
    counterfactual  one agent per group acts on its own noise, every other agent draws the leader's

Each has one hook, `members(algo, key) -> None or (shared [T, n, A], trained [T, n, A], metrics)` (see
`jaxrl.rollout`); the rollout applies `shared` with `share_leader_noise`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxrl import mesh as mesh_lib
from jaxrl.rollout.stages import register


def share_leader_noise(noise: jax.Array, shared: jax.Array, group_size: int) -> jax.Array:
    """noise [T, n, A, ...] with member g of each group drawing member 0's where shared [T, n, A]."""
    T, n = noise.shape[:2]
    grouped = noise.reshape(T, n // group_size, group_size, *noise.shape[2:])
    leader = jnp.broadcast_to(grouped[:, :, :1], grouped.shape).reshape(noise.shape)
    return jnp.where(shared.reshape(shared.shape + (1,) * (noise.ndim - shared.ndim)), leader, noise)


def _per_member(algo, per_group: jax.Array) -> jax.Array:
    """A value per group, drawn for all B groups [B, ...], as this device's members' values [n, ...]."""
    return jnp.repeat(mesh_lib.local_share(per_group), algo.settings.group_size, axis=0)


def independent(algo, key):
    """G independent episodes per start state (nothing shared, every step trained)."""
    return None


def vine(algo, key):
    """Vine groups: a group's members act alike (their leader's action noise) until a branch step drawn per
    group uniformly from 0..max_branch_step, then each on its own: G continuations of one mid-episode state.
    Only the steps from the branch on are trained (before it the members' actions are equal, and their
    advantages would cancel). Logs `branch_step_sum`."""
    s = algo.settings
    branch = jax.random.randint(key, (s.num_groups,), 0, algo.strategy_options("vine")["max_branch_step"] + 1)
    branch = _per_member(algo, branch)  # [n]
    shared = jnp.arange(s.num_steps)[:, None] < branch[None, :]  # [T, n]
    shared = jnp.broadcast_to(shared[..., None], (*shared.shape, algo.num_agents))
    return shared, ~shared, {"branch_step_sum": jnp.sum(branch)}  # per member: the host divides by episodes


def counterfactual(algo, key):
    """Per-agent counterfactual groups: in each group one agent, drawn per group, acts on its own action noise
    while every other agent draws the leader's, so the spread of the group's returns comes from that agent's
    choices (and what the others do in answer to them). Only that agent's steps are trained."""
    s = algo.settings
    focus = _per_member(algo, jax.random.randint(key, (s.num_groups,), 0, algo.num_agents))  # [n]
    own = jnp.arange(algo.num_agents)[None, :] == focus[:, None]  # [n, A]
    own = jnp.broadcast_to(own[None], (s.num_steps, *own.shape))
    return ~own, own, {}


register("generate", "independent", domain="env", members=independent)
register("generate", "vine", domain="env", members=vine,
                 options={"max_branch_step": (10, "vine groups branch at a step drawn from 0..max_branch_step",
                                              {"minimum": 0})})
register("generate", "counterfactual", domain="env", members=counterfactual)
