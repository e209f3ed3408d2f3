"""Multi-turn agents learning, 3 seeds each (issue 62's acceptance): the guessing game, GiGPO against trajectory-level
GRPO on the grid world at equal samples, and Countdown with the calculator against Countdown without it.

    python benchmarks/multi_turn_learning.py --runs-dir runs/multi_turn --update-results

Every run is `python -m jaxrl.train` on experiments/text_sft.py or experiments/text_grpo.py with the flags below (all
seeds of a run trained at once), then `python -m jaxrl.evaluate` on 1,024 held-out problems, greedy and sampled at
temperature 1. Runs and evaluations already in `--runs-dir` are reused, so an interrupted script picks up where it
stopped. Each comparison below is a section of the results page with its own figure, published (with
`--update-results`) only from a runs directory that holds all of its runs finished, so `--only=RUN,...` on a new
directory updates the sections it completes and leaves the others as they are. The small transformer of the
experiments (2 layers, width 128) throughout.

1. The guessing game (1..1024, 13 turns): SFT on 64,000 bisection demonstrations, then GRPO for 20,480 episodes.
2. The grid world (5 x 5, 12 moves): SFT on 3,200 shortest-path demonstrations (a weak warm start), then GRPO
   and GiGPO for 15,360 episodes each (no dynamic sampling: the same samples drawn per update).
3. Countdown (3 numbers): with the calculator (4 turns: up to three checks, then the answer; the demonstrations
   search, checking candidate expressions until one hits the target, and SFT imitates the hit and the answer, not
   the misses before it) and without it (one turn: the answer), each
   SFT on 128,000 demonstrations, then GRPO for 15,360 episodes (equal episodes); and without it for 61,440
   episodes (4x: at least the environment turns the calculator arm took). Then each arm's SFT run continued at
   learning rate 3e-4 on 64,000 and then 16,000 more demonstrations, the calculator arm's rolled in (DAgger,
   `sft.roll_in`: the model's own first check, then the demonstrator: a hit answered, a miss followed by a check of
   the reference; half of them with the check sampled, then all with it greedy), and GRPO for 15,360 episodes from
   each (208,000 demonstrations per arm).
"""

from __future__ import annotations

import collections
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report import (evaluated, fmt_ci, markdown_table, publish_sections, run_rows, runs_arguments,  # noqa: E402
                    save_figure, seed_band, seed_values, train_run)

SEEDS = 3
COMMON = ["--config.eval.pass_k=0", f"--config.num_seeds={SEEDS}"]
NO_CALCULATOR = ["--config.task.kwargs.calculator=False", "--config.task.kwargs.max_turns=1"]
CONTINUED_SFT = ["--config.eval.episodes=512", "--config.optim.learning_rate=3e-4", "--config.optim.warmup_updates=10"]
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
        "--config.total_steps=128000", "--config.log.every_steps=16000", "--config.eval.every_steps=64000",
        "--config.eval.episodes=512", "--config.checkpoint.every_steps=16000", *flags])
        for arm, flags in (("calc", []), ("nocalc", NO_CALCULATOR))},
    **{f"cd_{arm}": ("text_grpo.py:countdown_tools", f"sft_cd_{arm}", [
        "--config.total_steps=15360", "--config.log.every_steps=1280", "--config.eval.every_steps=3840",
        "--config.eval.episodes=512", "--config.group.oversample=1", *flags])
        for arm, flags in (("calc", []), ("nocalc", NO_CALCULATOR))},
    # without the calculator for 4x the episodes: at least as many environment turns as the calculator arm took
    "cd_nocalc_x4": ("text_grpo.py:countdown_tools", "sft_cd_nocalc", [
        "--config.total_steps=61440", "--config.log.every_steps=5120", "--config.eval.every_steps=15360",
        "--config.eval.episodes=512", "--config.group.oversample=1", *NO_CALCULATOR]),
    # Then each arm's SFT run continued at learning rate 3e-4 (DAgger for the calculator arm: `sft.roll_in`), equal
    # demonstrations: 64,000 (the calculator's half rolled in, its first check sampled), then 16,000 (every one
    # rolled in, its first check greedy: the states a greedy evaluation reaches); then GRPO as above.
    **{f"sft_cd_{arm}_more": ("text_sft.py:countdown_tools", f"sft_cd_{arm}", [
        "--config.total_steps=64000", "--config.log.every_steps=16000", "--config.eval.every_steps=64000",
        *CONTINUED_SFT, *flags]) for arm, flags in (("calc", ["--config.sft.roll_in=0.5"]), ("nocalc", NO_CALCULATOR))},
    **{f"sft_cd_{arm}_more2": ("text_sft.py:countdown_tools", f"sft_cd_{arm}_more", [
        "--config.total_steps=16000", "--config.log.every_steps=8000", "--config.eval.every_steps=16000",
        *CONTINUED_SFT, *flags])
        for arm, flags in (("calc", ["--config.sft.roll_in=1.0", "--config.sft.roll_in_temperature=0"]),
                           ("nocalc", NO_CALCULATOR))},
    **{f"cd_{arm}_more2": ("text_grpo.py:countdown_tools", f"sft_cd_{arm}_more2", [
        "--config.total_steps=15360", "--config.log.every_steps=1280", "--config.eval.every_steps=3840",
        "--config.eval.episodes=512", "--config.group.oversample=1", *flags])
        for arm, flags in (("nocalc", NO_CALCULATOR), ("calc", []))},
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
        greedy, sampled = evaluated(runs_dir, name, False), evaluated(runs_dir, name, True)
        rows.append([label, fmt_ci(seed_values(sampled, "eval_success"), (0, 1)),
                     fmt_ci(seed_values(sampled, "eval_turns")), fmt_ci(seed_values(greedy, "eval_success"), (0, 1)),
                     fmt_ci(seed_values(greedy, "eval_turns"))])
    return rows


