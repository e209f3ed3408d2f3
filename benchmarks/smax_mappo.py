"""MAPPO on SMAX with the recipe of jaxmarl's recurrent SMAX MAPPO baseline: whole-loop speed and learning.

Trains our MAPPO with that recipe (GRU 128, FC 128, relu, 128 envs x 128 steps, 4 epochs x 4 minibatches,
lr 2e-3 annealed, clip 0.2, no entropy bonus, gradient norm 0.25) on our SMAX and, through the adapter,
on jaxmarl's SMAX, each through the full training loop (`jaxrl.train.run`: logging, checkpoints, a
greedy evaluation at the end), and prints env steps/second and the training win rate at the env-step
marks where the reference's own MAPPO script was measured. Then our default config
(experiments/smax_mappo.py), timed to the first greedy evaluation with win rate >= 0.9.

    python benchmarks/smax_mappo.py                          # 3m, 2.4M steps each, ~15 minutes on 2 cores
    python benchmarks/smax_mappo.py --total-steps 500000 --no-default
    python benchmarks/smax_mappo.py --no-reference           # ours only (no jaxmarl needed)

The reference figures are jaxmarl's own `mappo_rnn_smax.py` on 3m, measured on this 2-core machine with
jax 0.10.2 (jaxmarl 0.2.0 does not ship its baselines, so they are not re-run here).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# jaxmarl's mappo_rnn_smax.py on 3m, whole loop, 2 CPU cores, jax 0.10.2.
REFERENCE_STEPS_PER_SECOND = 2_200
REFERENCE_WIN_MARKS = [(280_000, 0.5, 156), (870_000, 0.8, 418), (2_360_000, 0.9, 1_101)]  # (steps, win, s)


def experiment_config(name: str, scenario: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "experiments", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(scenario)


def recipe_config(scenario: str, env_name: str, total_steps: int, seed: int):
    """experiments/smax_mappo.py switched to the reference recipe (it differs only in num_envs)."""
    config = experiment_config("smax_mappo", scenario)
    config.experiment = f"bench_mappo_{env_name}_{scenario}"
    config.env.name = env_name
    config.num_envs, config.num_steps = 128, 128
    config.total_steps = total_steps
    config.seed = seed
    config.log.every_steps = 4 * 128 * 128
    config.log.progress_bar = False
    config.eval.every_steps = 0  # only at the end
    config.checkpoint.every_steps = total_steps
    return config


def win_at(rows: list[dict], steps: int) -> float | None:
    """Training win rate of the first logged interval that reaches `steps`."""
    for row in rows:
        if row["env_steps"] >= steps and row.get("win_rate") is not None:
            return row["win_rate"]
    return None


def first_reaching(rows: list[dict], key: str, threshold: float) -> tuple[int, float] | None:
    """(env steps, wall seconds) of the first row whose `key` >= threshold."""
    for row in rows:
        if (row.get(key) or 0.0) >= threshold:
            return row["env_steps"], row["wall_time"]
    return None


def run(config) -> dict:
    from jaxrl import train

    with tempfile.TemporaryDirectory() as workdir:
        result = train.run(config, workdir)
    rows = result.metrics
    compile_s = sum(r.get("compile_seconds", 0.0) for r in rows)
    wall = rows[-1]["wall_time"]
    return {"rows": rows, "steps": rows[-1]["env_steps"], "wall": wall, "compile": compile_s,
            "whole_loop_sps": rows[-1]["env_steps"] / wall,
            "eval_win_rate": rows[-1].get("eval_win_rate"), "win_rate": rows[-1].get("win_rate")}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="3m")
    parser.add_argument("--total-steps", type=int, default=2_400_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-reference", action="store_true", help="skip jaxmarl's SMAX through the adapter")
    parser.add_argument("--no-default", action="store_true", help="skip the run of our default config")
    args = parser.parse_args(argv)

    import jax

    envs_to_run = [("smax", "ours")]
    if not args.no_reference:
        try:
            import jaxmarl  # noqa: F401
            envs_to_run.append(("jaxmarl-smax", "jaxmarl SMAX via adapter"))
        except ImportError:
            print("jaxmarl is not installed: its SMAX is skipped (pip install jaxmarl==0.2.0)")
    print(f"MAPPO, reference recipe, {args.scenario}, {args.total_steps:,} env steps, seed {args.seed}, "
          f"{jax.device_count()} {jax.devices()[0].platform} device(s), jax {jax.__version__}")

    marks = [m for m in REFERENCE_WIN_MARKS if m[0] <= args.total_steps]
    header = ("| env | env steps/s (whole loop) | x reference | compile s | "
              + " | ".join(f"win @{s / 1e6:.2f}M (ref {w})" for s, w, _ in marks) + " | final eval win |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for env_name, label in envs_to_run:
        r = run(recipe_config(args.scenario, env_name, args.total_steps, args.seed))
        wins = [win_at(r["rows"], s) for s, _, _ in marks]
        lines.append(f"| {label} | {r['whole_loop_sps']:,.0f} | {r['whole_loop_sps'] / REFERENCE_STEPS_PER_SECOND:.1f}x | "
                     f"{r['compile']:.1f} | " + " | ".join("-" if w is None else f"{w:.2f}" for w in wins)
                     + f" | {r['eval_win_rate']} |")
        for threshold in (0.5, 0.8, 0.9):
            hit = first_reaching(r["rows"], "win_rate", threshold)
            if hit:
                print(f"  {label}: training win rate {threshold} at {hit[0]:,} steps, {hit[1]:.0f} s")
        print(lines[-1], flush=True)
    lines.append(f"| jaxmarl mappo_rnn_smax.py (measured earlier) | {REFERENCE_STEPS_PER_SECOND:,} | 1.0x | - | "
                 + " | ".join(f"{w} ({t} s)" for _, w, t in marks) + " | - |")

    if not args.no_default:
        config = experiment_config("smax_mappo", args.scenario)
        config.seed, config.log.progress_bar = args.seed, False
        config.eval.every_steps = 131_072
        r = run(config)
        hit = first_reaching(r["rows"], "eval_win_rate", 0.9)
        reached = (f"greedy win rate >= 0.9 first at {hit[0]:,} env steps, {hit[1]:.0f} s of wall time"
                   if hit else "greedy win rate never reached 0.9")
        lines.append("")
        lines.append(f"default config (experiments/smax_mappo.py:{args.scenario}, {config.num_envs} envs x "
                     f"{config.num_steps} steps, {config.total_steps:,} steps): {r['whole_loop_sps']:,.0f} env steps/s "
                     f"whole loop incl. compile and evaluations; {reached}; final greedy win rate {r['eval_win_rate']}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
