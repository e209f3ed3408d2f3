"""Multi-turn agents learning, 3 seeds each (issue 62's acceptance): the guessing game, GiGPO against trajectory-level
GRPO on the grid world at equal samples, and Countdown with the calculator against Countdown without it.

    python benchmarks/multi_turn_learning.py --runs-dir runs/multi_turn --update-results

Every run is `python -m jaxrl.train` on experiments/text_sft.py or experiments/text_grpo.py with the flags below (all
seeds of a run trained at once), then `python -m jaxrl.evaluate` on 1,024 held-out problems, greedy and sampled at
temperature 1. Runs and evaluations already in `--runs-dir` are reused, so an interrupted script picks up where it
stopped. The small transformer of the experiments (2 layers, width 128) throughout.

1. The guessing game (1..1024, 13 turns): SFT on 64,000 bisection demonstrations, then GRPO for 20,480 episodes.
2. The grid world (5 x 5, 12 moves): SFT on 3,200 shortest-path demonstrations (a weak warm start), then GRPO
   and GiGPO for 15,360 episodes each (no dynamic sampling: the same samples drawn per update).
3. Countdown (3 numbers): with the calculator (4 turns: up to three checks, then the answer; the demonstrations
   search, checking candidate expressions until one hits the target, and SFT imitates the hit and the answer, not
   the misses before it) and without it (one turn: the answer), each
   SFT on 32,000 demonstrations, then GRPO for 15,360 episodes (equal episodes); and without it for 61,440
   episodes (4x: at least the environment turns the calculator arm took).
"""

from __future__ import annotations

import datetime
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report import (evaluated, finished_run, fmt_ci, machine, markdown_table, publish, run_rows,  # noqa: E402
                    runs_arguments, save_figure, seed_band, seed_values, train_run)

MARKERS = ("<!-- multi_turn_learning:start -->", "<!-- multi_turn_learning:end -->")
SEEDS = 3
COMMON = ["--config.eval.pass_k=0", f"--config.num_seeds={SEEDS}"]
NO_CALCULATOR = ["--config.task.kwargs.calculator=False", "--config.task.kwargs.max_turns=1"]
# name -> (experiment, init_from run or None, flags); in the order they run
RUNS = {
    "sft_grid": ("text_sft.py:grid", None, ["--config.total_steps=3200", "--config.log.every_steps=1600",
                                            "--config.eval.every_steps=3200", "--config.eval.episodes=512",
                                            "--config.optim.warmup_updates=10"]),
    **{f"grid_{estimator}": ("text_grpo.py:grid", "sft_grid", [
        "--config.total_steps=15360", "--config.log.every_steps=1280", "--config.eval.every_steps=3840",
        "--config.eval.episodes=512", "--config.group.oversample=1", "--config.optim.learning_rate=3e-4",
        f"--config.advantage.estimator={estimator}"]) for estimator in ("grpo", "gigpo")},
    "sft_guess": ("text_sft.py:guess", None, ["--config.total_steps=64000", "--config.log.every_steps=16000",
                                              "--config.eval.every_steps=32000", "--config.eval.episodes=512"]),
    "guess_grpo": ("text_grpo.py:guess", "sft_guess", ["--config.total_steps=20480", "--config.log.every_steps=1280",
                                                       "--config.eval.every_steps=5120", "--config.eval.episodes=512",
                                                       "--config.group.oversample=1"]),
    **{f"sft_cd_{arm}": ("text_sft.py:countdown_tools", None, [
        "--config.total_steps=32000", "--config.log.every_steps=8000", "--config.eval.every_steps=16000",
        "--config.eval.episodes=512", *flags]) for arm, flags in (("calc", []), ("nocalc", NO_CALCULATOR))},
    **{f"cd_{arm}": ("text_grpo.py:countdown_tools", f"sft_cd_{arm}", [
        "--config.total_steps=15360", "--config.log.every_steps=1280", "--config.eval.every_steps=3840",
        "--config.eval.episodes=512", "--config.group.oversample=1", *flags])
        for arm, flags in (("calc", []), ("nocalc", NO_CALCULATOR))},
    # without the calculator for 4x the episodes: at least as many environment turns as the calculator arm took
    "cd_nocalc_x4": ("text_grpo.py:countdown_tools", "sft_cd_nocalc", [
        "--config.total_steps=61440", "--config.log.every_steps=5120", "--config.eval.every_steps=15360",
        "--config.eval.episodes=512", "--config.group.oversample=1", *NO_CALCULATOR]),
}


def train(runs_dir: str, name: str) -> None:
    experiment, init_from, flags = RUNS[name]
    train_run(runs_dir, name, experiment, init_from, [*flags, *COMMON])


