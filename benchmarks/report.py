"""Shared by the benchmark scripts: their tables, as markdown that reads well in a terminal too."""

from __future__ import annotations

from jaxrl.metrics import markdown_table, per_seed, save_figure  # noqa: F401  (re-exported for the scripts)


def replace_section(path: str, markers: tuple[str, str], section: str, title: str) -> None:
    """Put `section` between the two marker lines of the markdown page at `path`, replacing what was there;
    without the markers, after the page's last section of the same benchmark (`<!-- NAME:...:end -->`), or where it
    has none, at its end under a new `## title` heading; without the page, create it under `# title`.
    A script writes its section as from benchmarks/ (a plot is `![...](name.png)`): each relative link is
    rewritten to hold from the page's folder (`../name.png` from benchmarks/results/)."""
    import os
    import re

    here, benchmarks = os.path.dirname(os.path.abspath(path)), os.path.dirname(os.path.abspath(__file__))

    def relink(match):
        target = match.group(2)
        if target.startswith(("#", "/")) or re.match(r"[a-z][a-z0-9+.-]*:", target):
            return match.group(0)
        return match.group(1) + os.path.relpath(os.path.join(benchmarks, target), here).replace(os.sep, "/") + ")"

    section = re.sub(r"(\]\()([^)\s]+)\)", relink, section)
    block = f"{markers[0]}\n{section}\n{markers[1]}"
    if not os.path.exists(path):
        os.makedirs(here, exist_ok=True)
        text = f"# {title}\n\n{block}\n"
    else:
        with open(path) as f:
            text = f.read()
        if markers[0] in text and markers[1] in text:
            start, end = text.index(markers[0]), text.index(markers[1]) + len(markers[1])
            text = text[:start] + block + text[end:]
        else:
            benchmark = markers[0].removeprefix("<!--").strip().split(":")[0]
            siblings = list(re.finditer(rf"<!-- {re.escape(benchmark)}:[^>]*:end -->", text))
            if siblings:
                text = text[:siblings[-1].end()] + "\n\n" + block + text[siblings[-1].end():]
            else:
                text = text.rstrip("\n") + f"\n\n## {title}\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


def paired_difference(a, b, draws: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """How much method a beats method b on the same problems: (mean of a minus mean of b, 95% interval), a and b
    float [seeds, problems] (each seed's outcome on each problem; one row for a method without seeds). The interval
    is a bootstrap's that draws the problems anew (one draw for both: they are paired) and each method's seeds anew,
    so it holds for other problems and other training seeds, not only for these."""
    import numpy as np

    a, b = np.atleast_2d(np.asarray(a, np.float64)), np.atleast_2d(np.asarray(b, np.float64))
    rng = np.random.default_rng(seed)
    problems = a.shape[1]
    weights = rng.multinomial(problems, np.full(problems, 1 / problems), size=draws) / problems  # [draws, problems]

    def resampled(x):  # [draws]: the mean over a draw of seeds of each seed's mean over a draw of problems
        seed_means = weights @ x.T  # [draws, seeds]
        return np.take_along_axis(seed_means, rng.integers(0, x.shape[0], seed_means.shape), axis=1).mean(1)

    low, high = np.percentile(resampled(a) - resampled(b), [2.5, 97.5])
    return float(a.mean() - b.mean()), float(low), float(high)


def timed(fn, *args):
    """(seconds, fn(*args)), timed until the result is ready on the device."""
    import time

    import jax

    tick = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - tick, out


def curve(runs: list[dict], key: str = "win_rate") -> tuple[list[int], list[list[float]]]:
    """Env-step marks every run's rows logged, and `key` of every run at each: [marks], [[runs]]."""
    marks = sorted(set.intersection(*({r["env_steps"] for r in run["rows"]} for run in runs)))
    by_steps = [{r["env_steps"]: r[key] for r in run["rows"]} for run in runs]
    return marks, [[b[m] for b in by_steps] for m in marks]


def fmt_ci(values, within: tuple[float, float] | None = None, digits: int = 2) -> str:
    """The mean over seeds with its 95% interval, "0.91 [0.80, 1.00]" (the mean alone for one value); `within`
    clips the interval to the values' range (a win rate's to (0, 1)); `digits` after the point."""
    from jaxrl.sweep import confidence_interval

    mean, low, high = confidence_interval(values)
    if low != low:
        return f"{mean:.{digits}f}"
    if within:
        low, high = max(low, within[0]), min(high, within[1])
    return fmt_interval(mean, low, high, digits)


def fmt_interval(mean: float, low: float, high: float, digits: int = 2, sign: str = "") -> str:
    """A figure with its interval, "0.91 [0.80, 1.00]"; sign="+" writes every sign, as a difference's
    ("+0.010 [-0.003, +0.022]")."""
    return f"{mean:{sign}.{digits}f} [{low:{sign}.{digits}f}, {high:{sign}.{digits}f}]"


def compare_point(ours: list[float], ref: list[float]) -> str:
    """'>=' where our mean is at least the reference's; 'within' where it is below but the two do not differ at
    95%: our mean inside the reference's interval or the reference's mean inside ours; else 'BELOW'."""
    from jaxrl.sweep import confidence_interval

    mean, _, high = confidence_interval(ours)
    ref_mean, ref_low, _ = confidence_interval(ref)
    if mean >= ref_mean:
        return ">="
    return "within" if mean >= ref_low or ref_mean <= high else "BELOW"


def fake_host_devices(count: int) -> None:
    """Give this process `count` host (CPU) devices, unless XLA_FLAGS already sets a count. XLA reads the flag
    when jax's backend starts (its first device query or computation): call it before that."""
    import os

    flag = "--xla_force_host_platform_device_count"
    if flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}={count}".strip()


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def timed_chunks(algo, state, hp, updates: int, repeats: int = 3):
    """`repeats` chunks of `updates` updates of a compiled algorithm: (state after them, median wall seconds per
    update, median CPU seconds per update of the whole process (every thread), each chunk's metrics)."""
    import statistics
    import time

    import jax

    seconds, cpu_seconds, chunks = [], [], []
    for _ in range(repeats):
        tick, cpu_tick = time.perf_counter(), time.process_time()
        state, metrics = jax.block_until_ready(algo.run_chunk(state, hp, updates))
        seconds.append((time.perf_counter() - tick) / updates)
        cpu_seconds.append((time.process_time() - cpu_tick) / updates)
        chunks.append(metrics)
    return state, statistics.median(seconds), statistics.median(cpu_seconds), chunks


