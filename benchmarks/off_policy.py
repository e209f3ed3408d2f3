"""Off-policy learners beside their peers, in one process: rejax (DQN, PQN, SAC, TD3) and sbx (SAC, TQC).

    python benchmarks/off_policy.py                                  # every case, 1 seed
    python benchmarks/off_policy.py --cases rejax:sac,sbx:sac --seeds 2 --update-results

With --update-results the cases run replace their figures in `off_policy.json` (beside this file) and the
others stay; benchmarks/results/off_policy.md shows them all, each row pointing at the note of the run it came from.

Each case runs one recipe (RECIPES below) in both libraries, on the same environment object where both are JAX
(gymnax 1.x's CartPole-v1 and Pendulum-v1), and on gymnasium's Pendulum-v1 for sbx (same dynamics and 200-step
limit, numpy).

- rejax cases: throughput and return at equal env steps. Each library's whole run is one compiled program,
  compiled apart (not timed), then trained `--repeats` times, the two taking turns; the fastest repeat counts.
  Seeds are vmapped on both sides. Returns after training: jaxrl's greedy `algo.evaluate` over 32 envs per seed,
  rejax's own evaluation (128 episodes per seed, its `act`: greedy but for epsilon 0.005 in DQN/PQN).
  rejax 0.1.3 steps environments through gymnax 0.x's five-value `step`; it gets gymnax 1.x's env through
  `FiveValueStep`, which returns done = terminated or truncated, exactly what gymnax 0.x returned.
- sbx cases: wall-clock to the same return. Both train in windows of `WINDOW` env steps; the training return of
  the episodes that ended in the last two windows (10 Pendulum episodes) is checked after each window, and the
  first window where it reaches `--target` gives the time. sbx runs its seeds one after another (its wall-clock
  to the target is the sum over seeds); jaxrl runs them as one program (the time when its last seed reaches the
  target). jaxrl's compile time is shown apart and is not in its time to the target; sbx compiles inside its
  first updates, which are in its time.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl import algos, mesh as mesh_lib  # noqa: E402
from report import machine, markdown_table, publish, timed  # noqa: E402

# The shared settings of each case, in one vocabulary; jaxrl_config, rejax_algo and sbx_model translate them.
# rejax builds DQN, PQN and TD3 networks at 64-64 (fixed in its code), so its cases use 64-64 ReLU everywhere.
# The sbx cases use RL Zoo's Pendulum-v1 settings for sbx's SAC and TQC (learning rate 1e-3, 20k steps; the rest
# sbx's defaults: 256-256, batch 256, 100 random steps, tau 0.005, one gradient step per env step), and the
# ":small" cases the same with 64-64 networks.
RECIPES = {
    "rejax:dqn": dict(env="CartPole-v1", total_steps=500_000, num_envs=8, hidden=(64, 64), learning_rate=2.5e-4,
                      batch_size=128, buffer_size=50_000, learning_starts=10_000, target_every_steps=400,
                      epsilon_fraction=0.5),
    "rejax:pqn": dict(env="CartPole-v1", total_steps=500_000, num_envs=32, num_steps=64, num_minibatches=16,
                      num_epochs=4, hidden=(64, 64), learning_rate=3e-4, q_lambda=0.9, epsilon_fraction=0.2),
    "rejax:sac": dict(env="Pendulum-v1", total_steps=50_000, num_envs=1, hidden=(64, 64), learning_rate=1e-3,
                      batch_size=256, buffer_size=50_000, learning_starts=5_000, tau=0.005),
    "rejax:td3": dict(env="Pendulum-v1", total_steps=50_000, num_envs=1, hidden=(64, 64), learning_rate=1e-3,
                      batch_size=256, buffer_size=50_000, learning_starts=5_000, tau=0.005, policy_delay=2,
                      explore_noise=0.1),
    "sbx:sac": dict(env="Pendulum-v1", total_steps=20_000, num_envs=1, hidden=(256, 256), learning_rate=1e-3,
                    batch_size=256, buffer_size=20_000, learning_starts=100, tau=0.005),
    "sbx:tqc": dict(env="Pendulum-v1", total_steps=20_000, num_envs=1, hidden=(256, 256), learning_rate=1e-3,
                    batch_size=256, buffer_size=20_000, learning_starts=100, tau=0.005),
}
# The same with 64-64 networks and 1,000 random steps first: where the per-step cost is small, what each library
# spends around the arithmetic shows.
RECIPES.update({f"sbx:{name}:small": {**RECIPES[f"sbx:{name}"], "hidden": (64, 64), "learning_starts": 1_000}
                for name in ("sac", "tqc")})
WINDOW = 1_000  # env steps per timed window in the sbx cases (5 Pendulum episodes)
MARKERS = ("<!-- off_policy:start -->", "<!-- off_policy:end -->")
JSON_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "off_policy.json")  # figures per case


# --------------------------------------------------------------------------------------------------
# jaxrl


def jaxrl_config(case: str, seeds: int) -> ConfigDict:
    """The case's recipe as a jaxrl config (gymnax's env through the adapter)."""
    recipe, algorithm = RECIPES[case], case.split(":")[1]
    config = algos.default_config(algorithm)
    config.env.name, config.env.kwargs = "gymnax", ConfigDict({"env_id": recipe["env"]})
    config.total_steps, config.num_seeds, config.num_envs = recipe["total_steps"], seeds, recipe["num_envs"]
    config.network.hidden_sizes, config.network.activation = recipe["hidden"], "relu"
    config.optim.learning_rate, config.optim.schedule = recipe["learning_rate"], "constant"
    config.optim.max_grad_norm = float("inf")  # neither peer clips by default
    if algorithm == "pqn":
        config.num_steps = recipe["num_steps"]
        config.optim.num_minibatches, config.optim.num_epochs = recipe["num_minibatches"], recipe["num_epochs"]
        config.returns.q_lambda = recipe["q_lambda"]
    else:
        config.replay.batch_size, config.replay.buffer_size = recipe["batch_size"], recipe["buffer_size"]
        config.replay.learning_starts = recipe["learning_starts"]
    if algorithm in ("dqn", "pqn"):
        config.explore.fraction = recipe["epsilon_fraction"]
    if algorithm == "dqn":  # one gradient step per vector step; the target copied every target_every_steps
        config.num_steps, config.replay.gradient_steps = 1, 1
        config.target.every, config.target.tau = recipe["target_every_steps"] // recipe["num_envs"], 1.0
        config.loss.td = "squared"  # rejax: optax.l2_loss
    if algorithm in ("sac", "td3", "tqc"):
        config.optim.critic_learning_rate = recipe["learning_rate"]
        config.optim.temperature_learning_rate = recipe["learning_rate"]
        config.target.tau = recipe["tau"]
    if algorithm == "td3":
        config.policy.delay = config.num_steps = config.replay.gradient_steps = config.target.every = \
            recipe["policy_delay"]
        config.policy.explore_noise = recipe["explore_noise"]
    algos.validate(config)
    return config


def jaxrl_build(case: str, seeds: int):
    config = jaxrl_config(case, seeds)
    algo, hp = algos.build(config, mesh_lib.make_mesh())
    return algo, hp, config.total_steps // (config.num_envs * config.num_steps)


def jaxrl_eval_return(algo, state) -> float:
    evaluation = algo.evaluate(state.params, jax.random.PRNGKey(1), 32)
    return float(np.mean(evaluation["eval_return"]))


# --------------------------------------------------------------------------------------------------
# rejax


class FiveValueStep:
    """A gymnax 1.x environment seen through gymnax 0.x's step: (obs, state, reward, done, info), done =
    terminated or truncated. Everything else is the wrapped env's."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        if name == "_env":  # not set yet (copy.deepcopy builds the object without __init__)
            raise AttributeError(name)
        return getattr(self._env, name)

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        return obs, state, reward, jnp.logical_or(terminated, truncated), info


