"""The method league (issue 64): every group-RL method of docs/methods.md that is a config line on single-answer text
tasks, trained from one SFT warm start on two-number Countdown with equal completions drawn, 3 seeds each.

    python benchmarks/method_league.py --runs-dir runs/method_league --update-results

Every run is `python -m jaxrl.train` (runs already in `--runs-dir` are reused, so an interrupted script picks up
where it stopped). The warm start is the experiments' text_sft on Countdown with two numbers (targets up to 100,
numbers up to 25) and a one-layer model of width 64, 6,400 demonstrations: it answers about a third of the held-out
problems greedily, so that a group's answers differ and every method has something to learn. Each method then runs
7,680 completions (60 updates of 16 prompts x 8 at a constant learning rate of 3e-4 in two minibatches, so that the
second learns from samples of the parameters before the first: the objectives' clipping and weights act; temperature
0.3, rewarded for correct answers alone; a method that changes the group size keeps the completions per update,
MC-GRPO's G + 1 = 9 draws 9/8 of them per prompt), 3 seeds in one
program. Reported: held-out greedy accuracy and pass@8 at the end (256 problems, the runs' own evaluations), the
gain over the warm start, the tokens each method sampled before its mean accuracy first reached GRPO's final one
(evaluated every 1,920 completions), and the training's wall time. Intervals: 95% Student-t over the seeds.
"""

from __future__ import annotations

import datetime
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report import (finished_run, fmt_ci, machine, markdown_table, publish, run_rows, runs_arguments,  # noqa: E402
                    save_figure, seed_values, train_run)

MARKERS = ("<!-- method_league:start -->", "<!-- method_league:end -->")
SEEDS = 3
COMPLETIONS = 16 * 8 * 60
TASK = ["--config.task.kwargs.num_numbers=2"]
SMALL_MODEL = ["--config.model.num_layers=1", "--config.model.d_model=64", "--config.model.num_heads=2"]
SFT = [*TASK, *SMALL_MODEL, "--config.total_steps=6400", "--config.num_prompts=32", "--config.optim.warmup_updates=10",
       "--config.eval.pass_k=8", "--config.eval.episodes=256"]
GRPO = [*TASK, *SMALL_MODEL, f"--config.total_steps={COMPLETIONS}", "--config.num_prompts=16", "--config.group.size=8",
        "--config.optim.learning_rate=3e-4", "--config.optim.schedule=constant", "--config.sampling.temperature=0.3",
        "--config.reward_weights=(1.0,0.0)", "--config.optim.num_minibatches=2", f"--config.num_seeds={SEEDS}", "--config.eval.every_steps=1920",
        "--config.eval.episodes=256", "--config.eval.pass_k=8", "--config.log.every_steps=128",
        "--config.checkpoint.every_steps=7680"]