def check_decisions(workdir: str, problems: int = 1024) -> dict[str, list[float]]:
    """What a Countdown calculator run does after its first check, greedy on `problems` held-out problems, per seed:
    the share of first checks that hit the target's value, of hits answered next, of misses checked again, and of
    those second checks that repeat the first (a wasted turn)."""
    import jax

    from envs.text.turns import CALCULATOR
    from jaxrl.run import program, saved

    run = saved.restore_run(workdir)
    rates = collections.defaultdict(list)
    for seed in range(run.config.num_seeds):
        actor = run.algorithm.actor(jax.tree.map(lambda x: x[seed], program.fetch(run.state.params)))
        task, policy = actor.task, actor.policy
        heldout = task.heldout(problems, seed=policy.eval_seed)
        episodes = np.asarray(actor.play(heldout))
        turn_of, model_slot = task.turn_slots()
        first, second = (np.asarray(policy.decode(episodes[:, (turn_of == k) & model_slot])) for k in (0, 1))
        value = np.asarray(policy.decode(episodes[:, (turn_of == 0) & ~model_slot]))
        checked = np.char.startswith(first, CALCULATOR)
        again = np.char.startswith(second, CALCULATOR)
        hit = checked & (value == np.asarray(heldout.target).astype(str))
        miss = checked & ~hit
        rates["first check hits"].append(hit.sum() / problems)
        rates["a hit answered next"].append((hit & ~again).sum() / max(hit.sum(), 1))
        rates["a miss checked again"].append((miss & again).sum() / max(miss.sum(), 1))
        rates["... with the same expression"].append((miss & again & (second == first)).sum()
                                                     / max((miss & again).sum(), 1))
    return rates


# Countdown's SFT runs and GRPO runs: (run, label)
COUNTDOWN_SFT = [("sft_cd_calc", "with the calculator, 128,000 demonstrations"), ("sft_cd_nocalc", "without, 128,000"),
                 ("sft_cd_calc_more", "with, + 64,000 (half rolled in, sampled)"),
                 ("sft_cd_nocalc_more", "without, + 64,000"),
                 ("sft_cd_calc_more2", "with, + 16,000 more (all rolled in, greedy)"),
                 ("sft_cd_nocalc_more2", "without, + 16,000 more")]
COUNTDOWN_GRPO = [("cd_calc", "with the calculator (4 turns), from 128,000, 15,360 episodes"),
                  ("cd_nocalc", "without (1 turn), from 128,000, 15,360 episodes"),
                  ("cd_nocalc_x4", "without, from 128,000, 61,440 episodes"),
                  ("cd_calc_more2", "with, from 208,000 (DAgger), 15,360 episodes"),
                  ("cd_nocalc_more2", "without, from 208,000, 15,360 episodes")]


# section -> (its title, the runs it reports, its figure's panels: (title, runs, metric)) (`report.publish_sections`)
SECTIONS = {
    "guess": ("The guessing game (1..1024, at most 13 turns)", ["sft_guess", "guess_grpo"],
              [("guessing game", ["guess_grpo"], "solved")]),
    "grid": ("GiGPO against trajectory-level GRPO: the grid world, equal samples", ["sft_grid", "grid_grpo",
                                                                                    "grid_gigpo"],
             [("grid world", ["grid_grpo", "grid_gigpo"], "solved")]),
    "countdown": ("Countdown with and without the calculator",
                  [run for run, _ in COUNTDOWN_SFT + COUNTDOWN_GRPO],
                  [("Countdown", ["cd_calc", "cd_nocalc", "cd_nocalc_x4"], "solved"),
                   ("Countdown, from 208,000 demonstrations", ["cd_calc_more2", "cd_nocalc_more2"], "solved"),
                   ("Countdown, the calculator's errors", ["cd_calc", "cd_calc_more2"], "tool_error_rate")]),
}
HEADER = ["run", "success (sampled)", "turns (sampled)", "success (greedy)", "turns (greedy)"]