def rejax_algo(case: str):
    import gymnax
    import rejax

    recipe, algorithm = RECIPES[case], case.split(":")[1]
    env, env_params = gymnax.make(recipe["env"])
    steps = recipe["total_steps"]
    common = dict(env=FiveValueStep(env), env_params=env_params, total_timesteps=steps, eval_freq=steps,
                  skip_initial_evaluation=True, learning_rate=recipe["learning_rate"], gamma=0.99,
                  num_envs=recipe["num_envs"])
    if algorithm == "pqn":
        return rejax.PQN.create(**common, num_steps=recipe["num_steps"], num_minibatches=recipe["num_minibatches"],
                                num_epochs=recipe["num_epochs"], td_lambda=recipe["q_lambda"],
                                exploration_fraction=recipe["epsilon_fraction"])
    replay = dict(batch_size=recipe["batch_size"], buffer_size=recipe["buffer_size"],
                  fill_buffer=recipe["learning_starts"])
    if algorithm == "dqn":
        return rejax.DQN.create(**common, **replay, target_update_freq=recipe["target_every_steps"], polyak=0.0,
                                exploration_fraction=recipe["epsilon_fraction"], ddqn=True,
                                agent_kwargs={"activation": "relu"})
    if algorithm == "sac":
        return rejax.SAC.create(**common, **replay, polyak=1 - recipe["tau"], hidden_layer_sizes=recipe["hidden"],
                                agent_kwargs={"activation": "relu"})
    return rejax.TD3.create(**common, **replay, polyak=1 - recipe["tau"], policy_delay=recipe["policy_delay"],
                            exploration_noise=recipe["explore_noise"], actor_kwargs={"activation": "relu"},
                            critic_kwargs={"activation": "relu"})