def cpu_name() -> str:
    """The CPU's model name (Linux), else what `platform` knows."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine() -> str:
    """The machine a benchmark ran on, for its printed figures: cores, CPU model, OS, jax and its device."""
    import os
    import platform

    import jax

    device = jax.devices()[0]
    usable = usable_cores()
    cores = f"{os.cpu_count()} cores" if usable == os.cpu_count() else f"{usable} of {os.cpu_count()} cores (pinned)"
    return (f"{cores} ({cpu_name()}), {platform.system()}, jax {jax.__version__}, "
            f"{device.platform} ({device.device_kind})")


def seed_band(ax, x, y, label: str) -> None:
    """Plot the mean over seeds of y [n, S] against x [n], with the min-max band."""
    line, = ax.plot(x, y.mean(1), marker="o", markersize=3, label=label)
    ax.fill_between(x, y.min(1), y.max(1), color=line.get_color(), alpha=0.15)


def publish(section: str, update_results: bool, markers: tuple[str, str], title: str, draw=None) -> None:
    """Print a benchmark's section; with `update_results`, also put it into its results page,
    benchmarks/results/NAME.md for the markers `<!-- NAME:start -->` (created under `# title` when absent), and
    `draw()` the committed figures it shows (a run without it leaves them as the page has them)."""
    import os

    print(section)
    if update_results:
        if draw is not None:
            draw()
        name = markers[0].removeprefix("<!--").strip().split(":")[0]
        page = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"{name}.md")
        replace_section(page, markers, section, title)


def publish_sections(benchmark: str, title: str, sections: dict[str, list[str]], runs_dir: str, update_results: bool,
                     body, about: str, draw=None) -> None:
    """Publish each section of a learning benchmark's results page (`sections`: name -> the runs it reports) on its
    own, between its own markers, and only when `runs_dir` holds all of its runs finished: a directory with some of
    the benchmark's runs updates their sections and leaves the others as the page has them. `body(name)` -> [the
    section's heading, then its lines]; `about`: what follows the date, machine and command in its first line;
    `draw(name)`: draw the section's committed figures, if it has any."""
    import datetime
    import os

    for name, runs in sections.items():
        missing = [run for run in runs if not finished_run(os.path.join(runs_dir, run))]
        if missing:
            print(f"{name}: not published, runs not finished in {runs_dir}: {', '.join(missing)}")
            continue
        heading, *lines = body(name)
        made = (f"{datetime.date.today()}, {machine()}; `python benchmarks/{benchmark}.py --runs-dir DIR "
                f"--update-results`. {about}")
        markers = f"<!-- {benchmark}:{name}:start -->", f"<!-- {benchmark}:{name}:end -->"
        publish("\n".join([heading, "", made, "", *lines]), update_results, markers, title,
                draw=None if draw is None else lambda name=name: draw(name))


