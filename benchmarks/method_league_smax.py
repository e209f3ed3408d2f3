"""The method league's environment part (issue 64): the catalogue's group-RL entries that apply to environments,
each a config line of GRPO on SMAX, trained at equal env steps taken, 3 seeds each (trained together in one run).

    python benchmarks/method_league_smax.py --update-results
    python benchmarks/method_league_smax.py --methods grpo,cispo --env-steps 90000

`experiments/smax_grpo.py:<scenario>` with each method's keys. Env steps taken are counted as
`benchmarks/grpo_vs_ppo.py` counts them. Prints greedy and training win rates at a quarter, half and all of the budget
(mean +- std over seeds) and each run's wall time; with --update-results they replace the section between the
method_league_smax markers in benchmarks/results/method_league_smax.md (the Countdown league: method_league.py).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from grpo_vs_ppo import grpo_budget, run, win_rate_table  # noqa: E402
from report import chosen_names, machine, publish  # noqa: E402
from smax_mappo import experiment_config  # noqa: E402

MARKERS = ("<!-- method_league_smax:start -->", "<!-- method_league_smax:end -->")
# method -> (its keys beyond experiments/smax_grpo.py's, the methods it stands for in docs/methods.md). The text-only
# entries (the label's objectives, rollout strategies on prompts, token-level selections) have no environment form.
METHODS = {
    "grpo": ({}, "GRPO"),
    "dr_grpo": ({"advantage.estimator": "dr_grpo"}, "Dr. GRPO"),
    "rloo": ({"advantage.estimator": "rloo"}, "RLOO"),
    "median": ({"advantage.estimator": "median"}, "MC-GRPO (G = 8: the mean of the middle two)"),
    "calibrated": ({"advantage.estimator": "calibrated"}, "NGRPO"),
    "per_agent": ({"advantage.estimator": "per_agent"}, "Dr. MAS"),
    "lite_ppo": ({"advantage.scale": "batch"}, "Lite PPO"),
    "cispo": ({"loss.objective": "cispo", "loss.clip_low": 1.0, "loss.clip_high": 4.0}, "CISPO"),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="3m")
    parser.add_argument("--env-steps", type=int, default=45_000, help="env steps taken per seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--update-results", action="store_true",
                        help="update benchmarks/results/method_league_smax.md")
    args = parser.parse_args(argv)

    from jaxrl import config as config_lib

    names = chosen_names(parser, args.methods, METHODS, "methods")
    command = "python benchmarks/method_league_smax.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"{args.scenario}, {args.env_steps:,} env steps taken per seed, {args.seeds} seeds; {machine()}", flush=True)
    results = []
    for name in names:
        config = experiment_config("smax_grpo", args.scenario)
        config.num_seeds = args.seeds
        for key, value in METHODS[name][0].items():
            config_lib.set_value(config, key, value)
        results.append(run(f"{name} ({METHODS[name][1]})", grpo_budget(config, args.env_steps), args.seeds))
        print(f"  {name} done in {results[-1]['wall']:.0f} s", flush=True)
    flags = {name: " ".join(f"--config.{k}={v}" for k, v in METHODS[name][0].items()) or "(GRPO)" for name in names}
    section = "\n".join([
        f"`{command.strip()}` ({datetime.date.today()}; {machine()}): SMAX {args.scenario}, experiments/smax_grpo.py "
        f"with each method's config line, {args.seeds} seeds per run trained together; win rates mean +- std over "
        "seeds at equal env steps taken per seed.", "",
        *win_rate_table(results, args.env_steps), "",
        "Config lines: " + "; ".join(f"{name} `{flags[name]}`" for name in names) + "."])
    publish(section, args.update_results, MARKERS, "The method league on SMAX (issue 64)")


if __name__ == "__main__":
    main()