def rejax_case(case: str, seeds: int, repeats: int) -> list[list]:
    """Both libraries at the case's recipe: one table row each."""
    j_algo, j_hp, num_updates = jaxrl_build(case, seeds)
    r_algo = rejax_algo(case)
    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    # rejax as it comes, and (where jaxrl's config chooses XLA options for its program) rejax compiled with
    # the same options: how much of the ratio is the library and how much the compiler setting
    options = dict(j_algo.settings.xla_options)
    r_variants = {"rejax": None, **({"rejax, jaxrl's XLA options": options} if options else {})}
    r_compiled = {name: timed(lambda o=o: jax.jit(jax.vmap(r_algo.train)).lower(keys).compile(o))
                  for name, o in r_variants.items()}  # name -> (compile seconds, program)

    def j_run():
        state = jax.block_until_ready(j_algo.init_seeds(0, seeds))  # every repeat from the same start
        seconds, (state, _) = timed(j_algo.run_chunk, state, j_hp, num_updates)
        return seconds, state

    j_run()  # compiles (timed by the library: compile_seconds)
    j_times, r_times, r_returns = [], {name: [] for name in r_compiled}, {}
    for _ in range(repeats):
        seconds, j_state = j_run()
        j_times.append(seconds)
        for name, (_, train) in r_compiled.items():
            seconds, (_, (_, r_returns[name])) = timed(train, keys)
            r_times[name].append(seconds)
    steps = RECIPES[case]["total_steps"] * seeds
    j_sps = steps / min(j_times)
    r_sps = {name: steps / min(times) for name, times in r_times.items()}
    runs = lambda times: " ".join(f"{t:.1f}" for t in times)  # noqa: E731
    return [[case, "jaxrl" + (f" ({', '.join(f'{k}={v}' for k, v in options.items())})" if options else ""),
             f"{j_sps:,.0f}", f"{j_sps / r_sps['rejax']:.2f}x", runs(j_times), f"{j_algo.compile_seconds:.1f}",
             f"{jaxrl_eval_return(j_algo, j_state):.1f}"]] + [
            [case, name, f"{r_sps[name]:,.0f}", "" if name == "rejax" else f"({j_sps / r_sps[name]:.2f}x)",
             runs(r_times[name]), f"{compile_seconds:.1f}", f"{float(np.mean(r_returns[name])):.1f}"]
            for name, (compile_seconds, _) in r_compiled.items()]


# --------------------------------------------------------------------------------------------------
# sbx


def sbx_model(case: str, seed: int):
    import gymnasium
    import sbx

    recipe, algorithm = RECIPES[case], case.split(":")[1]
    cls = {"sac": sbx.SAC, "tqc": sbx.TQC}[algorithm]
    return cls("MlpPolicy", gymnasium.make(recipe["env"]), learning_rate=recipe["learning_rate"],
               buffer_size=recipe["buffer_size"], learning_starts=recipe["learning_starts"],
               batch_size=recipe["batch_size"], tau=recipe["tau"], gamma=0.99, seed=seed,
               policy_kwargs={"net_arch": list(recipe["hidden"])})


