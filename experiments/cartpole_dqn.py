"""DQN on CartPole-v1 (double Q-learning, squared TD loss, layer norm, a target network copied every 50 gradient
steps).

    python -m jaxrl.train --config=experiments/cartpole_dqn.py
    python -m jaxrl.train --config=experiments/cartpole_dqn.py --config.replay.prioritised=True --config.returns.n_step=3

Settings after CleanRL's CartPole DQN: 128-unit ReLU layers, Adam at 2.5e-4 (decayed linearly here), batches of
128, epsilon from 1 to 0.05 over half the run, 10k steps of warm-up, the target copied every 400 env steps. With
the Huber loss and these settings the Q-values diverged (to 1e4 within 30k steps, in two seeds); with the
squared loss they did not. Layer norm after each hidden layer (as in PQN) made it hold over seeds: without it
one of three seeds ended at a greedy return of 271 after 500k steps (the others 500); with it, all three 500
(AMD EPYC). The greedy return still swings after it first reaches 500, and how it ends depends on the CPU's
float rounding: on an Intel Xeon (2026-11-26, --config.num_seeds=3 --config.eval.every_steps=50000) the mean
over seeds was 483-492 from 250k to 400k steps and ended at 447 (seeds 500, 340, 500).
"""

from ml_collections import ConfigDict

from jaxrl import algos, config as config_lib


def get_config(arg: str | None = None) -> ConfigDict:
    config = algos.default_config("dqn")
    config.experiment = "cartpole_dqn"
    config.env.name = "CartPole-v1"
    config.total_steps = 500_000
    config.num_envs = 8
    config.num_steps = 2  # 16 env steps per update ...
    config.replay.gradient_steps = 2  # ... and two gradient steps: a replay ratio of 16 samples per env step
    config.replay.batch_size = 128
    config.replay.buffer_size = 50_000
    config.replay.learning_starts = 10_000
    config.network.hidden_sizes = (128, 128)
    config.network.layer_norm = True
    config.target.every = 50
    config.loss.td = "squared"
    config.optim.schedule = "linear"
    config.explore.fraction = 0.5
    config.log.every_steps = 25_000
    config.eval.every_steps = 100_000
    config.checkpoint.every_steps = 100_000
    return config_lib.finalize(config, arg)