# --- runs trained by `python -m jaxrl.train` in a runs directory, reused when there (learning benchmarks) ---------

def chosen_names(parser, spec: str, known, what: str) -> list[str]:
    """The names of a comma-separated command-line value `spec`, each one of `known`; else the parser's one-line
    error naming the unknown ones (`what`: the kind, plural)."""
    names = [n for n in spec.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return names


def runs_arguments(description: str, runs: dict, train):
    """A learning benchmark's command line (--runs-dir, --only, --update-results), then `train(runs_dir, name)` for
    each run of `runs` chosen (all by default; --only='': none, the tables from the runs already there)."""
    import argparse
    import os

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runs-dir", required=True, help="where the runs are kept (and reused)")
    parser.add_argument("--only", default=None, help="comma-separated run names to train (default: all; '': none, "
                        "the tables from the runs already there)")
    parser.add_argument("--update-results", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.runs_dir, exist_ok=True)
    for name in runs:
        if args.only is None or name in args.only.split(","):
            train(args.runs_dir, name)
    return args


def seed_values(summary: dict, key: str) -> list[float]:
    """An evaluation summary's `key` for every seed (its `<key>_per_seed` list, or the one value)."""
    return summary.get(f"{key}_per_seed") or [summary[key]]


def train_run(runs_dir: str, name: str, experiment: str, init_from: str | None, flags: list[str]) -> None:
    """`python -m jaxrl.train --config=experiments/<experiment>` into runs_dir/name with `flags` (and
    `--config.init_from=runs_dir/<init_from>`), unless that run already trained its whole budget."""
    import os
    import subprocess
    import sys

    workdir = os.path.join(runs_dir, name)
    if finished_run(workdir):
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [sys.executable, "-m", "jaxrl.train", f"--config={root}/experiments/{experiment}", f"--workdir={workdir}",
               *flags]
    if init_from:
        command.append(f"--config.init_from={os.path.join(runs_dir, init_from)}")
    print("running:", " ".join(command), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def finished_run(workdir: str) -> bool:
    """The run trained its whole budget (its last row is at total_steps, less a partial update)."""
    import json
    import os

    if not os.path.exists(os.path.join(workdir, "metrics.jsonl")):
        return False
    total = json.load(open(os.path.join(workdir, "config.json")))["total_steps"]
    rows = run_rows(workdir)
    return bool(rows) and rows[-1].get("env_steps", 0) >= 0.99 * total


def run_rows(workdir: str) -> list[dict]:
    """A run's metrics.jsonl rows."""
    import json
    import os

    return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


def evaluated(runs_dir: str, name: str, sample: bool = False, episodes: int = 1024) -> dict:
    """`python -m jaxrl.evaluate` of runs_dir/name on `episodes` held-out problems (greedy, or sampled at temperature
    1), cached as runs_dir/eval_{greedy,sample}_NAME.json while it is of the run's last update and as many
    episodes."""
    import json
    import os
    import subprocess
    import sys

    kind = "sample" if sample else "greedy"
    path = os.path.join(runs_dir, f"eval_{kind}_{name}.json")
    last_update = run_rows(os.path.join(runs_dir, name))[-1]["update"]
    if os.path.exists(path) and os.path.getsize(path):
        summary = json.loads(open(path).read().strip().splitlines()[-1])
        if (summary.get("update"), summary.get("episodes")) == (last_update, episodes):
            return summary
    command = [sys.executable, "-m", "jaxrl.evaluate", f"--workdir={os.path.join(runs_dir, name)}",
               f"--episodes={episodes}", f"--out={os.path.join(runs_dir, f'eval_{kind}_{name}')}"]
    out = subprocess.run(command + ["--sample"] * sample, check=True, capture_output=True, text=True).stdout
    with open(path, "w") as f:
        f.write(out)
    return json.loads(out.strip().splitlines()[-1])
