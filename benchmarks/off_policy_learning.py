"""Off-policy learners (DQN, PQN, SAC, TD3, TQC), several seeds in one program each, against the bars they are
held to: the greedy and training returns over the run, the first logged step where the seeds' mean reaches
the bar, means and min-max over seeds, curves.

    python benchmarks/off_policy_learning.py                               # every experiment, 3 seeds
    python benchmarks/off_policy_learning.py --experiments pendulum_sac,pendulum_td3 --update-results
    python benchmarks/off_policy_learning.py --from-run pendulum_sac=runs/pendulum_sac-...  # a jaxrl.train run
    python benchmarks/off_policy_learning.py --from-json                   # re-render the table and the plot

Each experiment trains with `jaxrl.train.run` at its own settings and budget (`--set EXPERIMENT:KEY=VALUE`
changes one), logging 20 times and evaluating greedily 10 times. `--from-run` reads a run made with
`python -m jaxrl.train --config=experiments/EXPERIMENT.py --config.num_seeds=N` instead (its metrics.jsonl and
config.json; the table names that command). Results: `off_policy_learning.json` and `off_policy_learning.png`
beside this file; a run replaces the experiments it covers and keeps the others. Peers side by side:
`off_policy.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from jaxrl import config as config_lib, train  # noqa: E402
import report  # noqa: E402
from env_suites import literal  # noqa: E402
from report import markdown_table, per_seed, publish, save_figure, seed_band  # noqa: E402

# experiment -> (the bar: return, within env steps, what it is)
EXPERIMENTS = {
    "cartpole_dqn": (475, 500_000, "greedy return >= 475 within 500k steps"),
    "cartpole_pqn": (475, 500_000, "greedy return >= 475 within 500k steps"),
    "pendulum_sac": (-200, 50_000, "mean return >= -200 within 50k steps"),
    "pendulum_td3": (-200, 50_000, "mean return >= -200 within 50k steps"),
    "pendulum_tqc": (-200, 50_000, "mean return >= -200 within 50k steps"),
}
MARKERS = ("<!-- off_policy_learning:start -->", "<!-- off_policy_learning:end -->")


def curves(rows: list[dict], seeds: int) -> dict:
    """metrics rows -> the training and greedy curves per seed."""
    training = [r for r in rows if per_seed(r, "episode_return", seeds, complete=True)]
    greedy = [r for r in rows if per_seed(r, "eval_return", seeds, complete=True)]
    return {"env_steps": [r["env_steps"] for r in training],
            "episode_return": [per_seed(r, "episode_return", seeds) for r in training],
            "eval_steps": [r["env_steps"] for r in greedy],
            "eval_return": [per_seed(r, "eval_return", seeds) for r in greedy]}


def train_experiment(experiment: str, seeds: int, workdir: str, overrides: dict) -> dict:
    config = config_lib.set_values(config_lib.from_file(os.path.join(ROOT, "experiments", f"{experiment}.py")),
                                   overrides)
    config.unlock()
    config.num_seeds, config.log.progress_bar = seeds, False
    batch = config.num_envs * config.num_steps
    config.log.every_steps = max(batch, config.total_steps // 20 // batch * batch)
    config.eval.every_steps = max(batch, config.total_steps // 10 // batch * batch)
    config.checkpoint.every_steps = config.total_steps
    tick = time.perf_counter()
    result = train.run(config, tempfile.mkdtemp(prefix=experiment + "-", dir=workdir))
    return {"experiment": experiment, "seeds": seeds, "total_steps": config.total_steps,
            "seconds": round(time.perf_counter() - tick, 1), **curves(result.metrics, seeds)}


def from_run(experiment: str, workdir: str) -> dict:
    with open(os.path.join(workdir, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    seeds = config["num_seeds"]
    command = (f"python -m jaxrl.train --config=experiments/{experiment}.py --config.num_seeds={seeds}"
               + "".join(f" --config.{k}={v}" for k, v in run_overrides(experiment, config).items()))
    return {"experiment": experiment, "seeds": seeds, "total_steps": config["total_steps"],
            "seconds": round(rows[-1]["wall_time"], 1), "command": command, **curves(rows, seeds)}


def run_overrides(experiment: str, saved: dict) -> dict:
    """The keys (dotted) where a saved run's config differs from the experiment's, logging keys aside."""
    default = config_lib.to_dict(config_lib.from_file(os.path.join(ROOT, "experiments", f"{experiment}.py")))

    def flat(tree, prefix=""):
        for key, value in tree.items():
            if isinstance(value, dict):
                yield from flat(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value
    ours = dict(flat(default))
    return {k: v for k, v in flat(saved) if k in ours and ours[k] != v and k not in ("num_seeds",)
            and not k.startswith(("log.", "checkpoint."))}


def first_reaching(steps: list, values: list, bar: float) -> str:
    """The first logged step at which the mean over seeds reaches `bar`."""
    for n, v in zip(steps, values):
        if np.mean(v) >= bar:
            return f"{n:,}"
    return "not reached"


def section(results: list[dict]) -> str:
    header = ["experiment", "seeds", "env steps", "training return at the end, mean [min, max]",
              "greedy return at the end, mean [min, max]", "first step: training mean >= bar",
              "first step: greedy mean >= bar", "wall s", "bar", "run"]
    rows, runs = [], {}
    for r in results:
        bar = EXPERIMENTS[r["experiment"]]
        final = lambda key: np.asarray(r[key][-1], float) if r[key] else None  # noqa: E731
        band = lambda x: "-" if x is None else f"{x.mean():.1f} [{x.min():.1f}, {x.max():.1f}]"  # noqa: E731
        rows.append([r["experiment"], r["seeds"], f"{r['total_steps']:,}", band(final("episode_return")),
                     band(final("eval_return")), first_reaching(r["env_steps"], r["episode_return"], bar[0]),
                     first_reaching(r["eval_steps"], r["eval_return"], bar[0]), f"{r['seconds']:.0f}", bar[2],
                     runs.setdefault((r["machine"], r["command"]), f"[{len(runs) + 1}]")])
    lines = [markdown_table(header, rows), ""]
    lines += [f"{mark} {machine}. Command: `{command}`." for (machine, command), mark in runs.items()]
    lines += ["", "Training return: episodes ended in each log interval; greedy: 16 to 32 episodes per seed at each "
              "evaluation. Curves: `benchmarks/off_policy_learning.png` (mean and min-max band over seeds)."]
    return "\n".join(lines)


def plot(results: list[dict]) -> str:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.2), squeeze=False)
    for ax, r in zip(axes[0], results):
        seed_band(ax, np.asarray(r["env_steps"]), np.asarray(r["episode_return"], float), "training")
        if r["eval_return"]:
            seed_band(ax, np.asarray(r["eval_steps"]), np.asarray(r["eval_return"], float), "greedy")
        bar = EXPERIMENTS[r["experiment"]]
        ax.axhline(bar[0], color="gray", linestyle="--", label="bar")
        ax.axvline(bar[1], color="gray", linestyle=":")
        ax.set_title(r["experiment"])
        ax.set_xlabel("env steps")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("return")
    return save_figure(fig, os.path.join(HERE, "off_policy_learning.png"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", default=",".join(EXPERIMENTS), help=f"from {', '.join(EXPERIMENTS)}")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="EXPERIMENT:KEY=VALUE")
    parser.add_argument("--from-run", action="append", default=[], metavar="EXPERIMENT=WORKDIR")
    parser.add_argument("--machine", help="with --from-run: the machine (and commit) the runs ran on, if not this "
                        "one as it is now (e.g. pinned to one core)")
    parser.add_argument("--update-results", action="store_true")
    parser.add_argument("--from-json", action="store_true")
    args = parser.parse_args()
    path = os.path.join(HERE, "off_policy_learning.json")
    saved = {}
    if os.path.exists(path):
        with open(path) as f:
            saved = {r["experiment"]: r for r in json.load(f)["results"]}
    machine = f"{report.machine()}, {time.strftime('%Y-%m-%d')}"

    def keep(result):
        saved[result["experiment"]] = result
        with open(path, "w") as f:  # after each experiment, so that a long run keeps what it finished
            json.dump({"results": [saved[e] for e in EXPERIMENTS if e in saved]}, f, indent=1)

    for item in args.from_run:
        experiment, _, workdir = item.partition("=")
        keep({**from_run(experiment, workdir), "machine": args.machine or machine})
    if not args.from_json and not args.from_run:
        experiments = args.experiments.split(",")
        unknown = [e for e in experiments if e not in EXPERIMENTS]
        if unknown:
            raise SystemExit(f"error: unknown experiments {unknown}; known: {', '.join(EXPERIMENTS)}")
        overrides = {}
        for item in args.set:
            experiment_key, _, value = item.partition("=")
            experiment, _, key = experiment_key.partition(":")
            overrides.setdefault(experiment, {})[key] = literal(value)
        command = " ".join(["python benchmarks/off_policy_learning.py", f"--experiments {args.experiments}",
                            f"--seeds {args.seeds}", *[f"--set {s}" for s in args.set]])
        with tempfile.TemporaryDirectory() as workdir:
            for experiment in experiments:
                result = train_experiment(experiment, args.seeds, workdir, overrides.get(experiment, {}))
                keep({**result, "machine": machine, "command": command})
    results = [saved[e] for e in EXPERIMENTS if e in saved]
    plot(results)
    publish(section(results), args.update_results, MARKERS, "Off-policy learners: DQN, PQN, SAC, TD3, TQC (issue 19)")


if __name__ == "__main__":
    main()