# method -> (its config line's keys beyond GRPO's, the methods it stands for in docs/methods.md)
METHODS = {
    "grpo": ({}, "GRPO"),
    "dr_grpo": ({"advantage.estimator": "dr_grpo", "loss.aggregate": "constant"}, "Dr. GRPO"),
    "rloo": ({"advantage.estimator": "rloo"}, "RLOO"),
    "median": ({"advantage.estimator": "median", "group.size": 9, "num_prompts": 16}, "MC-GRPO (G + 1 = 9)"),
    "two_grpo": ({"group.size": 2, "num_prompts": 64}, "2-GRPO"),
    "calibrated": ({"advantage.estimator": "calibrated"}, "NGRPO"),
    "bnpo": ({"advantage.estimator": "bnpo"}, "BNPO"),
    "lite_ppo": ({"advantage.scale": "batch"}, "Lite PPO"),
    "gspo": ({"loss.ratio": "sequence", "loss.clip_low": 3e-4, "loss.clip_high": 4e-4}, "GSPO"),
    "cispo": ({"loss.objective": "cispo", "loss.clip_low": 1.0, "loss.clip_high": 4.0}, "CISPO"),
    "nft": ({"loss.objective": "nft"}, "NFT"),
    "pacs": ({"loss.objective": "pacs"}, "PACS"),
    "ace": ({"loss.confidence_penalty": 1.0}, "ACE"),
    "prorl": ({"loss.kl_coef": 0.01, "loss.reference_reset": 20}, "ProRL"),
    "kdrl": ({"loss.teacher": "@sft", "loss.teacher_coef": 0.1}, "KDRL (the warm start as teacher)"),
    "truncated": ({"loss.truncated": "mask_negative"}, "MicroCoder-GRPO's masking"),
    "d3s": ({"loss.token_keep": 0.5}, "D3S's token level"),
    "reference": ({"rollout.replay": "reference"}, "TempSamp-R1's ground-truth member"),
    "thompson": ({"rollout.replay": "thompson", "rollout.pool_size": 256}, "VADE"),
    "gdro": ({"rollout.replay": "gdro", "rollout.pool_size": 256}, "Prompt-GDRO"),
    "partial": ({"rollout.control": "partial"}, "APRIL"),
    "majority": ({"reward.label_free": "majority"}, "MM-UPT (no labels)"),
    "expert_iteration": ({"advantage.estimator": "expert_iteration"}, "expert iteration"),
    "d3s_both": ({"loss.sample_keep": 0.5, "loss.token_keep": 0.5, "loss.keep_schedule": 40},
                 "D3S (both levels, scheduled)"),
    "dagrpo": ({"loss.min_distinctiveness": 0.3, "rollout.replay": "correct", "rollout.pool_size": 256}, "DaGRPO"),
    "spo": ({"advantage.estimator": "tracked", "group.size": 1, "num_prompts": 128, "rollout.replay": "tracker",
             "rollout.pool_size": 256}, "SPO (G = 1)"),
    "mssr": ({"advantage.estimator": "tracked", "group.size": 1, "num_prompts": 128, "rollout.replay": "tracker",
              "rollout.pool_size": 256, "advantage.entropy_shaping": 0.1}, "MSSR (G = 1, entropy shaping)"),
    "fused": ({"advantage.estimator": "fused", "loss.critic_weight": 0.1, "group.size": 4, "num_prompts": 32},
              "V_0.5 (G = 4)"),
    "selective": ({"rollout.replay": "selective", "rollout.pool_size": 256}, "Skywork R1V2's selective buffer"),
    "pairing": ({"rollout.replay": "pairing", "rollout.pool_size": 256}, "positive-negative pairing"),
    "hardest": ({"rollout.replay": "hardest", "rollout.pool_size": 256, "rollout.options.hardest.after": 30},
                "DRIVE's hard focus"),
    "dars": ({"rollout.filter": "success_predictor", "rollout.control": "variance_budget",
              "rollout.options.variance_budget.target": "hard"}, "DARS's depth"),
    "ahpo": ({"rollout.replay": "reference", "rollout.options.reference.below": 0.25}, "AHPO's expert data"),
    "entropy_target": ({"rollout.control": "dynamic_sampling,entropy_target",
                        "rollout.options.entropy_target.start": 0.3}, "AceReason's entropy target"),
    "scaf_grpo": ({"rollout.replay": "hints", "rollout.pool_size": 256}, "Scaf-GRPO's hints"),
    "xrpo": ({"advantage.novelty_sharpening": 1.0}, "XRPO's novelty sharpening"),
    "pvpo": ({"advantage.estimator": "tracked", "rollout.replay": "anchor,reference", "rollout.pool_size": 256,
              "rollout.options.anchor.temperature": 0.3}, "PVPO (the reference's anchors)"),
    "latr": ({"rollout.generate": "tree", "rollout.options.tree.min_entropy": 1.0}, "LATR's branching at uncertainty"),
    "branch": ({"rollout.generate": "tree", "rollout.options.tree.depth": 2}, "BranchGRPO's shared prefixes"),
    # added 2026-12-01: the methods table's config lines that were not in the league yet
    "brorl": ({"group.size": 64, "num_prompts": 2}, "BroRL (G = 64)"),
    "dars_b": ({"rollout.generate": "dars", "rollout.options.dars.extra": 4, "advantage.merge_problem_groups": True,
                "rollout.pool_size": 256, "group.oversample": 1, "optim.num_minibatches": 1, "optim.num_epochs": 2},
               "DARS-B (depth and breadth)"),
    "online_selection": ({"rollout.replay": "recent", "rollout.options.recent.fraction": 0.5, "group.oversample": 1,
                          "rollout.filter": "attention_predictor", "rollout.pool_size": 256,
                          "rollout.control": "variance_budget"},
                         "difficulty-targeted online selection + rollout replay"),
    "weighted_pairing": ({"rollout.replay": "pairing", "rollout.pool_size": 256,
                          "advantage.estimator": "weighted_grpo"}, "positive-negative pairing + Weighted GRPO"),
    "prs_vspo": ({"reward.progressive": 20, "rollout.control": "dynamic_sampling",
                  "rollout.options.dynamic_sampling.rank": "value", "loss.clip_smoothing": 2.0}, "PRS + VSPO"),
    "v0": ({"rollout.filter": "attention_predictor", "rollout.control": "variance_budget", "rollout.pool_size": 256},
           "V_0 (the policy's own attention as the value model)"),
    "arrol": ({"rollout.control": "dynamic_sampling,prune", "loss.critic_weight": 0.5,
               "rollout.options.prune.balance": 1}, "ARRoL (balanced pruning)"),
    "xrpo_full": ({"rollout.filter": "success_predictor", "rollout.control": "variance_budget",
                   "rollout.replay": "hints", "rollout.pool_size": 256, "advantage.novelty_sharpening": 1.0},
                  "XRPO (allocator, hints, sharpening)"),
    "adhint": ({"rollout.replay": "hints", "rollout.pool_size": 256, "rollout.options.hints.adaptive": True,
                "advantage.estimator": "hint_posterior"}, "ADHint"),
    "ahpo_expert": ({"loss.expert_coef": 1.0, "loss.expert_below": 0.25}, "AHPO (the expert term)"),
    "tempsamp_soft": ({"rollout.replay": "reference", "advantage.soft": 0.5}, "TempSamp-R1 (soft advantages)"),
    "poise": ({"group.size": 2, "num_prompts": 64, "loss.critic_weight": 1.0, "advantage.cross_rollout": True,
               "loss.value_entropy": True}, "POISE (G = 2)"),
    "microcoder": ({"loss.truncated": "mask_negative", "loss.clip_high": 0.28, "loss.kl_coef": 0.0,
                    "rollout.control": "dynamic_sampling,diversity_target"}, "MicroCoder-GRPO"),
    "arlcp": ({"reward.length_penalty": 0.5}, "ARLCP's length penalty"),
    "dapo": ({"loss.clip_high": 0.28, "rollout.control": "dynamic_sampling", "loss.aggregate": "token"}, "DAPO"),
    "gdpo": ({"advantage.estimator": "gdpo"}, "GDPO"),
}


