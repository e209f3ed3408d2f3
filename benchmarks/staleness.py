"""Learning from stale samples: GRPO on Countdown from the SFT warm start, each update learning from the batch
sampled `actor.max_staleness` = eta updates before, with no correction, token-level truncated importance
sampling and AReaL's decoupled objective; and how much faster sampling and learning on devices of their own
(`mesh.split_actor`) turn over completions than the synchronous run on the same devices.

    python benchmarks/staleness.py --update-results
    python benchmarks/staleness.py --sft-dir runs/sft_countdown --etas 0,1,4 --corrections none,decoupled
    python benchmarks/staleness.py --sft-dir runs/sft_countdown --speed 10

1. SFT as in `benchmarks/text_rl.py` (or `--sft-dir` reuses a run of it): Countdown with numbers up to 25.
2. RL from its last checkpoint on numbers up to 50 (`--rl-task`): one row for eta = 0 (the synchronous run; a
   correction changes nothing there) and one per (eta, correction) for the other etas, 3 seeds per row trained
   as one program, every row drawing the same completions per seed (`--samples`; at eta > 0 the last eta
   batches are drawn and never learned from). AReaL's table, on our task: held-out greedy accuracy with its
   95% interval over seeds, and whether it stays within the synchronous run's interval.
3. `--speed N`: completions per second of the synchronous run on one device and on two (data parallel), of
   eta = 1 on one device, and of eta = 1 with one device sampling while the other learns, all in this process
   on 2 (fake, on a CPU) devices, each timed over N updates after its compiling one (median of 3 chunks).

On a CPU the script gives the process 2 host devices (XLA_FLAGS, before jax starts) for the timing; the
learning rows run on one device (a split run gives the same numbers).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from report import (compare_point, fake_host_devices, fmt_ci, machine, markdown_table, publish,  # noqa: E402
                    save_figure, seed_band, timed_chunks, usable_cores)
from rollout_strategies import curves, start_point  # noqa: E402
from text_rl import add_task_arguments, rl_config, sft_run  # noqa: E402

fake_host_devices(2)

MARKERS = ("<!-- staleness:start -->", "<!-- staleness:end -->")
SPEED_MARKERS = ("<!-- staleness:speed:start -->", "<!-- staleness:speed:end -->")  # (the same page)
CORRECTIONS = ("none", "tis_token", "decoupled")


def row_name(eta: int, correction: str) -> str:
    return "sync" if eta == 0 else f"eta={eta} {correction}"


def row_config(args, sft_dir: str, eta: int, correction: str, split: bool = False, devices: int = 1):
    """experiments/text_grpo.py:countdown as plain GRPO (one candidate per slot) at staleness `eta` on `devices`;
    `split` puts the actors and the learners on devices of their own (the same numbers as one device: the
    learning rows run on one)."""
    from jaxrl import config as config_lib

    config = rl_config(args, sft_dir, "grpo", args.samples, evals=args.evals)
    return config_lib.set_values(config, {
        "group.oversample": 1, "actor.max_staleness": eta, "loss.correction": correction if eta else "none",
        "mesh.split_actor": split, "mesh.num_devices": devices,
        "log.every_steps": config.num_prompts * config.group.size,  # every update: exact token counts
        "checkpoint.every_steps": config.eval.every_steps})


def learning(args, sft_dir: str, runs_dir: str, rows: list[tuple[int, str]]) -> dict:
    """Train every row (resuming one that was interrupted); {name: curves}, {name: wall seconds}."""
    from jaxrl import metrics as metrics_lib, train

    runs, walls = {}, {}
    start = start_point(row_config(args, sft_dir, 0, "none"))
    print(f"  warm start: accuracy {start[0]:.3f}", flush=True)
    for eta, correction in rows:
        name = row_name(eta, correction)
        config = row_config(args, sft_dir, eta, correction)
        workdir = os.path.join(runs_dir, name.replace("=", "").replace(" ", "_"))
        train.run(config, workdir, progress=False)
        metrics = metrics_lib.read(os.path.join(workdir, "metrics.jsonl"))
        runs[name], walls[name] = curves(metrics, config, args.seeds, start), metrics[-1]["wall_time"]
        c = runs[name]
        print(f"  {name}: {walls[name]:.0f} s, accuracy {c['accuracy'][0].mean():.3f} -> "
              f"{c['accuracy'][-1].mean():.3f}", flush=True)
    return runs, walls


def learning_table(runs: dict, walls: dict) -> str:
    sync = runs.get("sync")
    header = ["row", "final accuracy [95% interval]", "per seed", "against sync", "wall s (all seeds)"]
    table = []
    for name, c in runs.items():
        final = c["accuracy"][-1]
        against = "-" if sync is None or name == "sync" else compare_point(list(final), list(sync["accuracy"][-1]))
        table.append([name, fmt_ci(final, (0.0, 1.0)), ", ".join(f"{x:.3f}" for x in final), against,
                      f"{walls[name]:.0f}"])
    return markdown_table(header, table)


def plot(runs: dict, path: str, title: str) -> None:
    from jaxrl.metrics import new_figure

    fig = new_figure((12, 4.4))
    axes = fig.subplots(1, 2)
    for name, c in runs.items():
        seed_band(axes[0], c["tokens"] / 1e6, c["accuracy"], name)
        seed_band(axes[1], c["wall"], c["accuracy"], name)
    axes[0].set(xlabel="generated tokens per seed (millions)", ylabel="held-out greedy accuracy", title=title)
    axes[1].set(xlabel="wall seconds (all seeds of the row together)", ylabel="held-out greedy accuracy")
    axes[0].legend(fontsize=7)
    save_figure(fig, path)


SPEED_ROWS = {  # name -> (eta, split, devices)
    "sync, 1 device": (0, False, 1),
    "sync, 2 devices (data parallel)": (0, False, 2),
    "eta=1, 1 device": (1, False, 1),
    "eta=1, actor + learner devices": (1, True, 2),
}


def speed(args, sft_dir: str, updates: int) -> str:
    """Seconds per update, completions per second and CPU seconds per update (every thread of the process) of
    SPEED_ROWS, all in this process, from the warm start, no correction (the same work in every row): one update
    compiles (untimed), then `updates` updates are timed as one chunk; the median of 3 chunks. The least CPU
    work per update over the cores is what no layout of this machine can beat."""
    import jax

    from jaxrl import algos, mesh as mesh_lib
    from jaxrl.run.saved import start_params

    if jax.device_count() < 2:
        raise SystemExit("--speed compares layouts of 2 devices: this process has 1")
    header = ["layout", "s per update", "completions/s", "CPU s per update", "against sync on the same 2 devices"]
    table, rates, cpu, per_update = [], {}, {}, {}
    for name, (eta, split, devices) in SPEED_ROWS.items():
        config = row_config(args, sft_dir, eta, "none", split, devices)
        algos.validate(config)
        algo, hp = algos.build(config, mesh_lib.mesh_for_runs(config.mesh, config.num_seeds))
        state = algo.init_seeds(config.seed, config.num_seeds, start_params=start_params(algo.starts_from))
        state, _ = jax.block_until_ready(algo.run_chunk(state, hp, 1 + eta))  # (compiles; fills the queue)
        state, seconds, cpu[name], _ = timed_chunks(algo, state, hp, updates)
        per_update[name] = seconds
        rates[name] = config.num_prompts * config.group.size * config.num_seeds / seconds
        table.append([name, f"{seconds:.3f}", f"{rates[name]:,.0f}", f"{cpu[name]:.3f}"])
        print(f"  {name}: {seconds:.3f} s per update, {rates[name]:,.0f} completions/s, {cpu[name]:.3f} CPU s",
              flush=True)
    sync = rates["sync, 2 devices (data parallel)"]
    for line, name in zip(table, SPEED_ROWS):
        line.append(f"{rates[name] / sync:.2f}x")
    cores = usable_cores()
    least = min(cpu.values())
    ceiling = per_update["sync, 2 devices (data parallel)"] / (least / cores)
    return "\n".join([markdown_table(header, table), "",
                      f"Ceiling on this machine: the least CPU work per update ({least:.3f} s) spread over its {cores} "
                      f"cores takes {least / cores:.3f} s, {ceiling:.2f}x the synchronous data-parallel run's speed; "
                      f"the best layout measured: {max(rates.values()) / sync:.2f}x."])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_task_arguments(parser)
    parser.add_argument("--samples", type=int, default=25_600, help="completions drawn per seed, every row")
    parser.add_argument("--evals", type=int, default=5, help="held-out evaluations per row after the start")
    parser.add_argument("--etas", default="0,1,2,4,8")
    parser.add_argument("--corrections", default=",".join(CORRECTIONS), help=f"of {', '.join(CORRECTIONS)}")
    parser.add_argument("--runs-dir", default="", help="keep each row's run here (an interrupted benchmark resumes "
                        "its rows; finished rows are read back)")
    parser.add_argument("--plot", default=os.path.join(ROOT, "benchmarks", "staleness.png"))
    parser.add_argument("--update-results", action="store_true", help="update benchmarks/results/staleness.md")
    parser.add_argument("--speed", type=int, default=0, metavar="UPDATES",
                        help="also time UPDATES updates of each layout from the warm start (0: not)")
    parser.add_argument("--speed-only", action="store_true", help="only the timing (needs --speed)")
    args = parser.parse_args(argv)
    etas = [int(e) for e in args.etas.split(",") if e]
    chosen = [c for c in args.corrections.split(",") if c]
    if [c for c in chosen if c not in CORRECTIONS] or [e for e in etas if e < 0]:
        parser.error(f"--corrections are of {', '.join(CORRECTIONS)} and --etas are >= 0")
    if args.speed_only and not args.speed:
        parser.error("--speed-only needs --speed UPDATES")
    rows = [(eta, c) for eta in etas for c in (["none"] if eta == 0 else chosen)]

    from jaxrl import algos

    for eta, correction in rows:  # a misconfigured row fails before any training
        algos.validate(row_config(args, "", eta, correction))
    command = "python benchmarks/staleness.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"{args.task} ({args.rl_task}), {args.samples:,} completions per seed x {args.seeds} seeds per row; "
          f"{machine()}", flush=True)
    stamp = f"`{command.strip()}` ({datetime.date.today()}; {machine()})."
    title = "Stale samples and split devices (issue 61)"
    with tempfile.TemporaryDirectory() as scratch:
        sft_dir = sft_run(args, scratch)
        if not args.speed_only:
            runs, walls = learning(args, sft_dir, args.runs_dir or scratch, rows)
            plot(runs, args.plot, f"{args.task} ({args.rl_task}): staleness")
            with open(os.path.splitext(args.plot)[0] + ".json", "w") as f:
                json.dump({name: {k: v.tolist() for k, v in c.items()} for name, c in runs.items()}, f)
            publish("\n".join([
                stamp, "", "From the SFT run's last checkpoint, plain GRPO (one candidate per slot) on "
                f"{args.task} with {args.rl_task}, {args.samples:,} completions drawn per seed, {args.seeds} seeds "
                "per row (one program); held-out greedy accuracy after the last update. 'against sync': >= (mean at least the "
                "synchronous run's), within (the two 95% intervals overlap the other's mean) or BELOW.", "",
                learning_table(runs, walls), "",
                f"![staleness]({os.path.relpath(args.plot, os.path.join(ROOT, 'benchmarks'))})"]),
                args.update_results, MARKERS, title)
        if args.speed:
            publish("\n".join([
                stamp, "", f"Completions per second from the warm start ({args.speed} updates per timed chunk, median "
                f"of 3, {args.seeds} seeds in one program, no correction):", "", speed(args, sft_dir, args.speed)]),
                args.update_results, SPEED_MARKERS, title)


if __name__ == "__main__":
    main()
