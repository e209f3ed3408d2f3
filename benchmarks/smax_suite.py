"""SMAX across the benchmark: every scenario of JaxMARL's table, every learner, several seeds in one program.

For each scenario in turn, and each learner on it (experiments/smax_<learner>.py:<scenario>, the config a user
runs), trains `--seeds` seeds as one program for `--total-steps` env steps per seed, with a greedy
evaluation of 64 battles per seed every `--eval-every` steps, in `--runs-dir`/<learner>/<scenario>. The suite
resumes after an interruption: finished cells are skipped, a cell stopped midway continues from its last
checkpoint, and a larger `--total-steps` extends finished cells. Each cell's curves go to
benchmarks/smax_suite.json when it ends. The schedules (MAPPO's learning rate, QMIX's exploration) run over
the budget, so a cell extended from 1M to 10M steps is not the 10M-step run from its start: for a budget's
figures, train the cells with that budget from the start (another --runs-dir).

With `--reference-repo`, JaxMARL's own baseline scripts (recurrent MAPPO, IPPO, QMIX, VDN and IQL, one process
per seed, `benchmarks/jaxmarl_reference.py`) run on the same scenarios for the same env steps; their training win
rates are compared with ours at equal env steps. Script curves that benchmarks/smax_mappo.json and smax_qmix.json
already hold are used where the suite has none of its own, with their dates.

    python benchmarks/smax_suite.py --runs-dir ~/smax_suite --scenarios 3m,2s3z,5m_vs_6m --total-steps 1000000
    python benchmarks/smax_suite.py --runs-dir ~/smax_suite --total-steps 10000000 --seeds 5   # the paper's budget
    python benchmarks/smax_suite.py --runs-dir ~/smax_suite --reference-repo PATH/TO/JaxMARL --scenarios 3m
    python benchmarks/smax_suite.py --report --update-results     # tables and plot from smax_suite.json

A cell whose training program cannot fit in the memory this machine has free is not started (the training
loop's check, `jaxrl.run.fit`; the kernel would otherwise end the whole suite): its table cell says what it
needs. Suites may run side by side (other learners or scenarios): each finished cell is written into the
results file as the file stands then.

Prints and writes: the final greedy win rate of every learner on every scenario (mean over seeds, 95%
Student-t interval), the cost of each cell (wall seconds, env steps per second), the comparison with
JaxMARL's scripts, JaxMARL's published IPPO and MAPPO figures beside ours (`PUBLISHED`), and a grid of curves
(benchmarks/smax_suite.png).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import report  # noqa: E402  benchmarks/
from report import compare_point, fmt_ci  # noqa: E402

WIN_RATE = (0.0, 1.0)  # where the intervals of win rates are clipped

# The SMAX scenarios of the JaxMARL paper's table, and the learners it reports on them.
SCENARIOS = ("3m", "2s3z", "25m", "3s5z", "3s_vs_5z", "5m_vs_6m", "6h_vs_8z", "10m_vs_11m", "27m_vs_30m",
             "3s5z_vs_3s6z", "smacv2_5_units", "smacv2_10_units", "smacv2_20_units")
LEARNERS = ("mappo", "ippo", "qmix", "vdn", "iql")
LOG_EVERY = 65_536  # env steps between logged rows, ours and the reference's windows alike
MARKERS = ("<!-- smax_suite:start -->", "<!-- smax_suite:end -->")
JSON_PATH = os.path.join(ROOT, "benchmarks", "smax_suite.json")

# JaxMARL's final win rates after 10M env steps per seed (recurrent IPPO and MAPPO), as Mava's SMAX benchmark
# quotes them beside its own runs: dashed lines in docs/images/smax_results/*.png of instadeepai/Mava at a9dc878
# (2024-02-08), read off at the gridlines; no intervals. Mava took them from an early arXiv version of the paper
# (2311.10090), whose later versions changed them (Mava issue 1149); the paper's own text was not available here,
# and neither were its figures for 3m, 25m, the smacv2 scenarios, or QMIX, VDN and IQL.
PUBLISHED_STEPS = 10_000_000
PUBLISHED = {
    "2s3z": {"ippo": 0.90, "mappo": 1.00}, "3s5z": {"ippo": 0.55, "mappo": 0.70},
    "3s_vs_5z": {"ippo": 0.60, "mappo": 0.00}, "5m_vs_6m": {"ippo": 0.12, "mappo": 0.05},
    "6h_vs_8z": {"ippo": 0.95, "mappo": 0.20}, "10m_vs_11m": {"ippo": 0.28, "mappo": 0.40},
    "27m_vs_30m": {"ippo": 0.10, "mappo": 0.15}, "3s5z_vs_3s6z": {"ippo": 0.02, "mappo": 0.35},
}
PUBLISHED_SOURCE = ("JaxMARL's 10M-step final win rates as Mava's SMAX benchmark quotes them (instadeepai/Mava "
                    "docs/images/smax_results at a9dc878, read off its plots; from an early arXiv version of the "
                    "paper, later revised)")
PLOT_PATH = os.path.join(ROOT, "benchmarks", "smax_suite.png")


def cell_config(learner: str, scenario: str, seeds: int, total_steps: int | None, eval_every: int):
    """experiments/smax_<learner>.py:<scenario> with `seeds` seeds in one program, `total_steps` per seed (None:
    the experiment's own budget), a greedy evaluation and a checkpoint every `eval_every` env steps."""
    from jaxrl import config as config_lib

    config = config_lib.from_file(os.path.join(ROOT, "experiments", f"smax_{learner}.py:{scenario}"))
    config.num_seeds = seeds
    if total_steps:
        config.total_steps = total_steps
    config.log.every_steps = LOG_EVERY
    config.log.progress_bar = False
    config.eval.every_steps = eval_every
    config.checkpoint.every_steps = eval_every  # an interruption loses at most one interval
    return config


def curves(rows: list[dict], num_seeds: int, key: str) -> dict:
    """{"marks": [env steps], "values": [[per seed] at each mark]} of the rows that logged `key`."""
    from jaxrl.metrics import per_seed

    logged = [(row["env_steps"], per_seed(row, key, num_seeds)) for row in rows]
    logged = [(mark, values) for mark, values in logged if values is not None]
    return {"marks": [mark for mark, _ in logged], "values": [values for _, values in logged]}


def cell_record(config, rows: list[dict]) -> dict:
    """What the suite keeps of a finished cell: its budget, curves (greedy and training win rates per seed),
    wall seconds (across resumes), compile seconds and env steps per second (all seeds)."""
    import jax

    last = rows[-1]
    return {"seeds": config.num_seeds, "total_steps": config.total_steps, "env_steps": last["env_steps"],
            "greedy": curves(rows, config.num_seeds, "eval_win_rate"),
            "training": curves(rows, config.num_seeds, "win_rate"),
            "wall": last["wall_time"], "compile": round(sum(r.get("compile_seconds", 0.0) for r in rows), 1),
            "steps_per_second": round(last["env_steps"] * config.num_seeds / last["wall_time"], 1),
            "date": time.strftime("%Y-%m-%d"), "machine": report.machine(), "jax": jax.__version__}


def reachable_steps(config) -> int:
    """The env steps per seed a run of `config` ends at: whole updates of num_envs x num_steps."""
    batch = config.num_envs * config.num_steps
    return config.total_steps // batch * batch


def cell_done(record: dict | None, config) -> bool:
    return bool(record) and "error" not in record and record["seeds"] == config.num_seeds \
        and record["env_steps"] >= reachable_steps(config)


def run_cell(config, workdir: str) -> tuple[dict | None, bool]:
    """Train (or resume) one cell; (its record, whether it was interrupted). A cell whose program cannot fit
    in memory (`jaxrl.run.fit`, checked before anything is allocated: a process the kernel kills for memory
    would end the whole suite) gets a record that says so, with the figures."""
    from jaxrl import train
    from jaxrl.run import fit

    try:
        result = train.run(config, workdir)
    except fit.DoesNotFit as error:
        needed, free = fit.format_bytes(error.fit.needed), fit.format_bytes(error.fit.available)
        return {"error": f"not run: needs {needed} ({config.num_seeds} seeds), {free} free", "skipped": True}, False
    if result.interrupted:
        return None, True
    return cell_record(config, result.metrics), False


def reference_runs(repo: str, learner: str, scenario: str, seeds: int, total_steps: int) -> dict:
    """JaxMARL's script for `learner`, one process per seed; rows averaged over windows of LOG_EVERY steps."""
    from jaxmarl_reference import reference_config, run_in_subprocess

    script = reference_config(repo, learner, scenario, 0, total_steps)
    every = max(1, LOG_EVERY // (script["NUM_ENVS"] * script["NUM_STEPS"]))
    runs = []
    for seed in range(seeds):
        run = run_in_subprocess(repo, learner, scenario, seed, total_steps, every)
        del run["last"]
        runs.append(run)
        print(f"{scenario} JaxMARL {learner} script seed {seed}: {run['env_steps'] / run['wall']:,.0f} env steps/s, "
              f"final training win rate {run['rows'][-1]['win_rate']:.2f}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                            text=True).stdout.strip() or "an unversioned copy"
    return {"runs": runs, "total_steps": total_steps, "date": time.strftime("%Y-%m-%d"), "commit": commit,
            "source": f"benchmarks/smax_suite.py --reference-repo (JaxMARL {commit})"}


def stored_references() -> dict:
    """{scenario: {learner: reference}} from the JaxMARL script curves that smax_mappo.json and smax_qmix.json
    hold (training win rate per run, logged every LOG_EVERY steps as here)."""
    found: dict = {}
    path = os.path.join(ROOT, "benchmarks", "smax_mappo.json")
    if os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        for scenario, runs in saved["results"].items():
            meta = saved["meta"][scenario]
            found.setdefault(scenario, {})["mappo"] = {
                "runs": runs["reference"], "total_steps": runs["reference"][0]["env_steps"], "date": meta["date"],
                "source": f"benchmarks/smax_mappo.json (JaxMARL {meta['reference_commit']})"}
    path = os.path.join(ROOT, "benchmarks", "smax_qmix.json")
    if os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        runs = saved["results"]["reference"]
        found.setdefault(saved["meta"]["scenario"], {})["qmix"] = {
            "runs": runs, "total_steps": runs[0]["env_steps"], "date": saved["meta"]["date"],
            "source": f"benchmarks/smax_qmix.json (JaxMARL {saved['meta']['commit']})"}
    return found


def all_references(saved: dict) -> dict:
    """{scenario: {learner: reference}}: the suite's own script runs, else the stored ones."""
    references = stored_references()
    for scenario, by_learner in saved.get("references", {}).items():
        references.setdefault(scenario, {}).update(by_learner)
    return references


# --------------------------------------------------------------------------------------------------
# The report, from the saved cells: {"cells": {scenario: {learner: record}}, "references": {scenario: {learner: ref}}}


def in_paper_order(cells: dict) -> list[str]:
    """The scenarios `cells` holds, in the order of the paper's table (any others after them)."""
    return [s for s in SCENARIOS if s in cells] + [s for s in cells if s not in SCENARIOS]


def final_greedy(record: dict) -> list[float] | None:
    values = record.get("greedy", {}).get("values")
    return values[-1] if values else None


def summary_table(cells: dict, learners: list[str]) -> str:
    """Scenario rows, learner columns: final greedy win rate, mean [95% interval], and the env steps per seed
    (in each cell where a row's budgets differ)."""
    from jaxrl.metrics import markdown_table

    rows = []
    for scenario in in_paper_order(cells):
        steps = sorted({r["env_steps"] for r in cells[scenario].values() if "env_steps" in r})
        row = [scenario, " / ".join(f"{s / 1e6:.2f}M" for s in steps)]
        for learner in learners:
            record = cells[scenario].get(learner)
            if record is None:
                row.append("-")
            elif "error" in record:
                row.append(record["error"] if record.get("skipped") else "failed")
            else:  # a row whose cells ran different budgets names each cell's
                row.append(fmt_ci(final_greedy(record), WIN_RATE)
                           + (f" at {record['env_steps'] / 1e6:.2f}M" if len(steps) > 1 else ""))
        rows.append(row)
    return markdown_table(["scenario", "env steps per seed", *learners], rows)


def cost_table(cells: dict, learners: list[str]) -> str:
    """Wall seconds of every cell (all its seeds, compilation and evaluations included) and env steps per second."""
    from jaxrl.metrics import markdown_table

    rows = []
    for scenario in in_paper_order(cells):
        by_learner, row = cells[scenario], [scenario]
        for learner in learners:
            record = by_learner.get(learner)
            row.append("-" if record is None or "error" in record else
                       f"{record['wall']:,.0f} s, {record['steps_per_second']:,.0f}/s")
        rows.append(row)
    return markdown_table(["scenario", *(f"{l}: wall, env steps/s" for l in learners)], rows)


def reference_table(cells: dict, references: dict) -> tuple[str, dict]:
    """Our training win rate against JaxMARL's script's at the last env-step mark both logged: mean [95%
    interval] and the verdict of `compare_point`; also {(scenario, learner): verdict}."""
    from jaxrl.metrics import markdown_table

    rows, verdicts = [], {}
    for scenario, by_learner in references.items():
        for learner, reference in by_learner.items():
            record = cells.get(scenario, {}).get(learner)
            if not record or "error" in record:
                continue
            ours = dict(zip(record["training"]["marks"], record["training"]["values"]))
            theirs = report.curve(reference["runs"])
            shared = [m for m in theirs[0] if m in ours]
            if not shared:
                continue
            mark = shared[-1]
            ref_values = theirs[1][theirs[0].index(mark)]
            verdict = compare_point(ours[mark], ref_values)
            verdicts[(scenario, learner)] = verdict
            rows.append([scenario, learner, f"{mark / 1e6:.2f}M",
                         f"{fmt_ci(ours[mark], WIN_RATE)} ({len(ours[mark])})",
                         f"{fmt_ci(ref_values, WIN_RATE)} ({len(ref_values)})", verdict, reference["source"],
                         reference["date"]])
    header = ["scenario", "learner", "env steps", "jaxrl (seeds)", "JaxMARL script (seeds)", "jaxrl vs script",
              "script's curves from", "measured"]
    return markdown_table(header, rows), verdicts


def published_table(cells: dict) -> str:
    """Our final greedy win rate beside JaxMARL's published one (PUBLISHED, after PUBLISHED_STEPS): '>=' where our
    mean is at least the figure, 'within' where the figure lies inside our interval, else 'lower'; and at what
    share of the published budget ours was measured (a 'lower' at fewer steps is not a loss at equal steps)."""
    from jaxrl.metrics import markdown_table

    rows = []
    for scenario in in_paper_order(cells):
        for learner, figure in PUBLISHED.get(scenario, {}).items():
            record = cells[scenario].get(learner)
            if not record or "error" in record:
                continue
            ours = final_greedy(record)
            verdict = compare_point(ours, [figure]).replace("BELOW", "lower")
            rows.append([scenario, learner, f"{fmt_ci(ours, WIN_RATE)} at {record['env_steps'] / 1e6:.2f}M",
                         f"{figure:.2f} at {PUBLISHED_STEPS / 1e6:.0f}M", verdict,
                         f"{record['env_steps'] / PUBLISHED_STEPS:.1%}"])
    return markdown_table(["scenario", "learner", "jaxrl greedy", "JaxMARL published", "jaxrl vs published",
                           "our steps / theirs"], rows)


def plot(cells: dict, references: dict, learners: list[str], path: str) -> str:
    """A grid with a panel per scenario: each learner's greedy win rate (mean over seeds, min-max band, solid)
    and training win rate (dashed); where JaxMARL's script for a learner was run, its training win rate (dotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    scenarios = in_paper_order(cells)
    cols = min(4, len(scenarios))
    rows = -(-len(scenarios) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), dpi=100, squeeze=False)
    colours = dict(zip(LEARNERS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, scenario in zip(axes.flat, scenarios):
        for learner in learners:
            record = cells[scenario].get(learner)
            if not record or "error" in record:
                continue
            colour = colours[learner]
            marks, values = np.array(record["greedy"]["marks"]) / 1e6, np.array(record["greedy"]["values"], float)
            ax.plot(marks, values.mean(1), marker="o", markersize=3, color=colour, label=f"{learner} (greedy)")
            ax.fill_between(marks, values.min(1), values.max(1), color=colour, alpha=0.15)
            training = np.array(record["training"]["values"], float)  # (None, a seed with no episode: NaN)
            ax.plot(np.array(record["training"]["marks"]) / 1e6, np.nanmean(training, 1), linestyle="--",
                    linewidth=1, color=colour, label=f"{learner} (training)")
            reference = references.get(scenario, {}).get(learner)
            if reference:
                ref_marks, ref_wins = report.curve(reference["runs"])
                ax.plot(np.array(ref_marks) / 1e6, np.array(ref_wins, float).mean(1), linestyle=":", linewidth=1.5,
                        color=colour, label=f"JaxMARL {learner} script (training)")
        ax.set(title=scenario, ylim=(-0.02, 1.02))
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(scenarios):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("win rate")
    for ax in axes[-1]:
        ax.set_xlabel("env steps per seed (M)")
    handles = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    ncol = max(1, cols - 1)
    legend_inches = 0.2 * -(-len(handles) // ncol) + 0.2  # under the panels
    fig.set_size_inches(3.6 * cols, 2.8 * rows + legend_inches)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=ncol, frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, legend_inches / (2.8 * rows + legend_inches), 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def render(saved: dict, learners: list[str]) -> str:
    """The section of benchmarks/results/smax_suite.md."""
    cells = saved["cells"]
    references = all_references(saved)
    records = [r for by_learner in cells.values() for r in by_learner.values() if "error" not in r]
    machines = sorted({f"{r['machine']}" for r in records})
    dates = sorted({r["date"] for r in records})
    seeds = sorted({r["seeds"] for r in records})
    comparison, verdicts = reference_table(cells, references)
    below = [f"{s} {l}" for (s, l), v in verdicts.items() if v == "BELOW"]
    plot(cells, references, learners, PLOT_PATH)
    lines = [
        f"- Measured {', '.join(dates)} on {'; '.join(machines)}; {', '.join(map(str, seeds))} seeds per cell trained "
        "as one program; `experiments/smax_<learner>.py:<scenario>` as they are, budgets as stated per row. "
        "Command: `python benchmarks/smax_suite.py --runs-dir DIR --scenarios ... --total-steps N` (then "
        "`--report --update-results`).",
        "- Final greedy win rate (64 battles per seed, mean over seeds, 95% Student-t interval), at the env steps "
        "per seed each row states:",
        "", summary_table(cells, learners), "",
        "Cost of each cell (all its seeds; compilation and evaluations included):", "", cost_table(cells, learners),
    ]
    if comparison.count("\n") > 1:
        lines += ["", "Against JaxMARL's own scripts at equal env steps (training win rate, the stochastic policy, "
                  "averaged over the 65,536 steps before the mark; '>=' our mean is at least theirs, 'within' the two "
                  "means do not differ at 95%). The scripts run their own recipes (MAPPO and IPPO 128 envs; ours 64); "
                  "curves read from smax_mappo.json and smax_qmix.json come from runs with their own budgets (1M, "
                  "204,800 steps), whose schedules differ from a shorter cell's:", "", comparison, "",
                  "Below the script at 95%: " + (", ".join(below) if below else "none") + "."]
    published = published_table(cells)
    if published.count("\n") > 1:
        lines += ["", f"Beside {PUBLISHED_SOURCE}. Theirs is the training win rate of the stochastic policy, ours "
                  "the greedy one; 'lower' at a small share of their steps says nothing about equal steps:", "",
                  published]
    lines += ["", "Curves: `benchmarks/smax_suite.png`; per-seed values: `benchmarks/smax_suite.json`."]
    return "\n".join(lines)


def load_saved() -> dict:
    if os.path.exists(JSON_PATH):
        with open(JSON_PATH) as f:
            return json.load(f)
    return {"cells": {}, "references": {}}


def store(kind: str, scenario: str, learner: str, entry: dict) -> None:
    """Set saved[kind][scenario][learner] = entry in the JSON as it is on disk now, so that suites running side by
    side (other learners, other scenarios) keep each other's cells; written whole, then renamed."""
    saved = load_saved()
    saved[kind].setdefault(scenario, {})[learner] = entry
    partial = f"{JSON_PATH}.{os.getpid()}.tmp"
    with open(partial, "w") as f:
        json.dump(saved, f)
    os.replace(partial, JSON_PATH)


def parse_names(text: str, known: tuple[str, ...], what: str) -> list[str]:
    names = known if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"error: unknown {what} {', '.join(unknown)} (known: {', '.join(known)})")
    return list(names)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", help="where each cell trains and keeps its checkpoints (resumable)")
    parser.add_argument("--scenarios", default="all", help="comma-separated, or 'all' (the paper's 13)")
    parser.add_argument("--learners", default="mappo,ippo,qmix,vdn,iql")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--total-steps", type=int, default=None,
                        help="env steps per seed (default: each experiment's own budget)")
    parser.add_argument("--eval-every", type=int, default=262_144, help="env steps between greedy evaluations")
    parser.add_argument("--reference-repo", help="a JaxMARL checkout: also run its scripts of the learners chosen")
    parser.add_argument("--reference-seeds", type=int, default=3)
    parser.add_argument("--report", action="store_true", help="only print (and write) the report from the JSON")
    parser.add_argument("--update-results", action="store_true", help="update benchmarks/results/smax_suite.md")
    args = parser.parse_args(argv)
    scenarios = parse_names(args.scenarios, SCENARIOS, "scenario")
    learners = parse_names(args.learners, LEARNERS, "learner")
    if not args.report and not args.runs_dir:
        parser.error("--runs-dir is required to train (or pass --report)")
    if args.reference_repo:
        from jaxmarl_reference import check_reference
        problem = check_reference(args.reference_repo, *learners)
        if problem:
            parser.error(problem)

    from jaxrl import host

    host.keep_freed_memory()  # as `python -m jaxrl.train` does
    if not args.report:
        # Every cell's config is built (and checked) before anything trains.
        configs = {(s, l): cell_config(l, s, args.seeds, args.total_steps, args.eval_every)
                   for s in scenarios for l in learners}
        for scenario in scenarios:
            for learner in learners:
                config = configs[(scenario, learner)]
                previous = load_saved()["cells"].get(scenario, {}).get(learner)
                if cell_done(previous, config):
                    print(f"{scenario} {learner}: done ({previous['env_steps']:,} env steps)", flush=True)
                    continue
                try:
                    record, interrupted = run_cell(config, os.path.join(args.runs_dir, learner, scenario))
                except Exception as error:  # one failed cell must not end a suite of hours; it is reported
                    print(f"{scenario} {learner}: FAILED: {type(error).__name__}: {error}", flush=True)
                    if previous is None or "error" in previous:  # a finished record is kept
                        store("cells", scenario, learner, {"error": f"{type(error).__name__}: {error}"})
                    continue
                if interrupted:
                    print("interrupted: run the same command to resume", flush=True)
                    return 1
                if record.get("skipped"):
                    print(f"{scenario} {learner}: {record['error']}", flush=True)
                    if previous is None or "error" in previous:
                        store("cells", scenario, learner, record)
                    continue
                store("cells", scenario, learner, record)
                print(f"{scenario} {learner}: greedy win rate {fmt_ci(final_greedy(record), WIN_RATE)} at "
                      f"{record['env_steps']:,} env steps, {record['wall']:,.0f} s", flush=True)
            if args.reference_repo:
                for learner in learners:  # each has a JaxMARL script (jaxmarl_reference.SCRIPTS)
                    saved = load_saved()
                    record = saved["cells"].get(scenario, {}).get(learner, {})
                    total = record.get("env_steps") or reachable_steps(configs[(scenario, learner)])  # as ours
                    done = all_references(saved).get(scenario, {}).get(learner)
                    if done and done["total_steps"] >= total and len(done["runs"]) >= args.reference_seeds:
                        print(f"{scenario} JaxMARL {learner} script: curves to {done['total_steps']:,} steps in "
                              f"{done['source']}", flush=True)
                        continue
                    store("references", scenario, learner, reference_runs(
                        args.reference_repo, learner, scenario, args.reference_seeds, total))
    saved = load_saved()
    if not saved["cells"]:
        parser.error(f"{JSON_PATH} holds no cells yet: train some first (--runs-dir)")
    report.publish(render(saved, learners), args.update_results, MARKERS,
                   "SMAX across the benchmark (benchmarks/smax_suite.py, issue 21)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
