"""CartPole-v1 PPO throughput, jaxrl side by side with rejax (a peer pure-JAX PPO), in one process.

    python benchmarks/cartpole_ppo.py --seeds 1,16 --total-steps 500000 --repeats 3
    python benchmarks/cartpole_ppo.py --seeds 1 --total-steps 153600 --repeats 5 --phases 2,4,8

Both libraries run the PureJaxRL recipe (RECIPE below; 64-64 tanh MLPs, learning rate annealed linearly
to 0 where the library can). Each library's whole training run is one compiled program. Compilation is timed
on its own ("compile s"): rejax's `jax.jit(train).lower(...).compile()`; jaxrl's `run_chunk`, which compiles
on its first call (a warm-up run, not counted; the library times its own compile step). Then each library
trains `--repeats` times, the two taking turns, timed with `jax.block_until_ready`; the table reports the
fastest repeat ("run s", all repeats listed) and env steps/second summed over seeds.

- jaxrl: `algo.run_chunk` for all updates in one chunk (no logging, no checkpoints, no evaluation inside).
  Returns come from one more, untimed run of the same seeds split into two chunks, so that the training
  episodes of the last `LAST_UPDATES` updates can be read; "eval return" is a greedy `algo.evaluate`
  over 32 environments. Both are means over seeds.
- rejax: `algo.train` (vmapped over seeds), evaluating once, at the end (`eval_freq` = the run,
  `skip_initial_evaluation`); that evaluation (128 episodes with sampled actions) is inside its timing and
  is its return figure.

`--phases`: where an update's time goes. Both libraries train at each given number of epochs (all else the
recipe's), taking turns; the least-squares line of ms per update against gradient steps per update gives each
library's time per gradient step (one minibatch: forward, backward, Adam) and per update besides (rollout,
advantages, shuffling; rejax's one evaluation at the end falls in it too), and the most jaxrl/rejax could
reach if its rollout cost nothing.

Needs rejax, which pins gymnax < 1.0: run it in an environment of its own, e.g.
`python -m venv .venv-rejax && .venv-rejax/bin/pip install -e ".[bench-rejax]"`, then
`.venv-rejax/bin/python benchmarks/cartpole_ppo.py`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata

import jax
import numpy as np
import rejax

from jaxrl import algos, config as config_lib, mesh as mesh_lib
from report import machine, markdown_table, timed  # benchmarks/ (the script's folder is on sys.path)

RECIPE = dict(num_envs=4, num_steps=128, num_epochs=4, num_minibatches=4, learning_rate=2.5e-4,
              gamma=0.99, gae_lambda=0.95, clip_eps=0.2, vf_coef=0.5, ent_coef=0.01, max_grad_norm=0.5)
BATCH = RECIPE["num_envs"] * RECIPE["num_steps"]
REJAX_FIELDS = {f.name for f in dataclasses.fields(rejax.PPO)}
LAST_UPDATES = 10  # jaxrl's "train return": episodes that ended in the last 10 updates (5,120 steps/seed)


# --------------------------------------------------------------------------------------------------
# jaxrl


def jaxrl_algo(num_updates: int, recipe: dict = RECIPE):
    config = algos.default_config("ppo")
    config.total_steps = num_updates * BATCH
    config.num_envs, config.num_steps = RECIPE["num_envs"], RECIPE["num_steps"]
    keys = {"num_epochs": "optim.num_epochs", "num_minibatches": "optim.num_minibatches",
            "learning_rate": "optim.learning_rate", "gamma": "returns.gamma", "gae_lambda": "returns.gae_lambda",
            "vf_coef": "loss.vf_coef", "ent_coef": "loss.ent_coef", "max_grad_norm": "optim.max_grad_norm",
            "clip_eps": ("loss.clip_low", "loss.clip_high", "loss.value_clip")}
    for name, key in keys.items():
        for one in (key if isinstance(key, tuple) else (key,)):
            config_lib.set_value(config, one, recipe[name])
    config.optim.schedule = "linear"
    config.returns.bootstrap_truncation = False  # the recipe treats a time limit as terminal, as rejax does
    config.network.hidden_sizes, config.network.activation = (64, 64), "tanh"
    algos.validate(config)
    return algos.build(config, mesh_lib.make_mesh())


def jaxrl_bench(num_seeds: int, num_updates: int, recipe: dict = RECIPE):
    """(algo, seconds of the first call (it compiles), run() -> seconds)."""
    algo, hp = jaxrl_algo(num_updates, recipe)

    def run():
        state = jax.block_until_ready(algo.init_seeds(0, num_seeds))  # each timing from the same start
        return timed(algo.run_chunk, state, hp, num_updates)[0]

    return algo, run(), run


def jaxrl_returns(num_seeds: int, num_updates: int):
    """(greedy eval return, return of the last training episodes), means over seeds (untimed)."""
    algo, hp = jaxrl_algo(num_updates)
    state = algo.init_seeds(0, num_seeds)
    state, _ = algo.run_chunk(state, hp, num_updates - LAST_UPDATES)
    state, metrics = algo.run_chunk(state, hp, LAST_UPDATES)
    train_return = np.mean(metrics["episode_return_sum"] / metrics["episodes"])
    evaluation = algo.evaluate(state.params, jax.random.PRNGKey(1), 32)
    return float(np.mean(evaluation["eval_return"])), float(train_return)


# --------------------------------------------------------------------------------------------------
# rejax


def rejax_bench(num_seeds: int, num_updates: int, recipe: dict = RECIPE):
    """(compile seconds, run() -> (seconds, eval return))."""
    steps = num_updates * BATCH
    extra = {"anneal_lr": True} if "anneal_lr" in REJAX_FIELDS else {}
    algo = rejax.PPO.create(
        env="CartPole-v1", **recipe, **extra, total_timesteps=steps, eval_freq=steps,
        skip_initial_evaluation=True, normalize_observations=False, normalize_rewards=False,
        agent_kwargs={"activation": "tanh", "hidden_layer_sizes": (64, 64)})
    key = jax.random.PRNGKey(0)
    keys, train = (key, algo.train) if num_seeds == 1 else (jax.random.split(key, num_seeds),
                                                             jax.vmap(algo.train))
    compile_s, train = timed(lambda: jax.jit(train).lower(keys).compile())

    def run():
        seconds, (_, (_, returns)) = timed(train, keys)
        return seconds, float(np.mean(returns))  # [seeds,] evaluations=1, episodes=128

    return compile_s, run


# --------------------------------------------------------------------------------------------------
# Where an update's time goes


def phase_split(num_seeds: int, num_updates: int, epoch_counts: list[int], repeats: int):
    """Both libraries at each number of epochs (everything else the recipe's), timed in turns: (table rows,
    {library: (ms per gradient step, ms per update besides)}).

    An update is a rollout plus advantages and shuffling (the same at any epoch count) and epochs x minibatches
    gradient steps; the least-squares line of ms per update against gradient steps per update splits the two.
    """
    programs = {}
    for epochs in epoch_counts:
        recipe = dict(RECIPE, num_epochs=epochs)
        _, _, j_run = jaxrl_bench(num_seeds, num_updates, recipe)
        _, r_run = rejax_bench(num_seeds, num_updates, recipe)
        programs[epochs] = {"jaxrl": j_run, "rejax": lambda r_run=r_run: r_run()[0]}
    seconds = {(library, epochs): [] for epochs in epoch_counts for library in ("jaxrl", "rejax")}
    for _ in range(repeats):
        for epochs, runs in programs.items():
            for library, run in runs.items():
                seconds[library, epochs].append(run())
    steps = [epochs * RECIPE["num_minibatches"] for epochs in epoch_counts]
    libraries = ("jaxrl", "rejax")
    ms = {lib: [1e3 * min(seconds[lib, epochs]) / num_updates for epochs in epoch_counts] for lib in libraries}
    fits = {lib: tuple(np.polyfit(steps, ms[lib], 1)) for lib in libraries}  # (per gradient step, besides)
    rows = [[num_seeds, lib, *(f"{m:.3f}" for m in ms[lib]), f"{fits[lib][0]:.4f}", f"{fits[lib][1]:.3f}"]
            for lib in libraries]
    ratios = [r / j for r, j in zip([*ms["rejax"], *fits["rejax"]], [*ms["jaxrl"], *fits["jaxrl"]])]
    rows.append([num_seeds, "rejax/jaxrl", *(f"{ratio:.2f}" for ratio in ratios)])
    return rows, fits


def print_phases(args, num_updates: int):
    epoch_counts = [int(e) for e in args.phases.split(",")]
    if len(epoch_counts) < 2:
        raise SystemExit("--phases needs two or more epoch counts, e.g. 2,4,8")
    header = ["seeds", "library", *(f"ms/update, {e} epochs" for e in epoch_counts), "ms per gradient step",
              "ms per update besides"]
    rows, bounds = [], []
    for num_seeds in [int(s) for s in args.seeds.split(",")]:
        seed_rows, fits = phase_split(num_seeds, num_updates, epoch_counts, args.repeats)
        rows += seed_rows
        recipe_steps = RECIPE["num_epochs"] * RECIPE["num_minibatches"]
        rejax_update = fits["rejax"][1] + recipe_steps * fits["rejax"][0]
        bounds.append(f"{num_seeds} seed(s): rejax's update at the recipe's {recipe_steps} gradient steps takes "
                      f"{rejax_update:.3f} ms; jaxrl's gradient steps alone take {recipe_steps * fits['jaxrl'][0]:.3f}"
                      f" ms, so with a rollout that cost nothing jaxrl/rejax would be at most "
                      f"{rejax_update / (recipe_steps * fits['jaxrl'][0]):.2f}")
    print(markdown_table(header, rows))
    print("\nFastest of the repeats per cell; the last two columns are the least-squares line through the cells "
          "(gradient steps = epochs x minibatches).")
    print("\n".join(bounds))


# --------------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="1,16", help="comma-separated seed counts, each vmapped")
    parser.add_argument("--total-steps", type=int, default=500_000, help="env steps per seed")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per library (the fastest is shown)")
    parser.add_argument("--phases", default="", metavar="EPOCHS",
                        help="instead of the comparison, split an update's time into gradient steps and the rest: "
                             "both libraries at each of these comma-separated epoch counts, e.g. 2,4,8")
    args = parser.parse_args()
    num_updates = args.total_steps // BATCH
    if num_updates <= LAST_UPDATES:
        parser.error(f"--total-steps must exceed {LAST_UPDATES + 1} updates of {BATCH} steps")

    print(f"CartPole-v1 PPO, PureJaxRL recipe: {num_updates} updates x {BATCH} = {num_updates * BATCH:,} env "
          f"steps per seed\nmachine: {machine()}; rejax {importlib.metadata.version('rejax')}; fastest of "
          f"{args.repeats} interleaved repeats\n")
    if args.phases:
        return print_phases(args, num_updates)
    header = ["seeds", "library", "env steps/s", "jaxrl/rejax", "run s (all repeats)", "compile s",
              "eval return", "train return"]
    rows = []
    for num_seeds in [int(s) for s in args.seeds.split(",")]:
        j_algo, j_first, j_run = jaxrl_bench(num_seeds, num_updates)
        r_compile, r_run = rejax_bench(num_seeds, num_updates)
        j_times, r_times = [], []
        for _ in range(args.repeats):
            j_times.append(j_run())
            seconds, r_return = r_run()
            r_times.append(seconds)
        j_eval, j_train = jaxrl_returns(num_seeds, num_updates)
        # jaxrl times its compile step; without that, first call minus the fastest run
        j_compile = j_algo.compile_seconds
        steps = num_updates * BATCH * num_seeds
        j_sps, r_sps = steps / min(j_times), steps / min(r_times)
        rows.append([num_seeds, "jaxrl", f"{j_sps:,.0f}", f"{j_sps / r_sps:.2f}",
                     " ".join(f"{t:.2f}" for t in j_times), f"{j_compile:.1f}", f"{j_eval:.1f}", f"{j_train:.1f}"])
        rows.append([num_seeds, "rejax", f"{r_sps:,.0f}", "", " ".join(f"{t:.2f}" for t in r_times),
                     f"{r_compile:.1f}", f"{r_return:.1f}", "-"])

    print(markdown_table(header, rows))
    print(f"\neval return: jaxrl greedy actions, 32 episodes per seed; rejax sampled actions, 128 episodes per "
          f"seed.\ntrain return: jaxrl episodes ending in the last {LAST_UPDATES} updates. Means over seeds.")
    if "anneal_lr" not in REJAX_FIELDS:
        print("rejax has no learning-rate annealing option: it runs at a constant 2.5e-4.")
    print("rejax clips gradients elementwise (optax.clip(0.5)) and updates actor and critic with separate "
          "Adam optimisers;\njaxrl (like PureJaxRL) clips the global gradient norm of one joint loss.")


if __name__ == "__main__":
    main()
