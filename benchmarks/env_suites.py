"""PPO on the environment libraries' tasks, several seeds in one program, beside published PPO figures.

    python benchmarks/env_suites.py                                   # every task at its default budget
    python benchmarks/env_suites.py --tasks gymnax:Acrobot-v1,gymnax:Pendulum-v1 --seeds 3 --update-results
    python benchmarks/env_suites.py --tasks craftax:classic --budget craftax:classic=5000000
    python benchmarks/env_suites.py --from-json                      # re-render the table and the plot
    python benchmarks/env_suites.py --tasks gymnax:Pendulum-v1 --blines ~/gymnax-blines   # + the reference, measured

A run replaces the tasks it trains in `env_suites.json` and keeps the others, each with its own command and date.

Each task is an experiment file and its argument (`TASKS`), trained by `jaxrl.train.run` with `--seeds` seeds
as one program, at the budget of its reference figure unless `--budget` says otherwise (this machine's
budget is stated in the table). The table gives the training return (mean of the last log row's seeds, the
min and max over seeds) and the final greedy evaluation, beside the reference. Curves: `env_suites.json` and
`env_suites.png` next to this file.

With `--blines DIR` (a checkout of gymnax-blines), each gymnax task also measures its reference: the authors' PPO
checkpoint and our final policies each play `--eval-episodes` episodes from random starts with sampled actions,
the protocol of the checkpoint's own log, and with the distribution's mode (`gymnax_blines.py`).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
import time

import numpy as np

from jaxrl import algos, config as config_lib, train
import report
from report import markdown_table, per_seed, publish, save_figure, seed_band

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # experiment files import each other (`experiments.cartpole_ppo`)
# task -> (experiment file, its argument, the reference: (return, env steps, source))
# gymnax's references are its authors' PPO checkpoints (gymnax-blines, agents/<env>/ppo.pkl): the last evaluation
# in each checkpoint's own training log (164 episodes, sampled actions). The gymnax README's table gives one figure
# for "PPO, ES" per env: -80 (Acrobot), 28 (Breakout) and -130 (Pendulum), the last being the ES checkpoint's
# (39.6M steps); the PPO checkpoint's log ends at -200.6.
BLINES = "gymnax-blines PPO checkpoint's last evaluation"
TASKS = {
    "gymnax:Acrobot-v1": ("gymnax_ppo", "Acrobot-v1", (-78.9, 495_984, f"{BLINES} (README: -80)")),
    "gymnax:Pendulum-v1": ("gymnax_ppo", "Pendulum-v1", (-200.6, 991_968, f"{BLINES} (README: -130, ES's)")),
    "gymnax:Breakout-MinAtar": ("gymnax_ppo", "Breakout-MinAtar", (22.9, 9_919_936, f"{BLINES} (README: 28)")),
    "brax:halfcheetah": ("brax_ppo", "halfcheetah", None),
    # Craftax-Classic mirrors Crafter, whose paper gives PPO's figures at 1M steps (score 4.6%); the Craftax paper's
    # PPO reaches 90% of the maximum return (22) at 1B steps, out of this machine's reach
    "craftax:classic": ("craftax_ppo", "classic", (4.2, 1_000_000, "Crafter paper's PPO (Hafner 2021)")),
}
MARKERS = ("<!-- env_suites:start -->", "<!-- env_suites:end -->")


def train_task(task: str, seeds: int, budget: int | None, workdir: str, overrides: dict | None = None,
               blines: str | None = None, eval_episodes: int = 1024) -> dict:
    """Train one task's seeds as one program (its config with `overrides`, dotted keys); returns its curve and
    final figures (with `blines`, a gymnax-blines checkout, also `same_protocol`: see `same_protocol`)."""
    experiment, arg, _ = TASKS[task]
    config = config_lib.from_file(os.path.join(os.path.dirname(HERE), "experiments", f"{experiment}.py:{arg}"))
    config = algos.resolve(config_lib.set_values(config, overrides or {}))  # the batch below is the one it trains
    config.unlock()
    config.num_seeds = seeds
    config.log.progress_bar = False
    if budget:
        config.total_steps = budget
    batch = config.num_envs * config.num_steps
    config.log.every_steps = max(batch, (config.total_steps // 20) // batch * batch)
    config.eval.every_steps = 0  # one greedy evaluation, at the end
    config.checkpoint.every_steps = config.total_steps
    tick = time.perf_counter()
    result = train.run(config, tempfile.mkdtemp(prefix=task.replace(":", "-") + "-", dir=workdir))
    seconds = time.perf_counter() - tick
    rows = [r for r in result.metrics if per_seed(r, "episode_return", seeds, complete=True)]
    last = result.metrics[-1]
    measured = {}
    if blines and task.startswith("gymnax:"):
        measured = {"same_protocol": same_protocol(config, result.state.params, blines, eval_episodes)}
    return {**measured, "task": task, "seeds": seeds, "env_steps": [r["env_steps"] for r in rows],
            "episode_return": [per_seed(r, "episode_return", seeds) for r in rows],
            "eval_return": per_seed(last, "eval_return", seeds), "total_steps": config.total_steps,
            "seconds": round(seconds, 1), "config": config_lib.to_dict(config),
            "extra": {k: v for k, v in last.items() if k.startswith("Achievements/") or k == "score"}}


def same_protocol(config, params, blines: str, episodes: int) -> dict:
    """Our trained policies (params leaves [S, ...]) and the gymnax-blines PPO checkpoint of the same env, each
    over `episodes` episodes: mean returns with sampled actions and with the mode ({"ours_sampled": [S],
    "ours_mode": [S], "reference_sampled", "reference_mode", "episodes", "reference_log": the checkpoint's last
    logged (steps, return)})."""
    import jax

    import gymnax_blines
    from jaxrl import mesh as mesh_lib

    env_id = config.env.kwargs.env_id
    algo, _ = algos.build(config, mesh_lib.make_mesh())
    key = jax.random.PRNGKey(12345)
    checkpoint = gymnax_blines.load(os.path.expanduser(blines), env_id)
    out = {"episodes": episodes, "reference_log": [checkpoint["log_steps"][-1], checkpoint["log_return"][-1]]}
    for sample, name in ((True, "sampled"), (False, "mode")):
        out[f"ours_{name}"] = np.asarray(algo.evaluate(params, key, episodes, sample)["eval_return"]).tolist()
        out[f"reference_{name}"] = float(gymnax_blines.episode_returns(checkpoint, env_id, key, episodes, sample).mean())
    return out


def literal(text: str):
    """A --set value as Python reads it (256, 0.5, True, "relu"), else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def at_steps(result: dict, steps: int) -> str:
    """The training return (mean over seeds) of the last log row at or before `steps`, with its step count."""
    rows = [i for i, n in enumerate(result["env_steps"]) if n <= steps * 1.01]  # log rows fall on whole updates
    if not rows:
        return "-"
    i = rows[-1]
    return f"{np.mean(result['episode_return'][i]):.1f} ({result['env_steps'][i]:,})"


