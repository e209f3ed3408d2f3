"""RL on harder problems than the supervised warm start saw: held-out greedy accuracy before and after,
for two advantage estimators over several seeds.

    python benchmarks/text_rl.py --update-results
    python benchmarks/text_rl.py --sft-dir runs/sft_countdown --estimators grpo,rloo --rl-steps 64000

1. SFT: `experiments/text_sft.py:<task>` for `--sft-steps` samples, a checkpoint every eighth. Its own
   held-out curve shows where it flattened, and every checkpoint is also scored on the RL task's held-out
   set, so the table shows that more SFT would not have closed the gap either. `--sft-dir` reuses a run.
2. RL: `experiments/text_grpo.py:<task>` with `--rl-task` options (harder problems: Countdown numbers up to
   50 where SFT saw up to 25), from the SFT run's last checkpoint, once per estimator; each run trains
   all its seeds at once (vmapped), so its wall time covers every seed.

Prints a markdown table (base accuracy, accuracy after RL at fractions of the budget, gain, the wall
time at which each seed first gained 20 points) and saves a plot; with --update-results both replace the
section between the text_rl markers in benchmarks/results/text_rl.md.
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

from report import machine as report_machine, markdown_table, per_seed, publish, save_figure, seed_band  # noqa: E402
from smax_mappo import experiment_config  # noqa: E402

MARKERS = ("<!-- text_rl:start -->", "<!-- text_rl:end -->")
GAIN = 0.20  # the acceptance's gain in held-out greedy accuracy


def parse_options(text: str) -> dict:
    """"max_number=50,use_all=false" -> {"max_number": 50, "use_all": False}."""
    options = {}
    for item in filter(None, text.split(",")):
        key, value = item.split("=")
        options[key] = json.loads(value.lower()) if value.lower() in ("true", "false") else json.loads(value)
    return options


def train_sft(args, workdir: str) -> list[dict]:
    from jaxrl import train

    config = experiment_config("text_sft", args.task)
    config.total_steps = args.sft_steps
    config.eval.every_steps = config.checkpoint.every_steps = args.sft_steps // 8
    config.checkpoint.keep = 8
    return train.run(config, workdir, progress=False).metrics


def sft_run(args, scratch: str) -> str:
    """The SFT run's directory: `--sft-dir` when it holds a run, else a run trained there (or in `scratch`)."""
    sft_dir = args.sft_dir or os.path.join(scratch, "sft")
    if not os.path.exists(os.path.join(sft_dir, "tokenizer.json")):
        train_sft(args, sft_dir)
    return sft_dir


def add_task_arguments(parser) -> None:
    """The options of the SFT warm start and the RL task that the text benchmarks share."""
    parser.add_argument("--task", default="countdown")
    parser.add_argument("--rl-task", default="max_number=50", help="task options of the RL runs (harder problems)")
    parser.add_argument("--sft-steps", type=int, default=640_000, help="SFT samples (when no run is reused)")
    parser.add_argument("--sft-dir", default="", help="the SFT run: reused if it holds one, else trained there")
    parser.add_argument("--seeds", type=int, default=3)


def rl_config(args, sft_dir: str, estimator: str, total_steps: int, evals: int = 8):
    """experiments/text_grpo.py:<task> from the SFT run, with the RL task's options, `total_steps` completions
    per seed and `evals` held-out evaluations."""
    config = experiment_config("text_grpo", args.task)
    config.init_from, config.advantage.estimator, config.num_seeds = sft_dir, estimator, args.seeds
    for key, value in parse_options(args.rl_task).items():
        config.task.kwargs[key] = value
    config.total_steps = total_steps
    config.eval.every_steps = total_steps // evals
    config.checkpoint.every_steps = total_steps
    return config


def sft_checkpoints_on_rl_task(args, sft_dir: str) -> list[tuple[int, float]]:
    """(samples seen, held-out greedy accuracy on the RL task) for every saved SFT checkpoint."""
    import jax

    from jaxrl import algos, checkpoint, mesh as mesh_lib
    from jaxrl.run.saved import start_params

    config = rl_config(args, sft_dir, "grpo", args.rl_steps)
    config.num_seeds = 1
    algo, _ = algos.build(config, mesh_lib.make_mesh())
    manager = checkpoint.Checkpointer(os.path.join(sft_dir, "checkpoints"))
    steps = manager.steps()
    manager.close()
    batch = json.load(open(os.path.join(sft_dir, "config.json")))["num_prompts"]
    out = []
    for step in steps:
        params = start_params(sft_dir, step)
        accuracy = algo.evaluate(params, jax.random.PRNGKey(0), config.eval.episodes)["eval_accuracy"]
        out.append((step * batch, float(np.mean(accuracy))))
    return out


def curve(rows: list[dict], num_seeds: int):
    """(completions per seed [n], wall seconds [n], accuracy per seed [n, S]) at the evaluated rows."""
    points = [(r["env_steps"], r["wall_time"], per_seed(r, "eval_accuracy", num_seeds, complete=True)) for r in rows]
    points = [p for p in points if p[2] is not None]
    return (np.array([p[0] for p in points]), np.array([p[1] for p in points]),
            np.array([p[2] for p in points]))


def seconds_to_gain(wall: np.ndarray, accuracy: np.ndarray, base: float) -> list[float | None]:
    """Per seed, the wall time of the first evaluation at least GAIN above `base` (None: never)."""
    reached = accuracy >= base + GAIN - 1e-9
    return [float(wall[np.argmax(reached[:, s])]) if reached[:, s].any() else None
            for s in range(accuracy.shape[1])]


