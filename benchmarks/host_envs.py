"""PPO on environments stepped on the host (gymnasium's CartPole, Atari's Breakout through ale-py): env steps per
second of the synchronous update against Sebulba's layout (one device steps the envs while another learns from
the rollout before, `actor.max_staleness=1`, `mesh.split_actor`), all in this process; and the return each layout
reaches after the same env steps.

    python benchmarks/host_envs.py --update-results
    python benchmarks/host_envs.py --envs CartPole-v1 --steps 200000

Each layout is timed over `--updates` updates after its compiling ones (median of 3 chunks), with the CPU seconds
the process spent per update (every thread): the least CPU work per update over the machine's cores bounds how
fast any layout can go, and so does the actors' time (their host steps run one after another); the threaded
layout reports each side's time. Then each layout trains `--steps` env steps per seed (3 seeds; on Breakout the
synchronous run and Sebulba's) and the table gives the mean training return of the last log interval. On a CPU
the script gives the process 2 host devices (XLA_FLAGS, before jax starts).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report import fake_host_devices, machine, markdown_table, publish, timed_chunks, usable_cores  # noqa: E402

fake_host_devices(2)

MARKERS = ("<!-- host_envs:start -->", "<!-- host_envs:end -->")
LAYOUTS = {  # name -> (actor.max_staleness, mesh.split_actor, devices)
    "sync, 1 device": (0, False, 1),
    "sync, 2 devices (data parallel)": (0, False, 2),
    "lag one, 1 device": (1, False, 1),
    "lag one, actor + learner devices (Sebulba)": (1, True, 2),
}
ENVS = {  # env id -> (gymnasium.make keywords, config keys)
    "CartPole-v1": ({}, {}),
    # RAM observations; a network and epochs that make learning cost about as much as acting (where overlapping
    # the two can pay most)
    "ALE/Breakout-v5": ({"obs_type": "ram"}, {"network.hidden_sizes": (512, 512), "optim.num_epochs": 8}),
}


def layout_config(env_id: str, layout: str, seeds: int):
    from experiments.gymnasium_ppo import get_config
    from jaxrl import config as config_lib

    eta, split, devices = LAYOUTS[layout]
    kwargs, keys = ENVS[env_id]
    config = get_config(env_id)
    config = config_lib.set_values(config, {"actor.max_staleness": eta, "mesh.split_actor": split,
                                            "mesh.num_devices": devices, "num_seeds": seeds, "log.progress_bar": False,
                                            **keys})
    for key, value in kwargs.items():
        with config.env.kwargs.unlocked():
            config.env.kwargs[key] = value
    return config


def speed(env_id: str, updates: int, seeds: int) -> str:
    import jax

    from jaxrl import algos, mesh as mesh_lib

    header = ["layout", "ms per update", "env steps/s", "CPU s per update", "actor / learner ms (threads)",
              "against sync, 1 device"]
    rows, rates, cpu, per_update = [], {}, {}, {}
    for name in LAYOUTS:
        config = layout_config(env_id, name, seeds)
        algos.validate(config)
        algo, hp = algos.build(config, mesh_lib.mesh_for_runs(config.mesh, seeds))
        state = algo.init_seeds(0, seeds)
        state, _ = jax.block_until_ready(algo.run_chunk(state, hp, 2))
        state, per_update[name], cpu[name], chunks = timed_chunks(algo, state, hp, updates)
        sides = [[float(m[k].mean()) * 1e3 for k in ("actor_seconds", "learner_seconds") if k in m] for m in chunks]
        rates[name] = config.num_envs * config.num_steps * seeds / per_update[name]
        side = " / ".join(f"{statistics.median(s):.0f}" for s in zip(*sides)) or "-"
        rows.append([name, f"{per_update[name] * 1e3:.1f}", f"{rates[name]:,.0f}", f"{cpu[name]:.3f}", side])
        print(f"  {env_id}, {name}: {per_update[name] * 1e3:.1f} ms per update, {rates[name]:,.0f} env steps/s, "
              f"{cpu[name]:.3f} CPU s", flush=True)
    base = rates["sync, 1 device"]
    for row, name in zip(rows, LAYOUTS):
        row.append(f"{rates[name] / base:.2f}x")
    cores = usable_cores()
    least = min(cpu.values())
    return "\n".join([markdown_table(header, rows), "",
                      f"Bound: the least CPU work per update ({least:.3f} s) over {cores} cores would be "
                      f"{per_update['sync, 1 device'] / (least / cores):.2f}x the synchronous update on 1 device (the "
                      "actors' host steps run one after another, so the actor's time bounds it too); the best "
                      f"layout measured: {max(rates.values()) / base:.2f}x."])


def returns(env_id: str, steps: int, seeds: int, scratch: str, layouts) -> str:
    from jaxrl import config as config_lib, train

    header = ["layout", "training return, last interval (per seed)", "wall s"]
    rows = []
    for name in layouts:
        config = config_lib.set_values(layout_config(env_id, name, seeds), {"total_steps": steps,
                                                                           "eval.every_steps": 0})
        workdir = os.path.join(scratch, env_id.replace("/", "_"), name.replace(" ", "_").replace(",", ""))
        rows_out = train.run(config, workdir,
                             progress=False).metrics
        last = rows_out[-1]
        per_seed = last.get("episode_return_per_seed") or [last["episode_return"]]
        rows.append([name, f"{last['episode_return']:.1f} ({', '.join(f'{x:.0f}' for x in per_seed)})",
                     f"{last['wall_time']:.0f}"])
        print(f"  {env_id}, {name}: return {last['episode_return']:.1f}", flush=True)
    return markdown_table(header, rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default=",".join(ENVS), help=f"of {', '.join(ENVS)}")
    parser.add_argument("--updates", type=int, default=10, help="updates per timed chunk")
    parser.add_argument("--seeds", type=int, default=1, help="seeds in one program, for the timing")
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per seed for the returns (0: none)")
    parser.add_argument("--update-results", action="store_true", help="update benchmarks/results/host_envs.md")
    args = parser.parse_args(argv)
    chosen = [e for e in args.envs.split(",") if e]
    if [e for e in chosen if e not in ENVS]:
        parser.error(f"--envs are of {', '.join(ENVS)}")
    command = "python benchmarks/host_envs.py " + " ".join(argv if argv is not None else sys.argv[1:])
    parts = [f"`{command.strip()}` ({datetime.date.today()}; {machine()}).", "",
             f"PPO (experiments/gymnasium_ppo.py) on envs stepped on the host; {args.updates} updates per timed chunk, "
             f"median of 3, {args.seeds} seed(s) per program."]
    for env_id in chosen:
        keys = ", ".join(f"{k}={v}" for k, v in ENVS[env_id][1].items())
        parts += ["", f"**{env_id}**{f' (RAM observations; {keys})' if env_id.startswith('ALE') else ''}:", "",
                  speed(env_id, args.updates, args.seeds)]
    if args.steps:
        with tempfile.TemporaryDirectory() as scratch:
            for env_id in chosen:  # (Breakout: the synchronous run and Sebulba's)
                layouts = list(LAYOUTS) if env_id == "CartPole-v1" else [next(iter(LAYOUTS)), list(LAYOUTS)[-1]]
                parts += ["", f"{env_id} after {args.steps:,} env steps per seed, 3 seeds per layout:", "",
                          returns(env_id, args.steps, 3, scratch, layouts)]
    publish("\n".join(parts), args.update_results, MARKERS, "PPO on host environments (issue 61)")


if __name__ == "__main__":
    main()
