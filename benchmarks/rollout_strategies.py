"""Rollout strategies on Countdown harder than the warm start saw: held-out greedy accuracy and pass@8 against
generated tokens and against wall time, every strategy alone and in combination, at one budget.

    python benchmarks/rollout_strategies.py --update-results
    python benchmarks/rollout_strategies.py --sft-dir runs/sft_countdown --rows grpo,dapo,hints
    python benchmarks/rollout_strategies.py --sft-dir runs/sft_countdown --rows grpo,dapo,partial --speed 10

1. SFT as in `benchmarks/text_rl.py` (or `--sft-dir` reuses a run of it): Countdown with numbers up to 25.
2. RL from its last checkpoint on numbers up to 50 (`--rl-task`), all rows on the same pool of training
   problems (`--pool`, a dataset of that size: the memory strategies need problems to come back), 3 seeds per
   row trained as one program. Every row draws the same number of completions per seed (`--samples`); a row
   that generates more than it trains on (DAPO's oversampling) trains on correspondingly fewer updates. The
   tokens each row generated are measured (`sampled_tokens`: hints and replays are not generated) and the
   curves are drawn against them.

The goal (issue 20): the best combination reaches DAPO dynamic sampling's final accuracy with at most 60% of
its generated tokens, or beats it by >= 5 points at equal tokens. The table says for every row.
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

from report import chosen_names, machine, markdown_table, per_seed, publish, save_figure, seed_band  # noqa: E402
from text_rl import add_task_arguments, rl_config, sft_run  # noqa: E402

MARKERS = ("<!-- rollout_strategies:start -->", "<!-- rollout_strategies:end -->")

# Row name -> overrides (dotted keys) of experiments/text_grpo.py:countdown, whose own default is DAPO with two
# candidates per slot; with dynamic sampling, a row draws `group.oversample` candidates per trained group.
ROWS = {
    "grpo": {"group.oversample": 1},
    "dapo": {"group.oversample": 2},
    "rank_ties": {"group.oversample": 1, "rollout.filter": "rank_ties"},
    "variance_budget": {"group.oversample": 2, "rollout.filter": "success_predictor",
                        "rollout.control": "variance_budget"},
    "replay_correct": {"group.oversample": 1, "rollout.replay": "correct"},
    "hints": {"group.oversample": 1, "rollout.replay": "hints"},
    "replay+hints": {"group.oversample": 1, "rollout.replay": "correct,hints"},
    "dapo+replay+hints": {"group.oversample": 2, "rollout.replay": "correct,hints"},
    "budget+replay+hints": {"group.oversample": 2, "rollout.filter": "success_predictor",
                            "rollout.control": "variance_budget", "rollout.replay": "correct,hints"},
    "partial": {"group.oversample": 2, "rollout.control": "partial"},
    "partial+replay+hints": {"group.oversample": 2, "rollout.control": "partial", "rollout.replay": "correct,hints"},
    # Pruning needs a value head: against the same learner without pruning. The value predicts correct + 0.1 x
    # well_formed, so 0.12 prunes members predicted (nearly) never right.
    "critic": {"group.oversample": 1, "loss.critic_weight": 0.25},
    "critic+prune": {"group.oversample": 1, "loss.critic_weight": 0.25, "rollout.control": "dynamic_sampling,prune",
                     "rollout.options.prune.below": 0.12},
}


def generates_per_trained(config) -> int:
    """Completions drawn per completion trained on: oversample when the selection follows generation and
    drops the rest (partial rollouts carry the rest into later updates instead)."""
    return config.group.oversample if "dynamic_sampling" in config.rollout.control else 1


def row_config(args, sft_dir: str, overrides: dict):
    from jaxrl import config as config_lib

    config = config_lib.set_values(rl_config(args, sft_dir, "grpo", args.samples), overrides)
    config.rollout.pool_size = args.pool
    config.total_steps = args.samples // generates_per_trained(config)
    config.eval.every_steps = config.total_steps // args.evals
    config.log.every_steps = config.num_prompts * config.group.size  # every update: exact token counts
    config.checkpoint.every_steps = config.eval.every_steps
    return config


def start_point(config) -> tuple[float, float]:
    """(held-out greedy accuracy, pass@k) of the warm start, where every row and seed begins."""
    import jax

    from jaxrl import algos, mesh as mesh_lib
    from jaxrl.run.saved import start_params

    algo, _ = algos.build(config, mesh_lib.make_mesh())
    out = algo.evaluate(algo.init_seeds(config.seed, 1, start_params=start_params(algo.starts_from)).params,
                        jax.random.PRNGKey(0), config.eval.episodes)
    return float(out["eval_accuracy"][0]), float(out[f"eval_pass@{config.eval.pass_k}"][0])


def curves(rows: list[dict], config, num_seeds: int, start: tuple[float, float]) -> dict:
    """Per evaluation: generated tokens per seed so far (mean over seeds), wall seconds, accuracy and pass@k
    per seed [n, S]; the first point is the warm start's (0 tokens, 0 s)."""
    per_update = config.num_prompts * config.group.size
    tokens, last_steps = 0.0, 0
    out = {"tokens": [0.0], "wall": [0.0], "accuracy": [[start[0]] * num_seeds], "pass_k": [[start[1]] * num_seeds]}
    pass_key = f"eval_pass@{config.eval.pass_k}"
    for row in rows:
        if "sampled_tokens" in row:  # a log row: the mean per update over the updates since the last one
            tokens += float(row["sampled_tokens"]) * (row["env_steps"] - last_steps) / per_update  # mean over seeds
            last_steps = row["env_steps"]
        accuracy = per_seed(row, "eval_accuracy", num_seeds, complete=True)
        if accuracy is not None:
            out["tokens"].append(tokens)
            out["wall"].append(row["wall_time"])
            out["accuracy"].append(accuracy)
            # (the log keeps per-seed values of eval_accuracy only: pass@k is the mean over seeds)
            out["pass_k"].append(row.get(f"{pass_key}_per_seed") or [row[pass_key]] * num_seeds)
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def tokens_to_reach(curve: dict, level: float) -> float | None:
    """Generated tokens at which the mean accuracy first reaches `level` (linear between evaluations)."""
    mean = curve["accuracy"].mean(axis=1)
    for i in range(len(mean)):
        if mean[i] >= level:
            if i == 0:
                return float(curve["tokens"][0])
            x0, x1, y0, y1 = curve["tokens"][i - 1], curve["tokens"][i], mean[i - 1], mean[i]
            return float(x0 + (level - y0) / (y1 - y0) * (x1 - x0))
    return None