def section(results: list[dict]) -> str:
    header = ["task", "seeds", "env steps", "training return, mean [min, max]", "greedy return, mean",
              "wall s", "reference (steps)", "ours at the reference's steps", "run"]
    rows, runs = [], {}
    for r in results:
        final = np.asarray(r["episode_return"][-1], float)
        reference = TASKS[r["task"]][2]
        rows.append([r["task"], r["seeds"], f"{r['total_steps']:,}",
                     f"{final.mean():.1f} [{final.min():.1f}, {final.max():.1f}]",
                     f"{np.mean(r['eval_return']):.1f}" if r["eval_return"] else "-", f"{r['seconds']:.0f}",
                     f"{reference[0]} ({reference[1]:,}): {reference[2]}" if reference else "none found",
                     at_steps(r, reference[1]) if reference else "-",
                     runs.setdefault((r["machine"], r["command"]), f"[{len(runs) + 1}]")])
    lines = [markdown_table(header, rows), ""]
    lines += [f"{mark} {machine}. Command: `{command}`." for (machine, command), mark in runs.items()]
    for r in results:
        if r["extra"]:
            unlocked = {k.split("/")[1]: round(v, 1) for k, v in r["extra"].items() if k.startswith("Achievements/") and v}
            lines += ["", f"{r['task']}: score {r['extra'].get('score', 0):.2f}; achievements unlocked (% of "
                      f"episodes in the last log interval): {unlocked or 'none'}"]
    measured = [r for r in results if r.get("same_protocol")]
    if measured:
        header = ["task", "episodes", "jaxrl, sampled actions, mean [min, max] over seeds", "gymnax-blines PPO, sampled",
                  "jaxrl, mode", "gymnax-blines PPO, mode", "checkpoint's own log at its end"]
        rows = []
        for r in measured:
            m = r["same_protocol"]
            ours = np.asarray(m["ours_sampled"])
            rows.append([r["task"], f"{m['episodes']:,}", f"{ours.mean():.1f} [{ours.min():.1f}, {ours.max():.1f}]",
                         f"{m['reference_sampled']:.1f}", f"{np.mean(m['ours_mode']):.1f}",
                         f"{m['reference_mode']:.1f}", f"{m['reference_log'][1]:.1f} ({m['reference_log'][0]:,})"])
        lines += ["", "The references measured here (`--blines`): our final policies and the authors' PPO checkpoint on "
                  "as many episodes from random starts, each to the env's time limit.", "",
                  markdown_table(header, rows)]
    lines += ["", "Curves: `benchmarks/env_suites.png` (training return, mean and min-max band over seeds)."]
    return "\n".join(lines)


