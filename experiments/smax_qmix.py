"""QMIX on SMAX: recurrent agents (one shared GRU network, told their ids) whose action values a mixing network
on the global state combines monotonically into the team's. The scenario is the argument.

    python -m jaxrl.train --config=experiments/smax_qmix.py:3m
    python -m jaxrl.train --config=experiments/smax_qmix.py:2s3z --config.num_seeds=3

PyMARL's QMIX sizes (GRU 64 between dense layers of 64, mixer embedding 32, hypernetworks of 64, squared TD
loss, double Q, a target copy every 80 gradient steps) with JaxMARL's SMAX settings (16 envs x 128 steps per
update, 8 gradient steps of 32 sequences each per update, rewards x 10, epsilon 1 -> 0.05 over the first 10%,
10,240 steps before learning, the mixer's layers starting at gain 0.001). Sequences of 64 steps start from a
zero hidden state. `experiments/smax_vdn.py` and `smax_iql.py` change only the mixer.

Targets are lambda-returns over each sampled sequence (lambda 0.6, as PyMARL2 uses on SMAC), not one-step
ones: tuned with `python -m jaxrl.sweep --config=experiments/smax_qmix.py:<scenario> --sweep.seeds=3
--sweep.q_lambda=0,0.6 --config.total_steps=262144` on 2s3z and 3m (2026-11-26), it raised QMIX's final greedy
win rate on every seed of both (2s3z 0.02 -> 0.15, episode return 0.29 -> 0.87; 3m 0.46 -> 0.66).

The buffer keeps its observations and global states in float16 (SMAX's lie in [-1, 1]; the rounding is below
2.5e-4): its memory grows with agents x units, 4.9 GB per seed on 3s5z and 55 GB on 27m_vs_30m in float32.
On 25m, 27m_vs_30m and smacv2_20_units it holds fewer steps (`BUFFER_SIZES`: 49,152-98,304 per seed, against
327,680 elsewhere), so that three seeds train as one program on a 24 GB machine; a run with more memory may
raise `--config.replay.buffer_size`.
A seed that turns non-finite stops the run (`checkpoint.on_nonfinite=stop`, the checkpoints stay): in return
each chunk reuses its input state's memory, so the buffer is held once, not twice.
"""

from ml_collections import ConfigDict

from jaxrl import algos, config as config_lib

# Env steps per seed for each scenario's default budget; others get DEFAULT_STEPS.
BUDGETS = {"3m": 2_000_000}
DEFAULT_STEPS = 10_000_000
# Replay capacity (env steps per seed) where the default 327,680 does not fit three seeds in 24 GB: the
# largest multiple of 16,384 whose three float16 buffers take at most about 13.5 GB, which leaves room for
# evaluation and checkpoint writes (QMIX 3 seeds at 327,680: 25m 67.7 GB, 27m_vs_30m 83.1, smacv2_20_units 43.7).
BUFFER_SIZES = {"25m": 65_536, "27m_vs_30m": 49_152, "smacv2_20_units": 98_304}


def smax_value_config(algorithm: str, scenario: str) -> ConfigDict:
    """`algorithm` ("qmix", "vdn" or "iql") on SMAX `scenario`, as the module's docstring describes."""
    config = algos.default_config(algorithm)
    config.experiment = f"smax_{algorithm}_{scenario}"
    config.env.name = "smax"
    config.env.kwargs = ConfigDict({"scenario": scenario})
    config.total_steps = BUDGETS.get(scenario, DEFAULT_STEPS)
    config.log.every_steps = 65_536
    config.eval.every_steps = 262_144
    config.eval.episodes = 64
    config.checkpoint.every_steps = 1_048_576
    config.replay.store_dtype = "float16"
    config.replay.buffer_size = BUFFER_SIZES.get(scenario, config.replay.buffer_size)
    config.checkpoint.on_nonfinite = "stop"  # the state (mostly the buffer) is held once, not twice
    config.returns.q_lambda = 0.6
    return config


def get_config(arg: str | None = None) -> ConfigDict:
    return config_lib.finalize(smax_value_config("qmix", arg or "3m"))