def accuracy_at(curve: dict, tokens: float) -> float:
    """Mean accuracy at `tokens` generated tokens (linear between evaluations; the last one past the end)."""
    return float(np.interp(tokens, curve["tokens"], curve["accuracy"].mean(axis=1)))


def plot(runs: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4), dpi=100)
    styles = plt.cycler(linestyle=["-"] * 10 + ["--"] * 10) + plt.cycler(color=list(plt.cm.tab10.colors) * 2)
    for ax in axes:  # more rows than colours: the second ten dashed
        ax.set_prop_cycle(styles)
    for name, c in runs.items():
        seed_band(axes[0], c["tokens"] / 1e6, c["accuracy"], name)
        seed_band(axes[1], c["tokens"] / 1e6, c["pass_k"], name)
        seed_band(axes[2], c["wall"], c["accuracy"], name)
    axes[0].set(xlabel="generated tokens per seed (millions)", ylabel="held-out greedy accuracy", title=title)
    axes[1].set(xlabel="generated tokens per seed (millions)", ylabel="held-out pass@8")
    axes[2].set(xlabel="wall seconds (all seeds of the row together)", ylabel="held-out greedy accuracy")
    axes[0].legend(fontsize=7)
    save_figure(fig, path)


def update_speed(args, sft_dir: str, rows: list[str], updates: int) -> str:
    """Seconds per update and generated tokens per second of each row, all in this process: from the warm start,
    one update compiles (untimed), then `updates` updates are timed as one chunk; the median of 3 chunks."""
    import statistics
    import time

    import jax

    from jaxrl import algos, mesh as mesh_lib
    from jaxrl.run.saved import start_params

    header = ["row", "s per update", "generated tokens per update (per seed)", "generated tokens/s",
              "decoding steps per update", "speed-up over grpo"]
    table, seconds = [], {}
    for name in rows:
        config = row_config(args, sft_dir, ROWS[name])
        algo, hp = algos.build(config, mesh_lib.make_mesh())
        state = algo.init_seeds(config.seed, args.seeds, start_params=start_params(algo.starts_from))
        state, _ = jax.block_until_ready(algo.run_chunk(state, hp, 1))
        times, tokens, steps = [], [], []
        for _ in range(3):
            tick = time.perf_counter()
            state, metrics = jax.block_until_ready(algo.run_chunk(state, hp, updates))
            times.append((time.perf_counter() - tick) / updates)
            tokens.append(float(metrics["sampled_tokens"].mean()))
            steps.append(float(metrics["decode_steps"].mean()) if "decode_steps" in metrics
                         else float(algo.parts.task.answer_length))
        seconds[name] = statistics.median(times)
        table.append([name, f"{seconds[name]:.3f}", f"{statistics.mean(tokens):,.0f}",
                      f"{statistics.mean(tokens) * args.seeds / seconds[name]:,.0f}", f"{statistics.mean(steps):.1f}"])
        print(f"  {name}: {seconds[name]:.3f} s per update", flush=True)
    for line, name in zip(table, rows):
        line.append(f"{seconds['grpo'] / seconds[name]:.2f}x" if "grpo" in seconds else "-")
    return "\n".join([f"Update speed from the warm start ({updates} updates per timed chunk, median of 3; "
                      f"{args.seeds} seeds in one program; {machine()}):", "", markdown_table(header, table)])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_task_arguments(parser)
    parser.add_argument("--samples", type=int, default=25_600, help="completions drawn per seed, every row")
    parser.add_argument("--evals", type=int, default=5, help="held-out evaluations per row after the start")
    parser.add_argument("--runs-dir", default="", help="keep each row's run here (an interrupted benchmark resumes "
                        "its rows; finished rows are read back)")
    parser.add_argument("--pool", type=int, default=512, help="training problems (rollout.pool_size), every row")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"of {', '.join(ROWS)}")
    parser.add_argument("--plot", default=os.path.join(ROOT, "benchmarks", "rollout_strategies.png"))
    parser.add_argument("--update-results", action="store_true", help="update benchmarks/results/rollout_strategies.md")
    parser.add_argument("--speed", type=int, default=0, metavar="UPDATES",
                        help="only time UPDATES updates of each row from the warm start (needs --sft-dir), no training")
    args = parser.parse_args(argv)
    rows = chosen_names(parser, args.rows, ROWS, "rows")
    plain = row_config(args, "", {})
    per_update = plain.num_prompts * plain.group.size
    for name in rows:
        trained = row_config(args, "", ROWS[name]).total_steps
        if trained % (args.evals * per_update):
            parser.error(f"row {name}: {trained:,} trained completions do not split into {args.evals} evaluations "
                         f"of whole updates ({per_update} completions)")

    from jaxrl import algos, metrics as metrics_lib, train

    for name in rows:  # a misconfigured row fails before any training
        algos.validate(row_config(args, "", ROWS[name]))
    if args.speed:
        if not args.sft_dir:
            parser.error("--speed times updates from a warm start: name it with --sft-dir")
        print(update_speed(args, args.sft_dir, rows, args.speed))
        return
    command = "python benchmarks/rollout_strategies.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"{args.task} ({args.rl_task}), pool {args.pool}, {args.samples:,} completions per seed x {args.seeds} "
          f"seeds per row; {machine()}", flush=True)

    runs, walls = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        runs_dir = args.runs_dir or scratch
        sft_dir = sft_run(args, scratch)
        start = start_point(row_config(args, sft_dir, {}))
        print(f"  warm start: accuracy {start[0]:.3f}, pass@8 {start[1]:.3f}", flush=True)
        for name in rows:
            config = row_config(args, sft_dir, ROWS[name])
            workdir = os.path.join(runs_dir, name.replace("+", "_"))
            train.run(config, workdir, progress=False)  # resumes a row that was interrupted, skips a finished one
            metrics = metrics_lib.read(os.path.join(workdir, "metrics.jsonl"))  # every row, across resumes
            runs[name], walls[name] = curves(metrics, config, args.seeds, start), metrics[-1]["wall_time"]
            c = runs[name]
            print(f"  {name}: {walls[name]:.0f} s, {c['tokens'][-1] / 1e6:.2f}M tokens per seed, accuracy "
                  f"{c['accuracy'][0].mean():.3f} -> {c['accuracy'][-1].mean():.3f}, pass@8 {c['pass_k'][-1].mean():.3f}",
                  flush=True)

    reference = runs.get("dapo")
    header = ["row", "start", "final accuracy [min, max]", "final pass@8", "tokens per seed",
              "tokens to DAPO's final (share of DAPO's)", "accuracy at DAPO's tokens", "wall s (all seeds)"]
    table = []
    for name, c in runs.items():
        final = c["accuracy"][-1]
        reach, at = "-", "-"
        if reference is not None:
            needed = tokens_to_reach(c, reference["accuracy"][-1].mean())
            reach = "never" if needed is None else f"{needed / 1e6:.2f}M ({needed / reference['tokens'][-1]:.0%})"
            at = f"{accuracy_at(c, reference['tokens'][-1]):.3f}"
        table.append([name, f"{c['accuracy'][0].mean():.3f}", f"{final.mean():.3f} [{final.min():.3f}, {final.max():.3f}]",
                      f"{c['pass_k'][-1].mean():.3f}", f"{c['tokens'][-1] / 1e6:.2f}M", reach, at, f"{walls[name]:.0f}"])
    title = f"{args.task} ({args.rl_task}), pool {args.pool}"
    plot(runs, args.plot, title)
    settings = "; ".join(f"{name}: " + (", ".join(f"{k}={v}" for k, v in ROWS[name].items()) or "defaults")
                         for name in rows)
    section = "\n".join([
        f"`{command.strip()}` ({datetime.date.today()}; {machine()}).",
        "",
        f"From the SFT run's last checkpoint, RL on {args.task} with {args.rl_task} over a pool of {args.pool} "
        f"training problems, {args.samples:,} completions drawn per seed and {args.seeds} seeds per row (trained as "
        f"one program); held-out greedy accuracy, mean over seeds. Rows: {settings}.",
        "", markdown_table(header, table), "",
        f"![rollout strategies]({os.path.relpath(args.plot, os.path.join(ROOT, 'benchmarks'))})"])
    publish(section, args.update_results, MARKERS, "Rollout strategies on Countdown (issue 20)")
    with open(os.path.splitext(args.plot)[0] + ".json", "w") as f:
        json.dump({name: {k: v.tolist() for k, v in c.items()} for name, c in runs.items()}, f)


if __name__ == "__main__":
    main()