# The seeds' claims on group sizes, all at 60 updates of 16 prompts (the completions grow with G):
# MC-GRPO: G = 2 within 1% of G = 8 (median baselines over G + 1 samples, the pivot left out);
# 2-GRPO: G = 2 keeps (about) the accuracy of G = 16 at 1/8 of its rollouts.
CLAIMS = {"mc_g2": {"advantage.estimator": "median", "group.size": 3}, "mc_g8": {"advantage.estimator": "median",
                                                                                "group.size": 9},
          "grpo_g2": {"group.size": 2}, "grpo_g16": {"group.size": 16}}


# APRIL's and ARRoL's speed claims need long-tailed completion lengths: Countdown whose reference answers "think"
# after the expression (before EOS), a run of spaces the longer the harder the problem (filler_scale 8: median 8,
# 90th percentile 25, up to 40), from its own SFT warm start, sampled at temperature 1. ARRoL prunes at column 8
# (past the expression, inside the filler), keeping each group's highest-predicted going member on each side of 1/2
# (its balance; at column 12 neither the plain threshold of 0.05 nor two kept on each side pruned any member of a
# warm start that answers a third right).
TAIL = ["--config.task.kwargs.answer_slack=40", "--config.task.kwargs.filler_scale=8.0", "--config.model.max_len=64"]
TAIL_RUNS = {"tail_grpo": {}, "tail_april": {"rollout.control": "partial"}, "tail_critic": {"loss.critic_weight": 0.5},
             "tail_arrol": {"loss.critic_weight": 0.5, "rollout.control": "dynamic_sampling,prune",
                            "rollout.options.prune.at": 8, "rollout.options.prune.warmup": 10,
                            "rollout.options.prune.balance": 1}}


def flags_of(runs_dir: str, keys: dict) -> list[str]:
    """A method's keys as command-line flags ('@name': the run of that name in runs_dir)."""
    def shown(value):
        return os.path.join(runs_dir, value[1:]) if isinstance(value, str) and value.startswith("@") else value
    return [f"--config.{key}={shown(value)}" for key, value in keys.items()]