def curve(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(episodes [T], per-seed values [T, S]) of a training metric."""
    rows = [r for r in rows if key in r]
    return (np.asarray([r["env_steps"] for r in rows]),
            np.asarray([r.get(f"{key}_per_seed") or [r[key]] * SEEDS for r in rows], np.float64))


def result_rows(runs_dir: str, names: list[str], labels: list[str]) -> list[list[str]]:
    rows = []
    for name, label in zip(names, labels):
        if not finished_run(os.path.join(runs_dir, name)):
            rows.append([label, "(not run)", "", "", ""])
            continue
        greedy, sampled = evaluated(runs_dir, name, False), evaluated(runs_dir, name, True)
        rows.append([label, fmt_ci(seed_values(sampled, "eval_success"), (0, 1)),
                     fmt_ci(seed_values(sampled, "eval_turns")), fmt_ci(seed_values(greedy, "eval_success"), (0, 1)),
                     fmt_ci(seed_values(greedy, "eval_turns"))])
    return rows


def main():
    args = runs_arguments(__doc__.split("\n")[0], RUNS, train)
    header = ["run", "success (sampled)", "turns (sampled)", "success (greedy)", "turns (greedy)"]
    guess = markdown_table(header, result_rows(args.runs_dir, ["sft_guess", "guess_grpo"],
                                               ["SFT, 64,000 demonstrations", "then GRPO, 20,480 episodes"]))
    grid = markdown_table(header, result_rows(args.runs_dir, ["sft_grid", "grid_grpo", "grid_gigpo"],
                                              ["SFT, 3,200 demonstrations", "then GRPO (trajectory), 15,360 episodes",
                                               "then GiGPO, 15,360 episodes"]))
    countdown_rows = []
    for arm, label in (("calc", "with the calculator (4 turns), 15,360 episodes"),
                       ("nocalc", "without (1 turn), 15,360 episodes"),
                       ("nocalc_x4", "without (1 turn), 61,440 episodes")):
        if not finished_run(os.path.join(args.runs_dir, f"cd_{arm}")):
            countdown_rows.append([label, "(not run)", "", "", ""])
            continue
        greedy = evaluated(args.runs_dir, f"cd_{arm}", False)
        sft = evaluated(args.runs_dir, f"sft_cd_{arm.removesuffix('_x4')}", False)
        steps, errors = curve(run_rows(os.path.join(args.runs_dir, f"cd_{arm}")), "tool_error_rate")
        _, calls = curve(run_rows(os.path.join(args.runs_dir, f"cd_{arm}")), "tool_calls")
        countdown_rows.append([label, fmt_ci(seed_values(sft, "eval_success"), (0, 1)),
                               fmt_ci(seed_values(greedy, "eval_success"), (0, 1)),
                               f"{calls[0].mean():.2f} -> {calls[-1].mean():.2f}",
                               f"{errors[0].mean():.3f} -> {errors[-1].mean():.3f}"])
    countdown = markdown_table(["Countdown", "SFT success (greedy)", "after GRPO (greedy)",
                                "tool calls per episode (first -> last update)", "tool-error rate (first -> last)"],
                               countdown_rows)
    section = "\n".join([
        f"{datetime.date.today()}, {machine()}; `python benchmarks/multi_turn_learning.py --runs-dir DIR "
        "--update-results`. 3 seeds per run, trained at once; held-out success on 1,024 problems with its 95% "
        "interval over seeds, sampled at temperature 1 and greedy.", "",
        "### The guessing game (1..1024, at most 13 turns)", "", guess, "",
        "### GiGPO against trajectory-level GRPO: the grid world, equal samples", "", grid, "",
        "### Countdown with and without the calculator, equal episodes", "", countdown, "",
        "![training curves](multi_turn_learning.png)"])
    publish(section, args.update_results, MARKERS, "Multi-turn agents learning (issue 62)",
            draw=lambda: plot(args.runs_dir))


def plot(runs_dir: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    panels = [("guessing game", ["guess_grpo"], "solved"), ("grid world", ["grid_grpo", "grid_gigpo"], "solved"),
              ("Countdown", ["cd_calc", "cd_nocalc"], "solved")]
    for ax, (title, names, key) in zip(axes, panels):
        for name in names:
            if not finished_run(os.path.join(runs_dir, name)):
                continue
            steps, values = curve(run_rows(os.path.join(runs_dir, name)), key)
            seed_band(ax, steps, values, name)
        ax.set_title(title)
        ax.set_xlabel("episodes")
        ax.set_ylabel("solved (training, sampled)")
        if ax.lines:
            ax.legend()
    save_figure(fig, os.path.join(os.path.dirname(os.path.abspath(__file__)), "multi_turn_learning.png"))


if __name__ == "__main__":
    main()
