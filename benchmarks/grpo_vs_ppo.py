"""Critic-free GRPO variants against MAPPO on SMAX, at equal env steps, several seeds.

    python benchmarks/grpo_vs_ppo.py                      # 3m, 3 seeds, 1M env steps per seed
    python benchmarks/grpo_vs_ppo.py --variants grpo,median --env-steps 500000 --update-results
    python benchmarks/grpo_vs_ppo.py --from-json benchmarks/grpo_vs_ppo.json --env-steps 360000  # re-render

Every run trains all its seeds at once (vmapped). The x axis is env steps actually taken: for MAPPO every
step of its rollouts, for GRPO the steps of its episodes (a group rollout computes `num_steps` steps per
env and masks the ones after a battle ended; those are not counted here, but they cost time, so wall
seconds are reported too). Prints a markdown table of win rates (training, and greedy evaluation) at
fractions of the budget, mean +- std over seeds, and saves a plot; with --update-results the table and
plot link replace the section between the grpo_vs_ppo markers in benchmarks/results/grpo_vs_ppo.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report import machine, per_seed, publish, save_figure, seed_band  # noqa: E402
from smax_mappo import experiment_config  # noqa: E402

MARKERS = ("<!-- grpo_vs_ppo:start -->", "<!-- grpo_vs_ppo:end -->")
# A group rollout takes roughly this share of its computed steps on 3m (battles end early); the GRPO
# budget is set from it and the curves are cut at the requested env steps.
GRPO_STEP_SHARE = 0.13  # measured 0.142 with to_go returns (2026-11-22); a margin so the budget is met


def taken_steps(rows: list[dict], num_seeds: int, algorithm: str) -> np.ndarray:
    """Cumulative env steps taken per seed at each row."""
    if algorithm == "ppo":
        return np.array([r["env_steps"] for r in rows], float)
    per_row = [(r.get("episodes") or 0) / num_seeds * (r.get("episode_length") or 0) for r in rows]
    return np.cumsum(per_row)


def run(name: str, config, num_seeds: int) -> dict:
    from jaxrl import train

    with tempfile.TemporaryDirectory() as workdir:
        result = train.run(config, workdir, progress=False)
    rows = result.metrics
    return {"name": name, "rows": rows, "steps": taken_steps(rows, num_seeds, config.algorithm),
            "wall": rows[-1]["wall_time"], "num_seeds": num_seeds}


def value_at(run_result: dict, key: str, steps: float) -> list[float] | None:
    """Per-seed `key` at the first row (with that key) whose taken steps reach `steps`, within 3%: runs
    end on whole updates, and GRPO's taken steps only approximately meet the budget."""
    for row, taken in zip(run_result["rows"], run_result["steps"]):
        if taken >= steps * 0.97:
            values = per_seed(row, key, run_result["num_seeds"], complete=True)
            if values is not None:
                return values
    return None


