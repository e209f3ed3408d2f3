"""Tuning inside one program: PBT and successive halving against a grid of the same runs, at equal compute.

    python benchmarks/population.py --repeats 3 --update-results
    python benchmarks/population.py --config experiments/cartpole_ppo.py --total-steps 20480 --every-steps 2048

Each way trains the same runs (one per learning rate of `--learning-rates`, one seed each) of `--config`
(PPO on gymnax's Pendulum-v1 by default, where the learning rate matters and the return does not saturate
within the budget; CartPole reaches the 500 cap at every good rate within 20k steps) for `--total-steps` env
steps as one compiled program through `jaxrl.sweep.run_sweep`, so the compute is the same:

- **grid**: every learning rate trains to the end.
- **pbt**: every `--every-steps` the worst quarter of the runs copy a run of the best quarter and perturb its
  learning rate (x0.8 or x1.25, within the grid's range).
- **halving**: at 1/8, 1/4 and 1/2 of the steps the worse half of the learning rates are dropped and their
  runs continue the survivors'.

Each repeat uses another `config.seed`. The figure is the best run's final greedy return (`eval_return`, over
`eval.episodes` episodes at the end) among the runs that trained the whole budget, and the wall time,
compilation included. The first repeat's PBT lineage is saved as benchmarks/population_lineage.png.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository, for experiments/
from jaxrl import config as config_lib, metrics as metrics_lib, sweep  # noqa: E402
from jaxrl.run import population as population_lib  # noqa: E402
from jaxrl.run.summary import confidence_interval  # noqa: E402
from report import machine, markdown_table, publish  # noqa: E402  (benchmarks/ is on sys.path)

MARKERS = ("<!-- population:start -->", "<!-- population:end -->")
LINEAGE_PNG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "population_lineage.png")


def options(method: str, every_steps: int) -> population_lib.Options:
    if method == "pbt":
        return population_lib.Options(method="pbt", every_steps=every_steps)
    return population_lib.Options(method=method)


def best_final_return(workdir: str) -> float:
    """The highest final eval_return among the runs that trained to the end (every setting's last row)."""
    last_rows = [rows[-1] for name in os.listdir(workdir)
                 if (rows := metrics_lib.read(os.path.join(workdir, name, "metrics.jsonl")))]
    end = max(row["env_steps"] for row in last_rows)
    best = -np.inf
    for row in last_rows:
        if row["env_steps"] == end:
            values = [v for v in metrics_lib.per_seed(row, "eval_return", 1) or [] if v is not None]
            best = max([best, *values])
    return float(best)


def best_learning_rate(workdir: str, method: str) -> float:
    """The learning rate the best run ended with (population.csv, best first; the grid: the best setting's)."""
    if method == "grid":
        with open(os.path.join(workdir, "summary.csv")) as f:
            rows = list(csv.DictReader(f))
        return float(max(rows, key=lambda r: float(r["eval_return"]))["optim.learning_rate"])
    with open(os.path.join(workdir, "population.csv")) as f:
        return float(next(csv.DictReader(f))["optim.learning_rate"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="experiments/gymnax_ppo.py:Pendulum-v1")
    parser.add_argument("--learning-rates", default="3e-5,1e-4,3e-4,1e-3,2e-3,3e-3,1e-2,3e-2")
    parser.add_argument("--total-steps", default="150000,300000", help="budgets, comma-separated: a table each")
    parser.add_argument("--every-steps", type=int, default=25_000, help="PBT's decisions, and the metrics rows")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", default="grid,pbt,halving")
    parser.add_argument("--update-results", action="store_true")
    args = parser.parse_args()
    methods = args.methods.split(",")
    count = len(args.learning_rates.split(","))
    lines = [f"`{args.config}`, {count} runs (learning rates {args.learning_rates}, one seed each) in one program "
             f"per way, {args.repeats} repeats (config.seed 0..{args.repeats - 1}); PBT decides every "
             f"{args.every_steps:,} steps; halving at 1/8, 1/4, 1/2 of the budget.", ""]
    for i, total_steps in enumerate(int(x) for x in args.total_steps.split(",")):
        results = compare(args, methods, total_steps, save_lineage=i == 0)
        lines += [f"**{total_steps:,} env steps per run**", "", results_table(methods, results), ""]
    lines += [
        f"- Command: `python benchmarks/population.py --config {args.config} --repeats {args.repeats} "
        f"--total-steps {args.total_steps} --every-steps {args.every_steps}`",
        f"- Date: {time.strftime('%Y-%m-%d')}. Machine: {machine()}.",
        "- Equal compute: each way trains the same runs for the same steps (halving's dropped runs continue the "
        "survivors'). Wall time includes compilation. \"gain over grid\": the best return minus the grid's best "
        "in the same repeat (same seed), mean over repeats. Lineage of the first budget's repeat 0 PBT: "
        "`population_lineage.png`.",
    ]
    publish("\n".join(lines), args.update_results, MARKERS, "Tuning in one program: PBT and successive halving "
            "(issue 23)")


def compare(args, methods: list[str], total_steps: int, save_lineage: bool) -> dict:
    """{method: {"return", "seconds", "lr": [per repeat]}} at one budget (`save_lineage`: keep repeat 0's PBT
    lineage plot)."""
    results = {m: {"return": [], "seconds": [], "lr": []} for m in methods}
    for repeat in range(args.repeats):
        for method in methods:
            config = config_lib.from_file(args.config)
            config.unlock()
            config.seed, config.total_steps = repeat, total_steps
            config.log.every_steps, config.log.progress_bar = args.every_steps, False
            config.eval.every_steps, config.checkpoint.every_steps = 0, 0
            config, swept = sweep.sweep_from_flags(config, [("lr", args.learning_rates)])
            workdir = tempfile.mkdtemp(prefix=f"population-{method}-")
            tick = time.perf_counter()
            sweep.run_sweep(config, swept, workdir, options=options(method, args.every_steps))
            seconds = time.perf_counter() - tick
            results[method]["return"].append(best_final_return(workdir))
            results[method]["seconds"].append(seconds)
            results[method]["lr"].append(best_learning_rate(workdir, method))
            print(f"{total_steps} steps, repeat {repeat} {method}: best final greedy return "
                  f"{results[method]['return'][-1]:.1f}, {seconds:.1f} s, its learning rate "
                  f"{results[method]['lr'][-1]:.3g}", file=sys.stderr)
            if method == "pbt" and repeat == 0 and save_lineage:
                shutil.copy(os.path.join(workdir, "lineage.png"), LINEAGE_PNG)
            shutil.rmtree(workdir, ignore_errors=True)
    return results


def results_table(methods: list[str], results: dict) -> str:
    header = ["method", "best run's final greedy return, mean [95% CI]", "per repeat", "gain over grid",
              "its final lr", "wall s"]
    rows = []
    grid = np.array(results["grid"]["return"]) if "grid" in results else None
    for method in methods:
        returns = np.array(results[method]["return"])
        mean, low, high = confidence_interval(returns)
        gain = f"{np.mean(returns - grid):+.1f}" if grid is not None and method != "grid" else "-"
        rows.append([method, f"{mean:.1f} [{low:.1f}, {high:.1f}]", " ".join(f"{v:.1f}" for v in returns), gain,
                     " ".join(f"{v:.2g}" for v in results[method]["lr"]),
                     f"{np.mean(results[method]['seconds']):.1f}"])
    return markdown_table(header, rows)


if __name__ == "__main__":
    main()
