"""Side by side with the reference (jaxmarl's SMAX): fixed ally policies, episode statistics and
throughput, measured the same way for any array-first multi-agent env.

Used by the parity tests and `benchmarks/smax_throughput.py`. jaxmarl is imported only by
`reference_env`, so everything else works without it.
"""

from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp

from envs.core import Environment
from envs.smax.heuristic import STOP, sample_true
from envs.wrappers import AutoReset, EpisodeStatistics

Policy = Callable[[jax.Array, jax.Array], jax.Array]  # (key, mask bool [A, N]) -> actions int32 [A]
EAST = 1


def random_legal(key: jax.Array, mask: jax.Array) -> jax.Array:
    """[A] uniformly random legal actions."""
    return sample_true(key, mask)


def attack_or_advance(key: jax.Array, mask: jax.Array) -> jax.Array:
    """[A] the lowest-numbered attackable enemy, else a step east (toward the enemy's start), else stop."""
    attacks = mask[:, STOP + 1:]
    first_attack = STOP + 1 + jnp.argmax(attacks, axis=-1)
    move = jnp.where(mask[:, EAST], EAST, STOP)
    return jnp.where(attacks.any(axis=-1), first_attack, move).astype(jnp.int32)


POLICIES: dict[str, Policy] = {"random": random_legal, "attack_or_advance": attack_or_advance}


def reference_env(scenario: str, **kwargs) -> Environment:
    """jaxmarl's HeuristicEnemySMAX on `scenario`, in our array-first API (needs jaxmarl)."""
    from jaxmarl.environments.smax import HeuristicEnemySMAX, map_name_to_scenario

    from envs.adapters import FromJaxMARL
    return FromJaxMARL(HeuristicEnemySMAX(scenario=map_name_to_scenario(scenario), **kwargs))


def _scan_policy(wrapped: Environment, policy: Policy, num_envs: int, num_steps: int,
                 accumulate: Callable, init: Callable) -> Callable:
    """`run(key) -> totals`: `num_steps` steps of `num_envs` envs under `policy`, in one lax.scan.

    `init(first_obs) -> totals`; `accumulate(totals, obs, reward, info) -> totals` after every step.
    """

    def run(key):
        reset_key, key = jax.random.split(key)
        obs, state = jax.vmap(wrapped.reset)(jax.random.split(reset_key, num_envs))

        def body(carry, step_key):
            state, totals = carry
            act_key, env_key = jax.random.split(step_key)
            mask = jax.vmap(wrapped.avail_actions)(state)
            actions = jax.vmap(policy)(jax.random.split(act_key, num_envs), mask)
            obs, state, reward, _, info = jax.vmap(wrapped.step)(jax.random.split(env_key, num_envs), state,
                                                                 actions)
            return (state, accumulate(totals, obs, reward, info)), None

        (_, totals), _ = jax.lax.scan(body, (state, init(obs)), jax.random.split(key, num_steps))
        return totals

    return run


def episode_statistics(env: Environment, policy: Policy, key: jax.Array, num_envs: int = 1024,
                       num_steps: int = 300) -> dict[str, float]:
    """Mean length, return (agent 0's; the team reward is shared) and win rate of the episodes that
    end within `num_steps` steps of `num_envs` auto-resetting envs."""

    def accumulate(sums, obs, reward, info):
        ended = info["returned_episode"]
        return {
            "episodes": sums["episodes"] + ended.sum(),
            "length": sums["length"] + jnp.where(ended, info["episode_length"], 0).sum(),
            "return": sums["return"] + jnp.where(ended, info["episode_return"][:, 0], 0.0).sum(),
            "wins": sums["wins"] + (ended & info["won"]).sum(),
        }

    def init(obs):
        return {"episodes": jnp.int32(0), "length": jnp.int32(0), "return": jnp.float32(0), "wins": jnp.int32(0)}

    run = _scan_policy(EpisodeStatistics(AutoReset(env)), policy, num_envs, num_steps, accumulate, init)
    sums = jax.device_get(jax.jit(run)(key))
    n = max(int(sums["episodes"]), 1)
    return {"episodes": int(sums["episodes"]), "length": float(sums["length"]) / n,
            "return": float(sums["return"]) / n, "win_rate": float(sums["wins"]) / n}


def rollout_fn(env: Environment, policy: Policy, num_envs: int, num_steps: int) -> Callable:
    """`run(key) -> checksum`: `num_steps` steps of `num_envs` auto-resetting envs under one lax.scan.

    The checksum sums observations and rewards so that XLA cannot skip computing them.
    """
    return _scan_policy(AutoReset(env), policy, num_envs, num_steps,
                        accumulate=lambda total, obs, reward, info: total + obs.sum() + reward.sum(),
                        init=lambda obs: obs.sum())


def throughput(envs_by_name: dict[str, Environment], policy: Policy = random_legal, num_envs: int = 1024,
               num_steps: int = 128, repeats: int = 2, seed: int = 0) -> dict[str, dict[str, float]]:
    """Compile seconds and env steps per second of each env's `rollout_fn`, side by side.

    The timed runs alternate between the envs (`repeats` rounds; compile excluded) so that a machine
    shared with other work slows all of them alike; the best round is kept. Besides wall-clock
    `steps_per_s`, `cpu_ms_per_step` is the process CPU time per step (all threads), which other
    processes disturb much less.
    """
    key = jax.random.PRNGKey(seed)
    compiled, out = {}, {}
    for name, env in envs_by_name.items():
        start = time.perf_counter()
        compiled[name] = jax.jit(rollout_fn(env, policy, num_envs, num_steps)).lower(key).compile()
        out[name] = {"compile_s": time.perf_counter() - start, "run_s": float("inf"), "cpu_s": float("inf")}
    for i in range(repeats):
        for name, fn in compiled.items():
            wall, cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(fn(jax.random.fold_in(key, i)))
            out[name]["run_s"] = min(out[name]["run_s"], time.perf_counter() - wall)
            out[name]["cpu_s"] = min(out[name]["cpu_s"], time.process_time() - cpu)
    for stats in out.values():
        stats["steps_per_s"] = num_envs * num_steps / stats["run_s"]
        stats["cpu_ms_per_step"] = 1e3 * stats.pop("cpu_s") / num_steps
    return out
