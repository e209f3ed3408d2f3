"""GRPO's Generate strategies on SMAX at equal env steps: independent groups, vine groups (a shared prefix, then
G continuations) and per-agent counterfactual groups (one agent per group acts on its own), several seeds.

    python benchmarks/env_rollout_strategies.py --update-results
    python benchmarks/env_rollout_strategies.py --strategies independent,vine --env-steps 200000
    python benchmarks/env_rollout_strategies.py --from-json a.json,b.json --update-results  # runs saved apart

`experiments/smax_grpo.py:<scenario>` with `rollout.generate` set, every run training all its seeds at once.
The x axis is env steps taken, counted as `benchmarks/grpo_vs_ppo.py` counts them (the steps of every
member's episode; a vine group's shared prefix is computed by each member, so it counts G times). Prints a
table of greedy and training win rates at fractions of the budget (mean +- std over seeds) and saves a plot;
with --update-results they replace the section between the env_rollout_strategies markers in
benchmarks/results/env_rollout_strategies.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from grpo_vs_ppo import grpo_budget, load_curves, plot, run, save_curves, win_rate_table  # noqa: E402
from report import machine, publish  # noqa: E402
from smax_mappo import experiment_config  # noqa: E402

MARKERS = ("<!-- env_rollout_strategies:start -->", "<!-- env_rollout_strategies:end -->")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="3m")
    parser.add_argument("--env-steps", type=int, default=360_000, help="env steps taken per seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--strategies", default="independent,vine,counterfactual")
    parser.add_argument("--plot", default=os.path.join(ROOT, "benchmarks", "env_rollout_strategies.png"))
    parser.add_argument("--update-results", action="store_true", help="update its page in benchmarks/results/")
    parser.add_argument("--from-json", default="", help="comma-separated curves that earlier runs saved (their "
                        "--plot path with .json), e.g. strategies run on two cores at once: no training")
    args = parser.parse_args(argv)

    from jaxrl import algos, rollout  # noqa: F401  (algos registers the built-in strategies)

    strategies = [s for s in args.strategies.split(",") if s]
    for s in strategies:
        rollout.get("generate", s, "env")  # a misspelt name fails before any training
    command = "python benchmarks/env_rollout_strategies.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"{args.scenario}, {args.env_steps:,} env steps taken per seed, {args.seeds} seeds; {machine()}", flush=True)

    results = load_curves(list(filter(None, args.from_json.split(","))), args.seeds)
    for strategy in [] if args.from_json else strategies:
        config = experiment_config("smax_grpo", args.scenario)
        config.rollout.generate, config.num_seeds = strategy, args.seeds
        results.append(run(f"rollout.generate={strategy}", grpo_budget(config, args.env_steps), args.seeds))
        print(f"  {strategy} done in {results[-1]['wall']:.0f} s; {results[-1]['steps'][-1]:,.0f} env steps taken "
              f"per seed", flush=True)

    lines = win_rate_table(results, args.env_steps)
    plot(results, args.plot, args.env_steps, args.scenario, "GRPO's Generate strategies")
    save_curves(results, args.plot)  # all of them, those read back too
    section = "\n".join([
        f"`{command.strip()}` ({datetime.date.today()}; {machine()}): SMAX {args.scenario}, "
        f"experiments/smax_grpo.py with each Generate strategy, {args.seeds} seeds per run trained together; win "
        f"rates mean +- std over seeds at equal env steps taken per seed.",
        "", *lines, "", f"![GRPO Generate strategies]({os.path.relpath(args.plot, os.path.join(ROOT, 'benchmarks'))})"])
    publish(section, args.update_results, MARKERS, "GRPO's Generate strategies on SMAX (issue 20)")


if __name__ == "__main__":
    main()
