"""More environments per update against a plateau: PPO at its tuned num_envs, co-scaled, and scaled naively.

    python benchmarks/co_scaling.py                      # Breakout-MinAtar, 64 -> 512 envs, 3 seeds, 3M steps
    python benchmarks/co_scaling.py --task gymnax:Breakout-MinAtar --num-envs 256 --budget 5000000 --update-results

Three variants of one task's tuned PPO config, each with `--seeds` seeds as one program, at equal env steps:
- tuned: the experiment's own num_envs (without the experiment's own `scale.num_envs`, if it sets one);
- co-scaled: `scale.num_envs=N` (`jaxrl.algos.ppo.co_scaled`): N envs, num_minibatches grown with them, so
  the minibatch size, learning rate, epochs and rollout length stay as tuned (the recipe of Beukman et al.,
  2026, "Preventing Learning Stagnation in PPO by Scaling to 1 Million Parallel Environments");
- naive: `num_envs=N` alone: the same minibatch count, so minibatches N / num_envs times larger and that
  many fewer gradient steps per env step.
All three in the same run of the script. Table and curves: benchmarks/results/co_scaling.md, `co_scaling.png`,
`co_scaling.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

import report
from env_suites import TASKS, train_task
from report import markdown_table, publish, save_figure, seed_band

HERE = os.path.dirname(os.path.abspath(__file__))
MARKERS = ("<!-- co_scaling:start -->", "<!-- co_scaling:end -->")


def variants(num_envs: int) -> dict[str, dict]:
    """The three variants' overrides of the experiment's config (whose own `scale.num_envs` is set aside)."""
    return {"tuned": {"scale.num_envs": 0}, f"co-scaled to {num_envs} envs": {"scale.num_envs": num_envs},
            f"naive: {num_envs} envs, same minibatch count": {"scale.num_envs": 0, "num_envs": num_envs}}


def section(saved: dict) -> str:
    header = ["variant", "num_envs x num_steps", "minibatches of", "gradient steps per 1M env steps",
              "return at the end, mean [min, max]", "best log row's mean", "wall s"]
    rows = []
    for r in saved["results"]:
        final = np.asarray(r["episode_return"][-1], float)
        means = np.asarray(r["episode_return"], float).mean(1)
        rows.append([r["variant"], f"{r['num_envs']} x {r['num_steps']}", f"{r['minibatch_size']:,}",
                     f"{r['grad_steps_per_million']:,.0f}", f"{final.mean():.1f} [{final.min():.1f}, {final.max():.1f}]",
                     f"{means.max():.1f}", f"{r['seconds']:.0f}"])
    return "\n".join([f"- Date: {saved['date']}. Machine: {saved['machine']}. Command: `{saved['command']}`.",
                      f"- {saved['task']}, {saved['seeds']} seeds per variant as one program, "
                      f"{saved['budget']:,} env steps per seed; training return (episodes ended in the log interval).",
                      "", markdown_table(header, rows), "", "Curves: `benchmarks/co_scaling.png`."])


def plot(saved: dict) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for r in saved["results"]:
        seed_band(ax, np.asarray(r["env_steps"]), np.asarray(r["episode_return"], float), r["variant"])
    ax.set_xlabel("env steps")
    ax.set_ylabel("training return")
    ax.set_title(saved["task"])
    ax.legend(fontsize=7)
    return save_figure(fig, os.path.join(HERE, "co_scaling.png"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="gymnax:Breakout-MinAtar", help=f"one of {', '.join(TASKS)}")
    parser.add_argument("--num-envs", type=int, default=512, help="the scaled number of envs per seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=3_000_000, help="env steps per seed")
    parser.add_argument("--update-results", action="store_true")
    parser.add_argument("--from-json", action="store_true")
    args = parser.parse_args()
    path = os.path.join(HERE, "co_scaling.json")
    if args.from_json:
        with open(path) as f:
            saved = json.load(f)
    else:
        if args.task not in TASKS:
            raise SystemExit(f"error: unknown --task {args.task!r}; known: {', '.join(TASKS)}")
        results = []
        with tempfile.TemporaryDirectory() as workdir:
            for name, overrides in variants(args.num_envs).items():
                result = train_task(args.task, args.seeds, args.budget, workdir, overrides)
                config = result["config"]
                batch = config["num_envs"] * config["num_steps"]
                minibatch = batch // config["optim"]["num_minibatches"]
                grad_steps = config["optim"]["num_epochs"] * config["optim"]["num_minibatches"] * 1_000_000 / batch
                results.append({**result, "variant": name, "num_envs": config["num_envs"],
                                "num_steps": config["num_steps"], "minibatch_size": minibatch,
                                "grad_steps_per_million": grad_steps})
        saved = {"task": args.task, "seeds": args.seeds, "budget": args.budget, "date": time.strftime("%Y-%m-%d"),
                 "machine": report.machine(), "command": "python benchmarks/co_scaling.py " + " ".join(sys.argv[1:]),
                 "results": results}
        with open(path, "w") as f:
            json.dump(saved, f, indent=1)
    plot(saved)
    publish(section(saved), args.update_results, MARKERS, "Co-scaling PPO with the number of environments (issue 18)")


if __name__ == "__main__":
    main()
