"""MAPPO on SMAX against JaxMARL's own recurrent MAPPO script, in the same run: speed and learning per env step.

For every scenario, runs JaxMARL's `baselines/MAPPO/mappo_rnn_smax.py` (from a checkout of the JaxMARL
repository, one process per seed, as the script is meant to run: `benchmarks/jaxmarl_reference.py`), then
ours with the same recipe (experiments/smax_mappo.py with the script's 128 envs, through the whole
`jaxrl.train` loop): first seed 0 alone, timed as the script is, then all seeds in one program (jaxrl's
way of training seeds), whose curves are compared. Prints and plots env steps per second of the whole loop
(compilation included) and the training win rate per env step and per second, mean over seeds with 95%
intervals. No figure from another run enters a ratio.

    python benchmarks/smax_mappo.py --jaxmarl-repo PATH                      # 3m and 2s3z, 3 seeds, 1M steps
    python benchmarks/smax_mappo.py --jaxmarl-repo PATH --scenarios 3m --seeds 1 --total-steps 300000
    python benchmarks/smax_mappo.py --from-json benchmarks/smax_mappo.json   # re-render saved curves
    python benchmarks/smax_mappo.py --default-seeds 5                        # our default config alone

`--default-seeds N` trains experiments/smax_mappo.py:<scenario> (its own budget) for N seeds in one
program with a greedy evaluation every 131k steps, and reports each seed's final greedy win rate and
the wall time of seed 0 (trained alone) to a greedy win rate of 0.9.

The reference needs its own dependencies: `pip install -e ".[bench]"` (jaxmarl, distrax, hydra-core,
omegaconf, wandb). A JaxMARL checkout: `git clone` the FLAIROx/JaxMARL repository anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import report  # benchmarks/ (the script's folder is on sys.path)
from jaxmarl_reference import check_reference, run_in_subprocess
from report import compare_point, curve, fmt_ci

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MARKERS = ("<!-- smax_mappo:start -->", "<!-- smax_mappo:end -->")
JSON_PATH = os.path.join(ROOT, "benchmarks", "smax_mappo.json")
PLOT_PATH = os.path.join(ROOT, "benchmarks", "smax_mappo.png")
LOG_EVERY_UPDATES = 4  # ours logs every 4 updates; the reference's per-update rows are averaged the same way


def experiment_config(name: str, scenario: str):
    from jaxrl import config as config_lib

    return config_lib.from_file(os.path.join(ROOT, "experiments", f"{name}.py:{scenario}"))


def recipe_config(scenario: str, total_steps: int, seed: int):
    """experiments/smax_mappo.py with the reference script's batch (128 envs x 128 steps); it matches the
    script's recipe in everything else (see the experiment's docstring)."""
    config = experiment_config("smax_mappo", scenario)
    config.experiment = f"bench_mappo_{scenario}"
    config.num_envs, config.num_steps = 128, 128
    config.total_steps = total_steps
    config.seed = seed
    config.log.every_steps = LOG_EVERY_UPDATES * 128 * 128
    config.log.progress_bar = False
    config.eval.every_steps = 0  # only at the end
    config.checkpoint.every_steps = total_steps
    return config


def run_ours(config) -> list[dict]:
    """One `jaxrl.train` run of `config.num_seeds` seeds; a run record per seed (wall and env steps shared)."""
    from jaxrl import train
    from jaxrl.metrics import per_seed

    with tempfile.TemporaryDirectory() as workdir:
        tick = time.perf_counter()
        result = train.run(config, workdir)
        wall = time.perf_counter() - tick
    S = config.num_seeds
    runs = []
    for seed in range(S):
        def value(row, key):
            values = per_seed(row, key, S)
            return None if values is None else values[seed]
        rows = [{"env_steps": r["env_steps"], "wall_time": r["wall_time"], "win_rate": value(r, "win_rate"),
                 "eval_win_rate": value(r, "eval_win_rate")} for r in result.metrics]
        runs.append({"rows": rows, "wall": wall, "env_steps": rows[-1]["env_steps"], "seeds_in_program": S,
                     "compile": sum(r.get("compile_seconds", 0.0) for r in result.metrics)})
    return runs


def run_reference(repo: str, scenario: str, seed: int, total_steps: int, xla_flags: str = "") -> dict:
    """The reference script in a process of its own (with `xla_flags` added to XLA_FLAGS); its per-update rows
    averaged over our log interval."""
    result = run_in_subprocess(repo, "mappo", scenario, seed, total_steps, LOG_EVERY_UPDATES, xla_flags)
    del result["last"]
    return result


# --------------------------------------------------------------------------------------------------
# Tables and plots from the saved runs: {scenario: {"ours": [run per seed], "reference": [...]}}


def steps_per_second(run: dict) -> float:
    return run["env_steps"] / run["wall"]


def first_reaching(run: dict, threshold: float, key: str = "win_rate") -> tuple[int, float] | None:
    """(env steps, wall seconds) of the first logged row whose `key` >= threshold."""
    for row in run["rows"]:
        if (row.get(key) or 0.0) >= threshold:
            return row["env_steps"], row["wall_time"]
    return None


def scenario_section(scenario: str, runs: dict) -> tuple[str, bool]:
    """Markdown for one scenario and whether ours is >= or within the reference's interval past 10%."""
    import statistics

    from jaxrl.metrics import markdown_table

    ours, ref, alone = runs["ours"], runs["reference"], runs["ours_alone"]
    sps_ref = [steps_per_second(r) for r in ref]
    ref_median = statistics.median(sps_ref)
    S = len(ours)
    program_sps = S * steps_per_second(ours[0])  # every seed of the program shares its wall time
    ratio = steps_per_second(alone) / ref_median
    speed_rows = [["JaxMARL mappo_rnn_smax.py, one seed per run", "median " + f"{ref_median:,.0f} (" + ", ".join(
        f"{x:,.0f}" for x in sps_ref) + ")", "1.00x", ", ".join(f"{r['wall']:.0f}" for r in ref)]]
    same_xla = runs.get("reference_same_xla")
    if same_xla:
        sps = steps_per_second(same_xla)
        speed_rows.append([f"JaxMARL's script, seed 0, with jaxrl's XLA options (`XLA_FLAGS={same_xla['xla_flags']}`)",
                           f"{sps:,.0f}", f"{sps / ref_median:.2f}x", f"{same_xla['wall']:.0f}"])
    speed_rows += [["jaxrl, seed 0 alone", f"{steps_per_second(alone):,.0f}", f"{ratio:.2f}x", f"{alone['wall']:.0f}"],
                   [f"jaxrl, {S} seeds in one program", f"{program_sps:,.0f} (all seeds)",
                    f"{program_sps / ref_median:.2f}x", f"{ours[0]['wall']:.0f}"]]
    speed = markdown_table(["", "env steps/s, whole loop incl. compile", "x reference", "wall s"], speed_rows)
    marks_o, wins_o = curve(ours)
    marks_r, wins_r = curve(ref)
    shared = [m for m in marks_o if m in set(marks_r)]
    total = max(marks_o[-1], marks_r[-1])
    rows, holds = [], True
    for m in shared:
        o, r = wins_o[marks_o.index(m)], wins_r[marks_r.index(m)]
        verdict = compare_point(o, r)
        counted = m > 0.1 * total
        holds &= verdict != "BELOW" or not counted
        rows.append([f"{m / 1e6:.2f}M", fmt_ci(o), fmt_ci(r), verdict if counted else f"({verdict})"])
    learning = markdown_table(["env steps", "jaxrl win rate", "reference win rate", "jaxrl vs reference"], rows)
    reach = []
    for threshold in (0.5, 0.7, 0.8):
        def cells(runs, with_time):
            hits = [first_reaching(r, threshold) for r in runs]
            return ", ".join("-" if h is None else f"{h[0] / 1e6:.2f}M" + (f" / {h[1]:.0f} s" if with_time else "")
                             for h in hits)
        reach.append([f"{threshold}", cells(ours, False), cells([alone], True), cells(ref, True)])
    reach_table = markdown_table(["training win rate", f"jaxrl, {S} seeds in one program (steps)",
                                  "jaxrl, seed 0 alone (steps / wall)", "reference (steps / wall, per seed)"], reach)
    text = (f"### {scenario}: {len(ours)} seeds each, {total:,} env steps\n\n"
            f"Speed, one seed per run: jaxrl / reference = **{ratio:.2f}x**.\n\n{speed}\n\n"
            f"Training win rate (mean over seeds, 95% interval; each mark averages the 4 updates before it; "
            f"marks in the first 10% in brackets; jaxrl's seeds from the {S}-seed program):\n\n{learning}\n\n"
            f"Per env step, jaxrl's mean is >= the reference's, or the two do not differ at 95% (one's mean inside the "
            f"other's interval), at every mark past 10%: "
            f"**{'yes' if holds else 'no'}**.\n\nFirst logged mark at or above a training win rate:\n\n{reach_table}")
    return text, holds


