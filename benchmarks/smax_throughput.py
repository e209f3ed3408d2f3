"""SMAX throughput: ours against the reference (jaxmarl's HeuristicEnemySMAX), side by side.

For each scenario both envs run the same jitted rollout: `num_envs` envs under `jax.vmap`, auto-reset
(our `envs.AutoReset`; the reference is wrapped by `envs.adapters.FromJaxMARL`, which calls its
`step_env`), `num_steps` steps in one `lax.scan`, uniformly random legal ally actions, observations and
rewards summed into a checksum so that nothing is optimised away. Prints compile seconds, env steps
per second (best of `--repeats` timed runs that alternate between the two, compile excluded) and the
ratios; "CPU-time speed-up" compares process CPU time per step, which other work on a shared machine
disturbs less than wall-clock time.

    python benchmarks/smax_throughput.py                       # 3m, 2s3z, 27m_vs_30m
    python benchmarks/smax_throughput.py --scenarios 3m 8m --repeats 3
    python benchmarks/smax_throughput.py --no-reference        # ours only (no jaxmarl needed)
"""

from __future__ import annotations

import argparse
import datetime

import jax

import envs
from envs.smax.parity import random_legal, reference_env, throughput
from report import machine  # benchmarks/ (the script's folder is on sys.path)


def _reference_available() -> bool:
    try:
        import jaxmarl  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", nargs="+", default=["3m", "2s3z", "27m_vs_30m"])
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per env (the best is reported)")
    parser.add_argument("--no-reference", action="store_true", help="skip jaxmarl's SMAX")
    args = parser.parse_args(argv)
    scenarios = [s for arg in args.scenarios for s in arg.split(",") if s]
    with_reference = not args.no_reference and _reference_available()
    if not args.no_reference and not with_reference:
        print("jaxmarl is not installed: reference columns skipped (pip install jaxmarl==0.2.0)")

    print(f"# {datetime.date.today()}  {machine()}  "
          f"{args.num_envs} envs x {args.num_steps} steps, random legal actions, best of {args.repeats} "
          f"alternating runs")
    jax.block_until_ready(jax.jit(lambda x: x + 1)(0))  # start the backend before any compile is timed
    header = ("| scenario | ours compile (s) | ours steps/s | ref compile (s) | ref steps/s | speed-up | "
              "CPU-time speed-up |")
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for name in scenarios:
        candidates = {"ours": envs.make("smax", scenario=name)}
        if with_reference:
            candidates["ref"] = reference_env(name)
        stats = throughput(candidates, random_legal, args.num_envs, args.num_steps, args.repeats)
        ours = stats["ours"]
        row = f"| {name} | {ours['compile_s']:.1f} | {ours['steps_per_s']:,.0f} |"
        if with_reference:
            ref = stats["ref"]
            row += (f" {ref['compile_s']:.1f} | {ref['steps_per_s']:,.0f} | "
                    f"{ours['steps_per_s'] / ref['steps_per_s']:.1f}x | "
                    f"{ref['cpu_ms_per_step'] / ours['cpu_ms_per_step']:.1f}x |")
        else:
            row += " - | - | - | - |"
        print(row, flush=True)


if __name__ == "__main__":
    main()
