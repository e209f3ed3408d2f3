"""QMIX on SMAX against JaxMARL's own recurrent QMIX script, in the same run: speed and win rates at equal env steps.

Runs JaxMARL's `baselines/QLearning/qmix_rnn.py` (from a checkout of the JaxMARL repository, one process per
seed: `benchmarks/jaxmarl_reference.py --algorithm qmix`), then ours twice through the whole `jaxrl.train`
loop, one seed per run as the script trains: experiments/smax_qmix.py with the script's recipe
(`reference_recipe`) and experiments/smax_qmix.py as it is. Prints env steps per second of the whole loop
(compilation and the runs' own evaluations included) with ratios to the reference, and the training win rate
at equal env steps; ours also reports its final greedy win rate, the script its last greedy test. No figure
from another run enters a ratio.

    python benchmarks/smax_qmix.py --jaxmarl-repo PATH                                 # 3m, 1 seed, 204,800 steps
    python benchmarks/smax_qmix.py --jaxmarl-repo PATH --seeds 3 --total-steps 1000000 --update-results

The reference needs its own dependencies: `pip install -e ".[bench]"` (jaxmarl, flashbax, hydra-core,
omegaconf, wandb). A JaxMARL checkout: `git clone` the FLAIROx/JaxMARL repository anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import report  # noqa: E402  benchmarks/
from jaxmarl_reference import check_reference, run_in_subprocess  # noqa: E402

MARKERS = ("<!-- smax_qmix:start -->", "<!-- smax_qmix:end -->")
JSON_PATH = os.path.join(ROOT, "benchmarks", "smax_qmix.json")
MARK_EVERY = 8  # updates (of 16 envs x 128 steps) between the compared marks


def reference_recipe(config) -> None:
    """experiments/smax_qmix.py moved to the script's ql_rnn_smax.yaml: GRU 512 (and dense layers of 512),
    mixer embedding 64 with hypernetworks of 256, learning rate 5e-5, target copy every 10 updates (80
    gradient steps, as ours), 10,000 steps before learning. What stays ours: Adam (the script's RAdam),
    sequences of 64 steps sampled anywhere in the buffer from a zero state (the script's whole 128-step
    rollouts from a reset), a dense layer after the GRU (the script reads Q off the GRU)."""
    config.network.update({"fc_size": 512, "rnn_size": 512})
    config.mixer.update({"embed_size": 64, "hypernet_size": 256})
    config.optim.learning_rate = 5e-5


def run_ours(scenario: str, seed: int, total_steps: int, recipe: bool) -> dict:
    """One `jaxrl.train` run of experiments/smax_qmix.py (with `reference_recipe` when `recipe`)."""
    from jaxrl import config as config_lib, train

    config = config_lib.from_file(os.path.join(ROOT, "experiments", f"smax_qmix.py:{scenario}"))
    if recipe:  # (a locked config takes new values for its keys)
        reference_recipe(config)
    config.total_steps, config.seed = total_steps, seed
    config.log.every_steps = MARK_EVERY * config.num_envs * config.num_steps
    config.log.progress_bar = False
    config.eval.every_steps = 0  # at the end only
    config.checkpoint.every_steps = 0
    with tempfile.TemporaryDirectory() as workdir:
        tick = time.perf_counter()
        result = train.run(config, workdir)
        wall = time.perf_counter() - tick
    rows = [{"env_steps": r["env_steps"], "win_rate": r.get("win_rate")} for r in result.metrics]
    return {"rows": rows, "wall": wall, "env_steps": rows[-1]["env_steps"],
            "greedy_win_rate": result.metrics[-1].get("eval_win_rate")}


def run_reference(repo: str, scenario: str, seed: int, total_steps: int) -> dict:
    """The script in a process of its own, its rows averaged over the MARK_EVERY updates before each mark."""
    result = run_in_subprocess(repo, "qmix", scenario, seed, total_steps, MARK_EVERY)
    return {**result, "greedy_win_rate": result.pop("last")["test_win_rate"]}


def render(results: dict, meta: dict) -> str:
    """Markdown: speed with ratios, then the training win rate at equal env steps (mean over seeds)."""
    from jaxrl.metrics import markdown_table

    labels = {"reference": "JaxMARL qmix_rnn.py (ql_rnn_smax.yaml)", "recipe": "jaxrl, the script's recipe",
              "ours": "jaxrl, experiments/smax_qmix.py"}
    speed = {side: statistics.mean(r["env_steps"] / r["wall"] for r in runs) for side, runs in results.items()}
    speed_rows = [[labels[side], f"{speed[side]:,.0f}", f"{speed[side] / speed['reference']:.2f}x",
                   ", ".join(f"{r['wall']:.0f}" for r in runs),
                   ", ".join(f"{r['greedy_win_rate']:.2f}" for r in runs)] for side, runs in results.items()]
    marks, wins = report.curve([run for runs in results.values() for run in runs])  # [marks], [[every run]]
    sides = [0, *itertools.accumulate(len(runs) for runs in results.values())]  # each side's runs in a row
    win_rows = [[f"{mark:,}", *(f"{statistics.mean(row[a:b]):.2f}" for a, b in zip(sides, sides[1:]))]
                for mark, row in zip(marks, wins)]
    return (f"- Date: {meta['date']}. Machine: {meta['machine']}. jax {meta['jax']}. JaxMARL at {meta['commit']}.\n"
            f"- Command: `{meta['command']}`\n\n"
            + markdown_table(["", "env steps/s, whole loop incl. compile", "x reference", "wall s per seed",
                              "greedy win rate at the end"], speed_rows)
            + "\n\nTraining win rate (epsilon-greedy; mean over seeds):\n\n"
            + markdown_table(["env steps", *(labels[side] for side in results)], win_rows))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jaxmarl-repo", required=True, help="a checkout of the JaxMARL repository")
    parser.add_argument("--scenario", default="3m")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--total-steps", type=int, default=204_800)
    parser.add_argument("--machine", default=None, help="how the results page names the machine (default: found)")
    parser.add_argument("--update-results", action="store_true", help="update benchmarks/results/smax_qmix.md")
    args = parser.parse_args(argv)
    problem = check_reference(args.jaxmarl_repo, "qmix")
    if problem:
        parser.error(problem)

    import jax

    results = {"reference": [], "recipe": [], "ours": []}
    for seed in range(args.seeds):
        results["reference"].append(run_reference(args.jaxmarl_repo, args.scenario, seed, args.total_steps))
        results["recipe"].append(run_ours(args.scenario, seed, args.total_steps, recipe=True))
        results["ours"].append(run_ours(args.scenario, seed, args.total_steps, recipe=False))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.jaxmarl_repo, capture_output=True,
                            text=True).stdout.strip() or "an unversioned copy"
    meta = {"date": datetime.date.today().isoformat(), "scenario": args.scenario,
            "machine": args.machine or report.machine(),
            "jax": jax.__version__, "commit": commit, "command": "python benchmarks/smax_qmix.py " + " ".join(argv or sys.argv[1:])}
    text = f"### {args.scenario}: {args.seeds} seed(s), {args.total_steps:,} env steps\n\n" + render(results, meta)
    print(text)
    with open(JSON_PATH, "w") as f:
        json.dump({"results": results, "meta": meta}, f)
    if args.update_results:
        report.replace_section(os.path.join(ROOT, "benchmarks", "results", "smax_qmix.md"), MARKERS, text,
                               "QMIX on SMAX vs JaxMARL's qmix_rnn.py (benchmarks/smax_qmix.py)")


if __name__ == "__main__":
    main()