def plot(results: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from report import save_figure, seed_band

    scenarios = list(results)
    fig, axes = plt.subplots(len(scenarios), 2, figsize=(10, 3.4 * len(scenarios)), dpi=100, squeeze=False)
    for row, scenario in zip(axes, scenarios):
        runs = results[scenario]
        for side, label in (("ours", "jaxrl (seeds in one program)"), ("reference", "JaxMARL mappo_rnn_smax.py")):
            marks, wins = curve(runs[side])
            seed_band(row[0], np.array(marks), np.array(wins, dtype=float), label)
        # Per second: runs of one seed each, as the reference script trains.
        for side_runs, label in (([runs["ours_alone"]], "jaxrl, seed 0 alone"),
                                 (runs["reference"], "JaxMARL mappo_rnn_smax.py")):
            marks, wins = curve(side_runs)
            walls = [[{r["env_steps"]: r["wall_time"] for r in run["rows"]}[m] for run in side_runs] for m in marks]
            seed_band(row[1], np.array(walls, dtype=float).mean(1), np.array(wins, dtype=float), label)
        row[0].set(xlabel="environment steps", ylabel="training win rate", title=f"{scenario}: per env step")
        row[1].set(xlabel="wall seconds (incl. compile)", ylabel="training win rate", title=f"{scenario}: per second")
    return save_figure(fig, path)


def render(results: dict, meta: dict) -> str:
    """The section of benchmarks/results/smax_mappo.md: per scenario, how and when it was measured, then its tables."""
    sections = []
    for scenario, runs in results.items():
        m = meta[scenario]
        text, _ = scenario_section(scenario, runs)
        sections.append(text.replace("\n\n", f"\n\n- Date: {m['date']}. Machine: {m['machine']}. jax {m['jax']}. "
                                     f"Command: `{m['command']}`. Reference at JaxMARL commit "
                                     f"{m['reference_commit']}.\n\n", 1))
    head = ("JaxMARL's `baselines/MAPPO/mappo_rnn_smax.py` with its own YAML config (scenario, seed and budget "
            "changed), one process per seed (`benchmarks/jaxmarl_reference.py`); ours: experiments/smax_mappo.py with "
            "the script's 128 envs x 128 steps, through `jaxrl.train.run` (logging every 4 updates, a checkpoint and a "
            "greedy evaluation at the end). The reference runs its seeds first, then ours runs seed 0 alone, then "
            "all seeds in one program; both in the same run of the script. Plot: `benchmarks/smax_mappo.png`; "
            "curves: `benchmarks/smax_mappo.json` (`--from-json` re-renders).")
    return head + "\n\n" + "\n\n".join(sections)


def default_config_runs(scenario: str, num_seeds: int) -> str:
    """Our default config: every seed's greedy win rate (one program), and seed 0 alone, timed."""
    config = experiment_config("smax_mappo", scenario)
    config.log.progress_bar = False
    config.eval.every_steps = 131_072
    (alone,) = run_ours(config)
    hit = first_reaching(alone, 0.9, "eval_win_rate")
    lines = [f"Default config `experiments/smax_mappo.py:{scenario}` ({config.num_envs} envs x {config.num_steps} "
             f"steps, {config.total_steps:,} env steps, greedy evaluation of {config.eval.num_envs} battles every "
             "131k steps)."]
    lines.append(f"- seed 0 alone: {alone['env_steps'] / alone['wall']:,.0f} env steps/s over the whole run "
                 f"(compile and evaluations included), {alone['wall']:.0f} s; greedy win rate >= 0.9 first at "
                 + (f"{hit[0]:,} env steps, **{hit[1]:.0f} s**" if hit else "- (never)")
                 + f"; final greedy win rate {alone['rows'][-1]['eval_win_rate']:.2f}")
    if num_seeds > 1:
        config.num_seeds = num_seeds
        final = [run["rows"][-1]["eval_win_rate"] for run in run_ours(config)]
        lines.append(f"- {num_seeds} seeds in one program: final greedy win rate per seed "
                     f"{', '.join(f'{w:.2f}' for w in final)}; mean **{sum(final) / len(final):.2f}**, "
                     f"lowest {min(final):.2f}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jaxmarl-repo", default=os.environ.get("JAXMARL_REPO"),
                        help="a checkout of the JaxMARL repository (or $JAXMARL_REPO)")
    parser.add_argument("--scenarios", default="3m,2s3z")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--total-steps", type=int, default=1_000_000)
    parser.add_argument("--from-json", help="re-render the tables and plot from saved curves")
    parser.add_argument("--default-seeds", type=int, default=0,
                        help="run only our default config (first scenario) with this many seeds")
    parser.add_argument("--update-results", action="store_true", help="update benchmarks/results/smax_mappo.md")
    args = parser.parse_args(argv)

    from report import publish

    from jaxrl import host

    host.keep_freed_memory()  # as `python -m jaxrl.train` does
    scenarios = args.scenarios.split(",")
    if args.default_seeds:
        print(default_config_runs(scenarios[0], args.default_seeds))
        return
    # Scenarios accumulate in the JSON: running them one at a time (or again) keeps the others' curves.
    saved = {"results": {}, "meta": {}}
    if args.from_json or os.path.exists(JSON_PATH):
        with open(args.from_json or JSON_PATH) as f:
            saved = json.load(f)
    results, meta = saved["results"], saved["meta"]
    if not args.from_json:
        if not args.jaxmarl_repo:
            parser.error("--jaxmarl-repo must name a checkout of the JaxMARL repository (its baselines/ are not "
                         "in the PyPI package)")
        problem = check_reference(args.jaxmarl_repo, "mappo")
        if problem:
            parser.error(problem)
        import jax

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.jaxmarl_repo, capture_output=True,
                                text=True).stdout.strip() or "unknown"
        for scenario in scenarios:
            reference = []
            for seed in range(args.seeds):
                reference.append(run_reference(args.jaxmarl_repo, scenario, seed, args.total_steps))
                print(f"{scenario} reference seed {seed}: {steps_per_second(reference[-1]):,.0f} env steps/s, "
                      f"final training win {reference[-1]['rows'][-1]['win_rate']:.2f}", flush=True)
            # Our config's XLA options are ours to choose; for fairness, the reference also runs once with them.
            our_options = recipe_config(scenario, args.total_steps, 0).xla_options
            same_xla = None
            if our_options:
                flags = " ".join(f"--{item.strip()}" for item in our_options.split(",") if item.strip())
                same_xla = run_reference(args.jaxmarl_repo, scenario, 0, args.total_steps, flags)
                same_xla["xla_flags"] = flags
                print(f"{scenario} reference seed 0 with XLA_FLAGS={flags}: {steps_per_second(same_xla):,.0f} "
                      "env steps/s", flush=True)
            (alone,) = run_ours(recipe_config(scenario, args.total_steps, 0))
            print(f"{scenario} jaxrl seed 0 alone: {steps_per_second(alone):,.0f} env steps/s", flush=True)
            config = recipe_config(scenario, args.total_steps, 0)
            config.num_seeds = args.seeds
            ours = run_ours(config)
            print(f"{scenario} jaxrl {args.seeds} seeds in one program: "
                  f"{args.seeds * steps_per_second(ours[0]):,.0f} env steps/s, final training win "
                  + ", ".join(f"{r['rows'][-1]['win_rate']:.2f}" for r in ours), flush=True)
            results[scenario] = {"reference": reference, "ours_alone": alone, "ours": ours,
                                 "reference_same_xla": same_xla}
            meta[scenario] = {
                "date": time.strftime("%Y-%m-%d"), "machine": report.machine(), "jax": jax.__version__,
                "command": f"python benchmarks/smax_mappo.py --jaxmarl-repo PATH --scenarios {scenario} "
                           f"--seeds {args.seeds} --total-steps {args.total_steps}", "reference_commit": commit}
            with open(JSON_PATH, "w") as f:
                json.dump({"results": results, "meta": meta}, f)
    plot(results, PLOT_PATH)
    publish(render(results, meta), args.update_results, MARKERS, "SMAX MAPPO against JaxMARL's script (issue 15)")


if __name__ == "__main__":
    main()
