"""Where one PPO update's time goes: each phase compiled alone, as the training loop runs it.

    python benchmarks/profile_ppo.py                                         # experiments/smax_mappo.py:3m
    python benchmarks/profile_ppo.py --config experiments/smax_mappo.py:2s3z --num-envs 128
    python benchmarks/profile_ppo.py --set network.kind=mlp --set optim.num_epochs=2

Every phase runs for one seed under the same `shard_map` over the mesh and `vmap` over runs as
`run_chunk`, is compiled once, and is timed as the median of `--repeats` calls of `--updates`
repetitions each (a `lax.fori_loop` inside the program, so dispatch is not what is measured):

    rollout            T steps of the env and the networks (with the bootstrap values at time limits)
    rollout + GAE      ... plus the last value, GAE and laying the samples out for minibatches (`PPO.units`)
    one gradient step  the loss, its gradient and the optimiser on one minibatch (x epochs x minibatches)
    whole update       what `run_chunk` runs per update
    host per chunk     `jaxrl.train`'s work between chunks (metrics to host, logging), from two short runs

The phases overlap (the whole update holds the others), so the table gives each one's share of it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report import machine  # noqa: E402


def load_config(spec: str, overrides: list[str], num_envs: int | None):
    from jaxrl import algos, config as config_lib

    config = config_lib.from_file(os.path.join(ROOT, spec))
    if num_envs:
        config.num_envs = num_envs
    for item in overrides:
        key, _, text = item.partition("=")
        current = config_lib.get_value(config, key)
        value = (text.lower() in ("1", "true")) if isinstance(current, bool) else type(current)(text)
        config_lib.set_value(config, key, value)
    algos.validate(config)
    return config


def phase_programs(algo, hp):
    """{phase: f(state, hp, reps) -> state-independent output}, each jitted like run_chunk."""
    import jax
    import jax.numpy as jnp

    from jaxrl import mesh as mesh_lib
    from jaxrl import engine

    s, ppo = algo.settings, algo.parts  # (the record's PPO: its rollout, units, loss and update)

    def repeated(body):
        """body(state, hp) -> array; run `reps` times, each time on a key that depends on the last result."""
        def run(state, hp, reps):
            def step(_, acc):
                key = jax.random.fold_in(state.key, acc.astype(jnp.int32))
                return acc + body(state.replace(key=key), hp)
            return jax.lax.fori_loop(0, reps, step, mesh_lib.varying(jnp.float32(0)))
        return run

    def rollout(state, hp):
        _, traj, _ = ppo.rollout(state, state.key)
        return jnp.sum(traj.log_prob)

    def rollout_and_gae(state, hp):
        units = ppo.units(state, hp, *ppo.rollout(state, state.key)[:2])[0]
        batches = engine.deal_minibatches(state.key, units, s.num_minibatches)
        return jnp.sum(batches["advantages"])

    def gradient_steps(state, hp):
        """epochs x minibatches gradient steps on one fixed minibatch (its contents do not change the cost)."""
        units = ppo.units(state, hp, *ppo.rollout(state, state.key)[:2])[0]
        batch = jax.tree.map(lambda x: x[0], engine.deal_minibatches(state.key, units, s.num_minibatches))
        optimizer = engine.make_optimizer(hp.learning_rate, hp.max_grad_norm, s.optimizer.adam_eps,
                                          s.optimizer.grad_clip)

        def step(carry, _):
            params, opt_state = carry
            params, opt_state, aux = engine.gradient_step(ppo.loss, optimizer, params, opt_state, batch, hp)
            return (params, opt_state), aux["grad_norm"]

        _, norms = jax.lax.scan(step, (state.params, state.opt_state), None, s.num_epochs * s.num_minibatches)
        return jnp.sum(norms)

    def whole_update(state, hp):
        state, metrics = ppo.update(state, hp)
        return jnp.sum(metrics["policy_loss"]) + jnp.sum(state.update_step)

    phases = {"rollout": rollout, "rollout + GAE + dealing": rollout_and_gae,
              "gradient steps (rollout and GAE once, then epochs x minibatches)": gradient_steps,
              "whole update": whole_update}
    programs = {}
    for name, body in phases.items():
        def local(state, hp, reps, body=body):
            return jax.vmap(repeated(body), (0, 0, None))(state, hp, reps)[:, None]  # [S, 1 per device]
        programs[name] = local
    return programs


def time_program(algo, fn, state, hp, reps: int, repeats: int) -> tuple[float, float]:
    """(compile seconds, median seconds per repetition) of fn under run_chunk's shard_map and jit."""
    import jax
    from jax.sharding import PartitionSpec as P

    from jaxrl import mesh as mesh_lib
    from jaxrl.mesh import DATA_AXIS, RUN_AXIS, RUNS

    specs = algo.state_specs(state)
    sharded = jax.shard_map(fn, mesh=algo.mesh, in_specs=(specs, RUNS, P()), out_specs=P(RUN_AXIS, DATA_AXIS),
                            check_vma=algo.vma_checks)
    hp = mesh_lib.runs_of(hp, state.update_step.shape[0], algo.mesh)
    tick = time.perf_counter()
    compiled = jax.jit(sharded).lower(state, hp, reps).compile(dict(algo.settings.xla_options) or None)
    compile_s = time.perf_counter() - tick
    jax.block_until_ready(compiled(state, hp, 1))
    times = []
    for _ in range(repeats):
        tick = time.perf_counter()
        jax.block_until_ready(compiled(state, hp, reps))
        times.append((time.perf_counter() - tick) / reps)
    return compile_s, statistics.median(times)