def fmt(values) -> str:
    return f"{np.mean(values):.3f} +- {np.std(values):.3f}"


def plot(sft_rows, sft_on_rl, base, runs, path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    own = [(r["env_steps"], r["eval_accuracy"]) for r in sft_rows if "eval_accuracy" in r]
    left.plot([x / 1e3 for x, _ in own], [y for _, y in own], marker="o", markersize=3, label="SFT task (held out)")
    left.plot([x / 1e3 for x, _ in sft_on_rl], [y for _, y in sft_on_rl], marker="s", markersize=3,
              label=f"RL task ({args.rl_task})")
    left.set(xlabel="SFT samples (thousands)", ylabel="greedy held-out accuracy", ylim=(-0.02, 1.02),
             title=f"SFT on {args.task}")
    for name, (steps, _, accuracy) in runs.items():
        x = np.concatenate([[0], steps]) / 1e3
        y = np.concatenate([np.full((1, accuracy.shape[1]), base), accuracy])
        seed_band(right, x, y, name)
    right.axhline(base + GAIN, color="grey", linestyle="--", linewidth=1, label=f"base + {GAIN:.2f}")
    right.set(xlabel="RL completions per seed (thousands)", ylabel="greedy held-out accuracy (min-max over seeds)",
              ylim=(-0.02, 1.02), title=f"RL on {args.task} ({args.rl_task})")
    save_figure(fig, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_task_arguments(parser)
    parser.add_argument("--rl-steps", type=int, default=102_400,
                        help="RL completions per seed, a multiple of 8 log intervals (8 x 2560)")
    parser.add_argument("--estimators", default="grpo,dr_grpo")
    parser.add_argument("--plot", default=os.path.join(ROOT, "benchmarks", "text_rl.png"))
    parser.add_argument("--update-results", action="store_true", help="update benchmarks/results/text_rl.md")
    args = parser.parse_args(argv)

    from jaxrl import advantages, train

    log_every = experiment_config("text_grpo", args.task).log.every_steps
    if args.rl_steps % (8 * log_every):
        parser.error(f"--rl-steps must be a multiple of {8 * log_every} (8 evaluations at log intervals)")
    estimators = [e for e in args.estimators.split(",") if e]
    for e in estimators:
        advantages.get(e)  # a misspelt name fails before any training
    command = "python benchmarks/text_rl.py " + " ".join(argv if argv is not None else sys.argv[1:])
    machine = report_machine()
    print(f"{args.task}: SFT {args.sft_steps:,} samples, RL ({args.rl_task}) {args.rl_steps:,} completions x "
          f"{args.seeds} seeds, {machine}", flush=True)

    with tempfile.TemporaryDirectory() as scratch:
        sft_dir = sft_run(args, scratch)
        with open(os.path.join(sft_dir, "metrics.jsonl")) as f:
            sft_rows = [json.loads(line) for line in f]
        sft_on_rl = sft_checkpoints_on_rl_task(args, sft_dir)
        base = sft_on_rl[-1][1]
        print(f"  SFT: {sft_rows[-1]['wall_time']:.0f} s; on the RL task by checkpoint: "
              + ", ".join(f"{a:.3f}@{s // 1000}k" for s, a in sft_on_rl), flush=True)
        runs, walls = {}, {}
        for estimator in estimators:
            config = rl_config(args, sft_dir, estimator, args.rl_steps)
            rows = train.run(config, os.path.join(scratch, f"rl_{estimator}"), progress=False).metrics
            runs[estimator], walls[estimator] = curve(rows, args.seeds), rows[-1]["wall_time"]
            print(f"  RL {estimator}: {walls[estimator]:.0f} s, final {fmt(runs[estimator][2][-1])}", flush=True)

    own = [r["eval_accuracy"] for r in sft_rows if "eval_accuracy" in r]
    marks = [args.rl_steps // 4, args.rl_steps // 2, args.rl_steps]
    header = ["estimator", "base", *(f"@{m // 1000}k" for m in marks), "gain", f"s to +{GAIN:.2f} per seed",
              "wall s (all seeds)"]
    table = []
    for name, (steps, wall, accuracy) in runs.items():
        at = [fmt(accuracy[np.searchsorted(steps, m)]) for m in marks]
        reached = ", ".join("-" if t is None else f"{t:.0f}" for t in seconds_to_gain(wall, accuracy, base))
        table.append([name, f"{base:.3f}", *at, f"{np.mean(accuracy[-1]) - base:+.3f}", reached, f"{walls[name]:.0f}"])
    plot(sft_rows, sft_on_rl, base, runs, args.plot, args)
    section = "\n".join([
        f"`{command.strip()}` ({datetime.date.today()}, {machine}).",
        "",
        f"SFT ({args.sft_steps:,} samples, {sft_rows[-1]['wall_time']:.0f} s): held-out greedy accuracy on its own "
        f"task over its last three evaluations {', '.join(f'{a:.3f}' for a in own[-3:])}; its checkpoints on the RL "
        f"task: {', '.join(f'{a:.3f} at {s // 1000}k' for s, a in sft_on_rl)}. RL from the last one, "
        f"{args.seeds} seeds per estimator trained together; accuracy mean +- std over seeds:",
        "", markdown_table(header, table), "",
        f"![SFT then RL on {args.task}]({os.path.relpath(args.plot, os.path.join(ROOT, 'benchmarks'))})"])
    publish(section, args.update_results, MARKERS, "GRPO on tokens: RL past the warm start (issue 6)")


if __name__ == "__main__":
    main()
