"""A CartPole PPO sweep (16 seeds x 3 learning rates) as one compiled program, against the same 48 runs one
after another.

    python benchmarks/sweep.py --seeds 16 --learning-rates 1e-4,3e-4,1e-3 --update-results

All three ways train `experiments/cartpole_ppo.py` (5e5 env steps per run, evaluation every 1e5 steps,
checkpoints every 1e5, a metrics row every 25k) through the library's own loop, and are timed from the
call to the last metrics row, compilation included:

- **sweep**: `jaxrl.sweep.run_sweep`, the 48 runs vmapped in one program (what `python -m jaxrl.sweep`
  runs, minus the interpreter start).
- **sequential**: `jaxrl.train.run` once per (learning rate, seed), as a loop over `python -m jaxrl.train`
  would (minus 48 interpreter starts): each run builds and compiles its program.
- **sequential, compiled once**: the best case for one-at-a-time runs: one compiled 1-run program reused
  for all 48 (init, then every update in one `run_chunk`; no evaluation, logging or checkpoints). It
  bounds what any sequential runner could reach.

The sweep's seed s of every learning rate starts from the same key; the sequential runs use
`--config.seed=s`. Final greedy returns are shown per learning rate to show that all three learn alike.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository, for experiments/
from experiments import cartpole_ppo  # noqa: E402
from jaxrl import algos, mesh as mesh_lib, sweep, train  # noqa: E402
from report import machine, markdown_table, publish  # noqa: E402  (benchmarks/, the script's folder, is on sys.path)

MARKERS = ("<!-- sweep:start -->", "<!-- sweep:end -->")


def base_config(total_steps: int):
    config = cartpole_ppo.get_config()
    config.total_steps = total_steps
    config.log.progress_bar = False
    return config


def run_as_sweep(config, num_seeds: int, learning_rates: list[float], workdir: str):
    """(seconds, {lr: final eval returns per seed})."""
    config = config.copy_and_resolve_references()
    config.num_seeds = num_seeds
    tick = time.perf_counter()
    summary = sweep.run_sweep(config, {"optim.learning_rate": learning_rates}, workdir, progress=False)
    seconds = time.perf_counter() - tick
    return seconds, {lr: [float(v) for v in row["eval_return_per_seed"].split()]
                     for lr, row in zip(learning_rates, summary)}


def run_one_by_one(config, num_seeds: int, learning_rates: list[float], workdir: str):
    """(seconds, {lr: final eval returns per seed}): `train.run` per run, each compiling its own program."""
    returns = {}
    tick = time.perf_counter()
    for lr in learning_rates:
        returns[lr] = []
        for seed in range(num_seeds):
            one = config.copy_and_resolve_references()
            one.seed, one.optim.learning_rate = seed, lr
            result = train.run(one, os.path.join(workdir, f"lr{lr:g}-seed{seed}"), progress=False)
            returns[lr].append(result.metrics[-1]["eval_return"])
    return time.perf_counter() - tick, returns


def run_compiled_once(config, num_seeds: int, learning_rates: list[float]):
    """(seconds, compile seconds, {lr: final eval returns per seed}): one 1-run program for every run."""
    algo, hp = algos.build(config, mesh_lib.make_mesh())
    updates = algo.settings.num_updates
    returns = {}
    tick = time.perf_counter()
    for lr in learning_rates:
        returns[lr] = []
        for seed in range(num_seeds):
            state = algo.init_seeds(seed, 1)
            state, _ = algo.run_chunk(state, hp.replace(learning_rate=jnp.float32(lr)), updates)
            evaluation = algo.evaluate(state.params, jax.random.PRNGKey(seed), config.eval.num_envs)
            returns[lr].append(float(evaluation["eval_return"][0]))
    return time.perf_counter() - tick, algo.compile_seconds, returns


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--learning-rates", default="1e-4,3e-4,1e-3")
    parser.add_argument("--total-steps", type=int, default=500_000)
    parser.add_argument("--skip-sequential", action="store_true", help="time only the sweep")
    parser.add_argument("--update-results", action="store_true", help="update benchmarks/results/sweep.md")
    args = parser.parse_args()
    learning_rates = [float(x) for x in args.learning_rates.split(",")]
    config = base_config(args.total_steps)
    runs = args.seeds * len(learning_rates)
    steps = algos.build(config, mesh_lib.make_mesh())[0].settings.num_updates * config.num_envs * config.num_steps

    timings = {}
    with tempfile.TemporaryDirectory() as tmp:
        timings["sweep (one program)"] = run_as_sweep(config, args.seeds, learning_rates, os.path.join(tmp, "sweep"))
        if not args.skip_sequential:
            timings["sequential (48 programs)".replace("48", str(runs))] = run_one_by_one(
                config, args.seeds, learning_rates, os.path.join(tmp, "one"))
            seconds, compile_seconds, returns = run_compiled_once(config, args.seeds, learning_rates)
            timings[f"sequential, compiled once ({compile_seconds:.1f} s compile)"] = (seconds, returns)

    sweep_seconds = timings["sweep (one program)"][0]
    header = ["how", "wall s", "env steps/s", "sweep speed-up",
              *(f"eval return, lr {lr:g}" for lr in learning_rates)]
    rows = []
    for name, (seconds, returns) in timings.items():
        cells = []
        for lr in learning_rates:
            mean, low, high = sweep.confidence_interval(returns[lr])
            cells.append(f"{mean:.1f} [{low:.1f}, {high:.1f}]")
        rows.append([name, f"{seconds:.1f}", f"{runs * steps / seconds:,.0f}", f"{seconds / sweep_seconds:.2f}x",
                     *cells])
    devices = jax.devices()
    section = "\n".join([
        f"- Date: {time.strftime('%Y-%m-%d')}. Machine: {machine()}, {len(devices)} JAX device(s).",
        f"- {args.seeds} seeds x {len(learning_rates)} learning rates = {runs} runs of {steps:,} env steps "
        "(experiments/cartpole_ppo.py).",
        "- Wall time includes compilation; \"sweep speed-up\" is each way's wall time over the sweep's.",
        "  Eval return: greedy, 32 episodes, mean and 95% interval over seeds.",
        "",
        "    " + " ".join(["python benchmarks/sweep.py", f"--seeds {args.seeds}",
                           f"--learning-rates {args.learning_rates}", f"--total-steps {args.total_steps}"]),
        "",
        markdown_table(header, rows),
    ])
    publish(section, args.update_results, MARKERS, "Sweeps: one program against one run at a time (issue 7)")


if __name__ == "__main__":
    sys.exit(main())