def short_run(config, updates: int) -> float:
    """Wall seconds of a `jaxrl.train` run of `updates` updates that logs after every update."""
    from jaxrl import train

    config = config.copy_and_resolve_references()
    batch = config.num_envs * config.num_steps
    with config.unlocked():
        config.total_steps = updates * batch
        config.log.every_steps = batch  # a chunk per update: the most host work per env step
        config.log.progress_bar = False
        config.eval.every_steps = 0
        config.checkpoint.every_steps = updates * batch
    with tempfile.TemporaryDirectory() as workdir:
        tick = time.perf_counter()
        train.run(config, workdir)
        return time.perf_counter() - tick


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="experiments/smax_mappo.py:3m")
    parser.add_argument("--num-envs", type=int, default=128, help="0: the config's")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    parser.add_argument("--updates", type=int, default=3, help="repetitions inside one call")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    from jaxrl import algos, host, mesh as mesh_lib

    host.keep_freed_memory()
    config = load_config(args.config, args.set, args.num_envs)
    algo, hp = algos.build(config, mesh_lib.make_mesh())
    state = algo.init_seeds(config.seed, 1)
    s = algo.settings
    print(f"{args.config} {' '.join(args.set)}: {s.num_envs} envs x {s.num_steps} steps, {algo.parts.policy.num_agents} agents, "
          f"{s.num_epochs} epochs x {s.num_minibatches} minibatches, network {config.network.kind}; "
          f"machine: {machine()}")
    rows = []
    for name, fn in phase_programs(algo, hp).items():
        compile_s, seconds = time_program(algo, fn, state, hp, args.updates, args.repeats)
        rows.append((name, seconds, compile_s))
        print(f"  {name}: {seconds * 1e3:.0f} ms per update ({compile_s:.1f} s to compile)", flush=True)
    whole = rows[-1][1]
    # Two runs that differ only in their number of chunks: compiling, the final checkpoint and evaluation cancel.
    short, longer = short_run(config, 4), short_run(config, 12)
    host_s = (longer - short) / 8 - whole
    print("\n| phase | ms per update | share of the whole update |\n|---|---:|---:|")
    for name, seconds, _ in rows:
        print(f"| {name} | {seconds * 1e3:.0f} | {seconds / whole:.0%} |")
    print(f"| host work per chunk (jaxrl.train between chunks: metrics to the host, logging) | "
          f"{host_s * 1e3:.0f} | {host_s / whole:.0%} |")
    print(f"\nwhole update: {s.batch_size / whole:,.0f} env steps/s on the device. The host row: jaxrl.train runs "
          f"of 4 and 12 one-update chunks took {short:.1f} s and {longer:.1f} s; (difference / 8) - whole update. "
          "The default config logs every 4 updates.")


if __name__ == "__main__":
    main()