RUNS = {"sft": ("text_sft.py:countdown", None, SFT),
        **{name: ("text_grpo.py:countdown", "sft", None) for name in (*METHODS, *CLAIMS)},
        "sft_tail": ("text_sft.py:countdown", None, [*SFT, *TAIL, "--config.total_steps=19200"]),  # (3x: the filler)
        **{name: ("text_grpo.py:countdown", "sft_tail", None) for name in TAIL_RUNS}}


def train(runs_dir: str, name: str) -> None:
    experiment, init_from, flags = RUNS[name]
    if flags is None and name in CLAIMS:  # 60 updates of 16 prompts x G
        keys = CLAIMS[name]
        flags = [*GRPO, *flags_of(runs_dir, keys), f"--config.total_steps={16 * keys['group.size'] * 60}",
                 f"--config.eval.every_steps={16 * keys['group.size'] * 15}",
                 f"--config.log.every_steps={16 * keys['group.size']}",
                 f"--config.checkpoint.every_steps={16 * keys['group.size'] * 60}"]
    elif flags is None and name in TAIL_RUNS:
        flags = [*GRPO, *TAIL, "--config.sampling.temperature=1.0", *flags_of(runs_dir, TAIL_RUNS[name])]
    elif flags is None:  # (a method's flags come after GRPO's: where both set a key, the method's value holds)
        flags = [*GRPO, *flags_of(runs_dir, METHODS[name][0])]
    train_run(runs_dir, name, experiment, init_from, flags)


def evaluations(runs_dir: str, name: str) -> list[dict]:
    """A run's metric rows that hold an evaluation."""
    return [r for r in run_rows(os.path.join(runs_dir, name)) if "eval_accuracy" in r]


def league(runs_dir: str) -> tuple[list[list[str]], dict]:
    """The table's rows and each method's curve {name: (completions, mean accuracy)}."""
    start = float(evaluations(runs_dir, "sft")[-1]["eval_accuracy"])
    finals, curves = {}, {}
    for name in METHODS:
        workdir = os.path.join(runs_dir, name)
        if not finished_run(workdir):
            continue
        rows = run_rows(workdir)
        evals = [r for r in rows if "eval_accuracy" in r]
        curves[name] = ([0] + [r["env_steps"] for r in evals], [start] + [r["eval_accuracy"] for r in evals])
        tokens = np.cumsum([r.get("tokens", 0.0) for r in rows])
        finals[name] = (evals[-1], rows, tokens)
    if "grpo" not in finals:
        return [], curves
    bar = finals["grpo"][0]["eval_accuracy"]  # (a row's eval_accuracy is the mean over its seeds)
    table = []
    for name, (last, rows, tokens) in finals.items():
        reached = tokens_to_reach(rows, bar)
        to_reach = f"{reached / 1e3:.0f}k" if reached is not None else "not reached"
        accuracy = seed_values(last, "eval_accuracy")
        table.append([f"{name} ({METHODS[name][1]})", f"`{' '.join(flags_of('RUNS', METHODS[name][0])) or '(GRPO)'}`",
                      fmt_ci(accuracy, (0, 1)), fmt_ci(seed_values(last, "eval_pass@8"), (0, 1)),
                      fmt_ci(np.asarray(accuracy) - start), to_reach, f"{rows[-1]['wall_time']:.0f} s"])
    return table, curves


def tokens_to_reach(rows: list[dict], bar: float) -> float | None:
    """The tokens a run sampled before its mean held-out accuracy first reached `bar` (None: never)."""
    tokens = np.cumsum([r.get("tokens", 0.0) for r in rows])
    reached = next((i for i, r in enumerate(rows) if r.get("eval_accuracy", -1.0) >= bar), None)
    return None if reached is None else float(tokens[reached])


def wall_time(runs_dir: str, name: str) -> float:
    return float(run_rows(os.path.join(runs_dir, name))[-1]["wall_time"])


def verdict(measured: float, claimed: float) -> str:
    """A claimed gain against the measured one (both as fractions: 0.225 is +22.5%)."""
    if measured >= claimed:
        return "confirmed"
    return "partly: the same direction, smaller" if measured > 0 else "not confirmed"