def plot(results: list[dict]) -> str:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.2), squeeze=False)
    for ax, r in zip(axes[0], results):
        seed_band(ax, np.asarray(r["env_steps"]), np.asarray(r["episode_return"], float), "jaxrl PPO")
        reference = TASKS[r["task"]][2]
        if reference:
            ax.axhline(reference[0], color="gray", linestyle="--", label=f"reference at {reference[1]:,}")
        ax.set_title(r["task"])
        ax.set_xlabel("env steps")
    axes[0][0].set_ylabel("training return")
    return save_figure(fig, os.path.join(HERE, "env_suites.png"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, from {', '.join(TASKS)}")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", action="append", default=[], help="TASK=ENV_STEPS (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="TASK:KEY=VALUE",
                        help="a config key for one task, e.g. craftax:classic:scale.num_envs=256 (repeatable)")
    parser.add_argument("--blines", help="a gymnax-blines checkout: measure the gymnax references (see above)")
    parser.add_argument("--eval-episodes", type=int, default=1024, help="episodes of each policy with --blines")
    parser.add_argument("--update-results", action="store_true")
    parser.add_argument("--from-json", action="store_true")
    args = parser.parse_args()
    path = os.path.join(HERE, "env_suites.json")
    saved = {}  # task -> its latest result; a run replaces the tasks it trained and keeps the others
    if os.path.exists(path):
        with open(path) as f:
            saved = {r["task"]: r for r in json.load(f)["results"]}
    if not args.from_json:
        tasks = args.tasks.split(",")
        unknown = [t for t in tasks if t not in TASKS]
        if unknown:
            raise SystemExit(f"error: unknown tasks {unknown}; known: {', '.join(TASKS)}")
        budgets = dict(b.split("=") for b in args.budget)
        if args.blines:  # before any training: a wrong path would otherwise surface after the first task
            import gymnax_blines
            missing = [gymnax_blines.checkpoint_path(os.path.expanduser(args.blines), TASKS[t][1])
                       for t in tasks if t.startswith("gymnax:")]
            missing = [path for path in missing if not os.path.exists(path)]
            if missing:
                raise SystemExit(f"error: --blines {args.blines}: no PPO checkpoint at {', '.join(missing)}")
        overrides = {}  # task -> {key: value}
        for item in args.set:
            task_key, _, value = item.partition("=")
            task, _, key = task_key.rpartition(":")
            overrides.setdefault(task, {})[key] = literal(value)
        machine = f"{report.machine()}, {time.strftime('%Y-%m-%d')}"
        command = "python benchmarks/env_suites.py " + " ".join(
            [f"--tasks {args.tasks}", f"--seeds {args.seeds}", *[f"--budget {b}" for b in args.budget],
             *[f"--set {item}" for item in args.set],
             *([f"--blines <gymnax-blines checkout> --eval-episodes {args.eval_episodes}"] if args.blines else [])])
        with tempfile.TemporaryDirectory() as workdir:
            for task in tasks:
                result = train_task(task, args.seeds, int(budgets[task]) if task in budgets else None, workdir,
                                    overrides.get(task), args.blines, args.eval_episodes)
                saved[task] = {**result, "machine": machine, "command": command}
                with open(path, "w") as f:  # after each task, so that a long suite keeps what it finished
                    json.dump({"results": [saved[t] for t in TASKS if t in saved]}, f, indent=1)
    results = [saved[t] for t in TASKS if t in saved]
    plot(results)
    publish(section(results), args.update_results, MARKERS, "PPO on gymnax, Brax and Craftax (issue 18)")


if __name__ == "__main__":
    main()