def window_returns(step_returns: list[tuple[int, float]], total_steps: int) -> list[float]:
    """(env step at which an episode ended, its return) -> the mean return of the episodes ended in the two
    windows up to the end of each window (nan before any has ended)."""
    ends = np.array([s for s, _ in step_returns]), np.array([r for _, r in step_returns])
    out = []
    for edge in range(WINDOW, total_steps + 1, WINDOW):
        inside = (ends[0] > edge - 2 * WINDOW) & (ends[0] <= edge)
        out.append(float(ends[1][inside].mean()) if inside.any() else float("nan"))
    return out


def first_window(means: list[float], target: float) -> int | None:
    """Index of the first window whose mean reaches `target`."""
    return next((i for i, m in enumerate(means) if m >= target), None)


def sbx_seed(case: str, seed: int) -> tuple[list[float], list[float]]:
    """One sbx run: (seconds elapsed at the end of each window, window mean returns)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Record(BaseCallback):
        def _on_training_start(self):
            self.tick, self.episode, self.ends, self.clock = time.perf_counter(), 0.0, [], []

        def _on_step(self):
            self.episode += float(self.locals["rewards"][0])
            if self.locals["dones"][0]:
                self.ends.append((self.num_timesteps, self.episode))
                self.episode = 0.0
            if self.num_timesteps % WINDOW == 0:
                self.clock.append(time.perf_counter() - self.tick)
            return True

    record = Record()
    sbx_model(case, seed).learn(RECIPES[case]["total_steps"], callback=record)
    return record.clock, window_returns(record.ends, RECIPES[case]["total_steps"])


def jaxrl_windows(case: str, seeds: int) -> tuple[list[float], np.ndarray, float, float]:
    """jaxrl in windows: (seconds at the end of each window, compile excluded; window means [windows, seeds];
    compile seconds; greedy return at the end)."""
    algo, hp, num_updates = jaxrl_build(case, seeds)
    per_window = num_updates * WINDOW // RECIPES[case]["total_steps"]
    state = algo.init_seeds(0, seeds)
    clock, sums, counts, elapsed = [], [], [], 0.0
    for _ in range(num_updates // per_window):
        compiled_before = algo.compile_seconds
        seconds, (state, metrics) = timed(algo.run_chunk, state, hp, per_window)
        elapsed += seconds - (algo.compile_seconds - compiled_before)
        clock.append(elapsed)
        sums.append(np.asarray(metrics["episode_return_sum"]))
        counts.append(np.asarray(metrics["episodes"]))
    sums, counts = np.stack(sums), np.stack(counts)  # [windows, seeds]
    two = lambda x: x + np.concatenate([np.zeros_like(x[:1]), x[:-1]])  # noqa: E731  (this window and the one before)
    with np.errstate(invalid="ignore"):
        means = two(sums) / two(counts)
    return clock, means, algo.compile_seconds, jaxrl_eval_return(algo, state)


def sbx_case(case: str, seeds: int, target: float) -> list[list]:
    """Wall-clock to `target` (training return) and the return at the end: one table row per library."""
    clock, means, compile_s, j_greedy = jaxrl_windows(case, seeds)
    reached = [first_window(list(means[:, s]), target) for s in range(seeds)]
    j_time = None if None in reached else clock[max(reached)]
    s_time, s_reached, s_final = 0.0, [], []
    for seed in range(seeds):
        s_clock, s_means = sbx_seed(case, seed)
        window = first_window(s_means, target)
        s_reached.append(window)
        s_time = None if window is None or s_time is None else s_time + s_clock[window]
        s_final.append(s_means[-1])
    steps = lambda hits: ", ".join("-" if w is None else f"{(w + 1) * WINDOW:,}" for w in hits)  # noqa: E731
    seconds = lambda t: "not reached" if t is None else f"{t:.1f}"  # noqa: E731
    ratio = f"{s_time / j_time:.2f}x" if j_time and s_time else "-"
    return [[case, "jaxrl", seconds(j_time), ratio, steps(reached), f"{compile_s:.1f}",
             f"{np.mean(means[-1]):.1f}", f"{j_greedy:.1f}"],
            [case, "sbx", seconds(s_time), "", steps(s_reached), "in run", f"{np.mean(s_final):.1f}", "-"]]


# --------------------------------------------------------------------------------------------------


def versions() -> str:
    names = ("rejax", "sbx-rl", "stable_baselines3", "gymnax", "gymnasium")
    return ", ".join(f"{n} {importlib.metadata.version(n)}" for n in names)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(RECIPES), help=f"comma-separated, from {', '.join(RECIPES)}")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per case (vmapped in jaxrl and rejax)")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per library in the rejax cases")
    parser.add_argument("--target", type=float, default=-200.0, help="training return the sbx cases time")
    parser.add_argument("--total-steps", type=int, help="env steps per seed for every case (default: each recipe's)")
    parser.add_argument("--update-results", action="store_true", help="update benchmarks/results/off_policy.md")
    args = parser.parse_args()
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in RECIPES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(RECIPES)}")
    peers = {"rejax": ("rejax", "gymnax"), "sbx": ("sbx", "stable_baselines3", "gymnasium")}
    needed = {module for case in cases for module in peers[case.split(":")[0]]}
    missing = sorted(m for m in needed if importlib.util.find_spec(m) is None)
    if missing:
        parser.error(f"the chosen cases need {', '.join(missing)}: pip install -e \".[bench]\"")
    if args.total_steps is not None:
        if args.total_steps < 2 * WINDOW or args.total_steps % WINDOW:
            parser.error(f"--total-steps must be a multiple of {WINDOW:,} and at least {2 * WINDOW:,}")
        for case in cases:
            RECIPES[case]["total_steps"] = args.total_steps

    command = "python benchmarks/off_policy.py " + " ".join(sys.argv[1:])
    note = (f"{machine()}, {time.strftime('%Y-%m-%d')}; {versions()}; {args.seeds} seed(s)"
            + (f", fastest of {args.repeats} run(s)" if any(c.startswith("rejax:") for c in cases) else "")
            + f". Command: `{command.strip()}`.")
    results = {}
    for case in cases:
        print(f"running {case} ...", file=sys.stderr, flush=True)
        rows = (rejax_case(case, args.seeds, args.repeats) if case.startswith("rejax:")
                else sbx_case(case, args.seeds, args.target))
        results[case] = {"rows": rows, "note": note, "target": args.target}
    if args.update_results:  # the cases of this run replace their earlier figures; the others stay
        saved = load_results()
        saved.update(results)
        with open(JSON_PATH, "w") as f:
            json.dump(saved, f, indent=1)
        results = saved
    publish(section(results), args.update_results, MARKERS, "Off-policy learners beside rejax and sbx (issue 19)")


def load_results() -> dict:
    if not os.path.exists(JSON_PATH):
        return {}
    with open(JSON_PATH) as f:
        return json.load(f)


def section(results: dict) -> str:
    """The results page's block: the rejax table, the sbx table, each row pointing at its run's note."""
    notes = list(dict.fromkeys(r["note"] for r in results.values()))
    tables = {"rejax": [], "sbx": []}
    for case in (c for c in RECIPES if c in results):
        marker = f"[{notes.index(results[case]['note']) + 1}]"
        tables[case.split(":")[0]] += [row + [marker] for row in results[case]["rows"]]
    lines = []
    if tables["rejax"]:
        lines += [markdown_table(["case", "library", "env steps/s", "jaxrl/rejax", "run s", "compile s",
                                  "return at the end", "run"], tables["rejax"]), "",
                  "Throughput: env steps/s summed over the seeds, fastest of the runs. Return at the end: jaxrl "
                  "greedy (32 episodes per seed), rejax its own evaluation (128 per seed). Both at the same recipe "
                  "(`RECIPES`); jaxrl bootstraps through time limits, rejax (through gymnax 0.x's done) treats them "
                  "as terminal. jaxrl/rejax is against rejax as it comes; where jaxrl's config sets XLA options for "
                  "its program (the Q-learners turn XLA:CPU's YNNPACK fusions off), rejax compiled with the same "
                  "options is shown too, with jaxrl's ratio to it in brackets.", ""]
    if tables["sbx"]:
        targets = sorted({f"{r['target']:g}" for c, r in results.items() if c.startswith("sbx:")})
        lines += [markdown_table(["case", "library", f"s to training return >= {'/'.join(targets)}", "sbx/jaxrl",
                                  "env steps where each seed reached it", "compile s", "training return at the end",
                                  "greedy at the end", "run"], tables["sbx"]), "",
                  f"Training return: the episodes that ended in the last {2 * WINDOW:,} env steps, checked every "
                  f"{WINDOW:,}. sbx runs its seeds one after another (times summed), jaxrl as one program (the time "
                  "when its last seed reaches the target, compile excluded).", ""]
    lines += [f"[{i + 1}] {n}" for i, n in enumerate(notes)]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