def method_claims(runs_dir: str) -> list[str]:
    """The seeds' speed and accuracy claims of rollout strategies, answered from their runs (when all have finished)."""
    needed = ("grpo", "scaf_grpo", "latr", "branch", *TAIL_RUNS)
    if not all(finished_run(os.path.join(runs_dir, name)) for name in needed):
        return []
    acc = {name: final_accuracy(runs_dir, name) for name in needed}
    mean = {name: float(np.mean(v)) for name, v in acc.items()}
    wall = {name: wall_time(runs_dir, name) for name in needed}
    shown = {name: fmt_ci(acc[name], (0, 1)) for name in needed}
    bar = evaluations(runs_dir, "grpo")[-1]["eval_accuracy"]
    reach = {name: tokens_to_reach(run_rows(os.path.join(runs_dir, name)), bar) for name in ("grpo", "latr")}
    branch_cut = 1 - wall["branch"] / wall["grpo"]
    latr_gain, scaf_gain = mean["latr"] / mean["grpo"] - 1, mean["scaf_grpo"] / mean["grpo"] - 1
    latr_speed = (reach["grpo"] / reach["latr"] - 1) if reach["latr"] else None
    length = {name: logged_mean(runs_dir, name, "completion_length") for name in ("tail_grpo", "tail_arrol")}
    pruned, decode = logged_mean(runs_dir, "tail_arrol", "pruned"), logged_mean(runs_dir, "tail_april", "decode_steps")
    room = 10 + 40  # two-number Countdown's longest expression and EOS, and the room after it
    no_tail = length["tail_grpo"] < 10  # the mean completion ends inside the expression: nothing runs on
    april_gain, arrol_gain = wall["tail_grpo"] / wall["tail_april"] - 1, wall["tail_critic"] / wall["tail_arrol"] - 1
    rows = [["APRIL: +22.5% rollout throughput (partial rollouts; long-tailed lengths)",
             f"completions of mean length {length['tail_grpo']:.1f} tokens, up to {room} (temperature 1, a filler "
             f"after the answer); partial rollouts decode {decode:.1f} steps per update where GRPO decodes until "
             f"its longest member ends; training wall time {wall['tail_april']:.0f} s against "
             f"{wall['tail_grpo']:.0f} s "
             f"(equal completions: {april_gain:+.0%} throughput); accuracy {shown['tail_april']} against "
             f"{shown['tail_grpo']}",
             "not testable here" if no_tail else verdict(april_gain, 0.225)],
            ["ARRoL: up to 1.7x training speed (pruning as it generates; long-tailed lengths)",
             f"{pruned:.1%} of the members pruned at column 8 (mean completion length {length['tail_arrol']:.1f}); "
             f"training wall time {wall['tail_arrol']:.0f} s against the value head alone's "
             f"{wall['tail_critic']:.0f} s "
             f"({arrol_gain:+.0%} speed; static shapes keep a pruned member's slot until its group ends); accuracy "
             f"{shown['tail_arrol']} against {shown['tail_critic']}",
             # (under 1% pruned, a wall-time difference is the machine's, not pruning's: 1.48x run to run on one VM)
             "not testable here" if no_tail or pruned < 0.01 else verdict(arrol_gain, 0.7)],
            ["BranchGRPO: -55% iteration time (shared prefixes)",
             f"wall time {-branch_cut:+.0%} ({wall['branch']:.0f} s against GRPO's {wall['grpo']:.0f} s); accuracy "
             f"{shown['branch']} against {shown['grpo']}", verdict(branch_cut, 0.55)],
            ["LATR: +131% learning speed, +4.2% pass@1 (branching at uncertain tokens)",
             f"tokens to GRPO's final accuracy: "
             f"{'not reached' if latr_speed is None else f'{latr_speed:+.0%} faster'}; accuracy {latr_gain:+.1%} "
             f"({shown['latr']} against {shown['grpo']})",
             "confirmed" if (latr_speed or -1) >= 1.31 and latr_gain >= 0.042 else
             "partly: the same direction, smaller" if (latr_speed or -1) > 0 or latr_gain > 0 else "not confirmed"],
            ["Scaf-GRPO: +44.3% relative pass@1 (tiered hints on stuck problems)",
             f"held-out greedy accuracy {scaf_gain:+.1%} ({shown['scaf_grpo']} against {shown['grpo']})",
             verdict(scaf_gain, 0.443)]]
    return ["### The seeds' claims on rollout strategies (7,680 completions each, 3 seeds)", "",
            "APRIL and ARRoL run on Countdown whose reference answers write a run of spaces after the expression, "
            "the longer the harder the problem (median 8, 90th percentile 25, up to 40), from its own SFT warm start "
            "(19,200 demonstrations), "
            "sampled at temperature 1: completion lengths with a long tail, as reasoning models' are; the others on "
            "the league's task.", "",
            markdown_table(["claim", "measured", "verdict"], rows), ""]