def countdown_tables(runs_dir: str) -> list[str]:
    success = lambda summary: fmt_ci(seed_values(summary, "eval_success"), (0, 1))  # noqa: E731
    sft_rows = [[label, success(evaluated(runs_dir, run, False)), success(evaluated(runs_dir, run, True))]
                for run, label in COUNTDOWN_SFT]
    grpo_rows = []
    for run, label in COUNTDOWN_GRPO:
        greedy, sampled = evaluated(runs_dir, run, False), evaluated(runs_dir, run, True)
        logged = run_rows(os.path.join(runs_dir, run))
        (_, errors), (_, calls) = curve(logged, "tool_error_rate"), curve(logged, "tool_calls")
        grpo_rows.append([label, success(greedy), success(sampled), fmt_ci(seed_values(greedy, "eval_turns")),
                          f"{calls[0].mean():.2f} -> {calls[-1].mean():.2f}",
                          f"{errors[0].mean():.3f} -> {errors[-1].mean():.3f}"])
    decisions = []
    for name, label in (("sft_cd_calc", "SFT, 128,000"), ("cd_calc", "then GRPO"),
                        ("sft_cd_calc_more", "SFT + 64,000, half rolled in (sampled)"),
                        ("sft_cd_calc_more2", "+ 16,000, all rolled in (greedy)"), ("cd_calc_more2", "then GRPO")):
        rates = check_decisions(os.path.join(runs_dir, name))
        decisions.append([label, *(fmt_ci(values, (0, 1)) for values in rates.values())])
    return [markdown_table(["Countdown, SFT", "success (greedy)", "success (sampled)"], sft_rows), "",
            markdown_table(["Countdown, GRPO", "success (greedy)", "success (sampled)", "turns (greedy)",
                            "tool calls per episode (first -> last update)", "tool-error rate (first -> last)"],
                           grpo_rows), "",
            "What the calculator arm does after its first check (greedy, the same 1,024 problems):", "",
            markdown_table(["with the calculator", "first check hits", "a hit answered next", "a miss checked again",
                            "... with the same expression"], decisions)]


def section_lines(runs_dir: str, name: str) -> list[str]:
    """Section `name`'s heading, tables and figure, from the runs in `runs_dir`."""
    if name == "guess":
        tables = [markdown_table(HEADER, result_rows(runs_dir, ["sft_guess", "guess_grpo"],
                                                     ["SFT, 64,000 demonstrations", "then GRPO, 20,480 episodes"]))]
    elif name == "grid":
        tables = [markdown_table(HEADER, result_rows(runs_dir, ["sft_grid", "grid_grpo", "grid_gigpo"],
                                                     ["SFT, 3,200 demonstrations",
                                                      "then GRPO (trajectory), 15,360 episodes",
                                                      "then GiGPO, 15,360 episodes"]))]
    else:
        tables = countdown_tables(runs_dir)
    return [f"### {SECTIONS[name][0]}", *tables, "", f"![training curves](multi_turn_learning_{name}.png)"]


def main():
    args = runs_arguments(__doc__.split("\n")[0], RUNS, train)
    publish_sections("multi_turn_learning", "Multi-turn agents learning (issue 62)",
                     {name: runs for name, (_, runs, _) in SECTIONS.items()}, args.runs_dir, args.update_results,
                     lambda name: section_lines(args.runs_dir, name),
                     "3 seeds per run, trained at once; held-out success on 1,024 problems with its 95% interval over "
                     "seeds, sampled at temperature 1 and greedy.", draw=lambda name: plot(args.runs_dir, name))


def plot(runs_dir: str, name: str) -> None:
    """Section `name`'s figure, benchmarks/multi_turn_learning_<name>.png: its panels' training curves over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = SECTIONS[name][2]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (title, runs, key) in zip(axes[0], panels):
        for run in runs:
            steps, values = curve(run_rows(os.path.join(runs_dir, run)), key)
            seed_band(ax, steps, values, run)
        ax.set_title(title)
        ax.set_xlabel("episodes")
        ax.set_ylabel(f"{key} (training, sampled)")
        ax.legend()
    save_figure(fig, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"multi_turn_learning_{name}.png"))


if __name__ == "__main__":
    main()