def grpo_budget(config, env_steps: int):
    """Set a GRPO config's computed steps so that its episodes take about `env_steps` per seed (whole updates),
    with 8 evaluations and one checkpoint at the end."""
    batch = config.num_envs * config.num_steps
    config.total_steps = max(batch, int(env_steps / GRPO_STEP_SHARE) // batch * batch)
    config.eval.every_steps = config.total_steps // 8
    config.checkpoint.every_steps = config.total_steps
    return config


def win_rate_table(results: list[dict], env_steps: int) -> list[str]:
    """Markdown lines: per run, greedy win rates at a quarter, half and all of `env_steps` taken, the training
    win rate at the end and the wall seconds (mean +- std over seeds)."""
    marks = [env_steps // 4, env_steps // 2, env_steps]
    header = ("| run | " + " | ".join(f"greedy win @{m / 1e6:.2g}M" for m in marks)
              + f" | training win @{marks[-1] / 1e6:.2g}M | wall s (all seeds) |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for r in results:
        greedy = [fmt(value_at(r, "eval_win_rate", m)) for m in marks]
        lines.append(f"| {r['name']} | " + " | ".join(greedy)
                     + f" | {fmt(value_at(r, 'win_rate', marks[-1]))} | {r['wall']:.0f} |")
    return lines


def save_curves(results: list[dict], plot_path: str) -> None:
    """The runs' raw curves beside the plot (its path with .json), to render tables again without training."""
    with open(os.path.splitext(plot_path)[0] + ".json", "w") as f:
        json.dump([{"name": r["name"], "steps": list(map(float, r["steps"])), "rows": r["rows"]} for r in results], f)


def load_curves(paths: list[str], num_seeds: int) -> list[dict]:
    """The runs that `save_curves` wrote to each of `paths`, as `run` returns them."""
    results = []
    for path in paths:
        with open(path) as f:
            results += [dict(r, steps=np.array(r["steps"]), wall=r["rows"][-1]["wall_time"], num_seeds=num_seeds)
                        for r in json.load(f)]
    return results


def fmt(values: list[float] | None) -> str:
    return "-" if values is None else f"{np.mean(values):.2f} +- {np.std(values):.2f}"


def plot(results: list[dict], path: str, env_steps: int, scenario: str, title: str = "GRPO variants vs MAPPO") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for r in results:
        points = [(s, per_seed(row, "eval_win_rate", r["num_seeds"], complete=True)) for row, s in zip(r["rows"], r["steps"])]
        points = [(s, v) for s, v in points if v is not None and s <= env_steps * 1.05]
        if not points:
            continue
        x = np.array([p[0] for p in points]) / 1e6
        y = np.array([p[1] for p in points])
        seed_band(ax, x, y, r["name"])
    ax.set_xlabel("env steps taken per seed (millions)")
    ax.set_ylabel("greedy win rate (mean, min-max over seeds)")
    ax.set_title(f"SMAX {scenario}: {title}")
    ax.set_ylim(-0.02, 1.02)
    save_figure(fig, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="3m")
    parser.add_argument("--env-steps", type=int, default=1_000_000, help="env steps taken per seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--variants", default="grpo,dr_grpo,rloo,median",
                        help="GRPO advantage estimators, comma-separated (median runs groups of 9)")
    parser.add_argument("--no-mappo", action="store_true")
    parser.add_argument("--plot", default=os.path.join(ROOT, "benchmarks", "grpo_vs_ppo.png"))
    parser.add_argument("--update-results", action="store_true", help="update benchmarks/results/grpo_vs_ppo.md")
    parser.add_argument("--from-json", default="", help="re-render the table and plot from the raw curves a "
                        "previous run saved (its --plot path with .json), without training")
    args = parser.parse_args(argv)

    import jax

    from jaxrl import advantages

    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        advantages.get(v)  # fail on a misspelt name before any training
    command = "python benchmarks/grpo_vs_ppo.py " + " ".join(argv if argv is not None else sys.argv[1:])
    ran_on = f"{machine()}, {jax.device_count()} device(s)"
    print(f"{args.scenario}, {args.env_steps:,} env steps per seed, {args.seeds} seeds, {ran_on}", flush=True)

    results = []
    if args.from_json:
        results = load_curves([args.from_json], args.seeds)
        variants, args.no_mappo = [], True
    if not args.no_mappo:
        config = experiment_config("smax_mappo", args.scenario)
        config.num_seeds, config.total_steps = args.seeds, args.env_steps
        config.eval.every_steps = args.env_steps // 8
        config.checkpoint.every_steps = args.env_steps
        results.append(run("MAPPO (experiments/smax_mappo.py)", config, args.seeds))
        print(f"  MAPPO done in {results[-1]['wall']:.0f} s", flush=True)
    for variant in variants:
        config = experiment_config("smax_grpo", args.scenario)
        config.advantage.estimator, config.num_seeds = variant, args.seeds
        if variant == "median":  # MC-GRPO: one extra sample per group, the median pivot carries no gradient
            config.group.size += 1
            config.num_envs = config.num_envs // (config.group.size - 1) * config.group.size
        results.append(run(f"GRPO advantage={variant}", grpo_budget(config, args.env_steps), args.seeds))
        print(f"  GRPO {variant} done in {results[-1]['wall']:.0f} s; "
              f"{results[-1]['steps'][-1]:,.0f} env steps taken per seed", flush=True)

    lines = win_rate_table(results, args.env_steps)
    plot(results, args.plot, args.env_steps, args.scenario)
    if not args.from_json:
        save_curves(results, args.plot)
    section = "\n".join([
        f"`{command.strip()}` ({datetime.date.today()}, {ran_on}): "
        f"SMAX {args.scenario}, {args.seeds} seeds per run trained together, win rates mean +- std over seeds "
        f"at equal env steps taken per seed (GRPO: steps of its episodes, not the masked steps it computes).",
        "", *lines, "", f"![GRPO variants vs MAPPO]({os.path.relpath(args.plot, os.path.join(ROOT, 'benchmarks'))})"])
    publish(section, args.update_results, MARKERS, "GRPO variants vs MAPPO on SMAX (issue 5)")


if __name__ == "__main__":
    main()