def logged_mean(runs_dir: str, name: str, key: str) -> float:
    """The mean of a metric over the rows of a run that log it."""
    return float(np.mean([r[key] for r in run_rows(os.path.join(runs_dir, name)) if key in r]))


def final_accuracy(runs_dir: str, name: str) -> list[float]:
    return seed_values(evaluations(runs_dir, name)[-1], "eval_accuracy")


def claims(runs_dir: str) -> list[str]:
    """The group-size claims, answered from their runs (when all have finished)."""
    if not all(finished_run(os.path.join(runs_dir, name)) for name in (*CLAIMS, "grpo")):
        return []
    acc = {name: final_accuracy(runs_dir, name) for name in (*CLAIMS, "grpo")}
    mean = {name: float(np.mean(v)) for name, v in acc.items()}
    rows = [["MC-GRPO: G = 2 within 1% of G = 8", f"median G + 1 = 3: {fmt_ci(acc['mc_g2'], (0, 1))}; G + 1 = 9: "
             f"{fmt_ci(acc['mc_g8'], (0, 1))}; gap {mean['mc_g8'] - mean['mc_g2']:+.3f} (GRPO G = 2: "
             f"{fmt_ci(acc['grpo_g2'], (0, 1))}, G = 8: {fmt_ci(acc['grpo'], (0, 1))}, gap "
             f"{mean['grpo'] - mean['grpo_g2']:+.3f})",
             "confirmed" if abs(mean["mc_g8"] - mean["mc_g2"]) <= 0.01 else "not confirmed"],
            ["2-GRPO: G = 2 keeps G = 16's accuracy at 1/8 of its rollouts", f"G = 2 (1,920 completions): "
             f"{fmt_ci(acc['grpo_g2'], (0, 1))}; G = 16 (15,360): {fmt_ci(acc['grpo_g16'], (0, 1))}: "
             f"{mean['grpo_g2'] / max(mean['grpo_g16'], 1e-9):.0%} of it",
             "confirmed" if mean["grpo_g2"] >= 0.98 * mean["grpo_g16"] else "not confirmed"]]
    return ["### The seeds' claims on group sizes (60 updates of 16 prompts each, 3 seeds)", "",
            markdown_table(["claim", "measured (held-out greedy accuracy)", "verdict"], rows), ""]


def plot(curves: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, (name, (x, y)) in enumerate(curves.items()):  # 20 distinct colours, then a second line style
        ax.plot(x, y, marker="o", markersize=2, linewidth=2.5 if name == "grpo" else 1, label=name,
                color=plt.cm.tab20(i % 20), linestyle="-" if i < 20 else "--")
    ax.set_xlabel("completions drawn")
    ax.set_ylabel("held-out greedy accuracy (mean of 3 seeds)")
    ax.legend(fontsize=6, ncol=3)
    save_figure(fig, os.path.join(os.path.dirname(os.path.abspath(__file__)), "method_league.png"))


def main():
    args = runs_arguments(__doc__.split("\n")[0], RUNS, train)
    if not finished_run(os.path.join(args.runs_dir, "sft")):
        return
    table, curves = league(args.runs_dir)
    start = evaluations(args.runs_dir, "sft")[-1]["eval_accuracy"]
    lines = [f"{datetime.date.today()}, {machine()}; `python benchmarks/method_league.py --runs-dir DIR "
             "--update-results`. Two-number Countdown, one SFT warm start (held-out greedy accuracy "
             f"{start:.3f}), {COMPLETIONS:,} completions per method, 3 seeds; intervals: 95% over the seeds.", "",
             markdown_table(["method", "config line (beyond the GRPO run's)", "held-out accuracy", "pass@8",
                             "gain over SFT", "tokens to GRPO's final accuracy", "wall time"], table), "",
             "![held-out accuracy against completions drawn](method_league.png)", "", *claims(args.runs_dir),
             *method_claims(args.runs_dir)]
    publish("\n".join(lines), args.update_results, MARKERS, "The method league (issue 64)",
            draw=lambda: plot(curves) if curves else None)


if __name__ == "__main__":
    main()
