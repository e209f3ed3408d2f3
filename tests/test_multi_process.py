"""Two local processes joined by jax.distributed (CPU collectives over gloo) train as one run: the same
parameters as one process holding both devices; from the command line, only process 0 writes files."""

import json
import os
import socket
import subprocess
import sys

import numpy as np

from helpers import ROOT

WORKER = r"""
import json, sys
import jax
from jaxrl import distributed
if sys.argv[1] != "single":
    distributed.initialize(f"localhost:{sys.argv[3]}", num_processes=2, process_id=int(sys.argv[2]))
import numpy as np
from experiments import cartpole_ppo
from jaxrl import algos, mesh as mesh_lib
config = cartpole_ppo.get_config()
config.num_envs, config.num_steps, config.total_steps = 16, 32, 16 * 32 * 6
assert jax.device_count() == 2, jax.devices()
algo, hp = algos.build(config, mesh_lib.make_mesh())
state = algo.init_seeds(0, 2)
for _ in range(2):
    state, metrics = algo.run_chunk(state, hp, 3)
# Parameters are replicated: every process holds a full copy.
params = [np.asarray(x.addressable_data(0)).tolist() for x in jax.tree.leaves(state.params)]
print(json.dumps({"params": params, "process": jax.process_index(),
                  "local_envs": state.obs.addressable_data(0).shape[1]}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(args, devices, log_dir):
    """Start a worker with its output in files: a full pipe would stall it, and its peer with it."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    name = os.path.join(log_dir, "-".join(args))
    out, err = open(name + ".out", "w+"), open(name + ".err", "w+")
    return subprocess.Popen([sys.executable, "-c", WORKER, *args], cwd=ROOT, env=env, stdout=out, stderr=err), out, err


def result(launched):
    process, out, err = launched
    process.wait(timeout=600)
    out.seek(0), err.seek(0)
    assert process.returncode == 0, err.read()[-5000:]
    return json.loads(out.read().strip().splitlines()[-1])


def test_two_processes_train_together_and_match_one_process(tmp_path):
    port = str(free_port())
    workers = [launch(["multi", str(i), port], 1, str(tmp_path)) for i in range(2)]
    multi = [result(w) for w in workers]
    single = result(launch(["single"], 2, str(tmp_path)))
    assert [m["process"] for m in multi] == [0, 1]
    assert all(m["local_envs"] == 8 for m in multi) and single["local_envs"] == 8  # 16 envs over 2 devices
    for m in multi:
        for a, b in zip(m["params"], single["params"]):
            a, b = np.asarray(a), np.asarray(b)
            assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(b).max())


CLI_FLAGS = ["--config=experiments/cartpole_ppo.py", "--config.num_envs=8", "--config.num_steps=16",
             "--config.total_steps=512", "--config.log.every_steps=256", "--config.eval.num_envs=4",
             "--config.log.progress_bar=false"]


def launch_cli(module, args, devices, log_dir, name):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    out, err = (open(os.path.join(log_dir, f"{name}.{ext}"), "w+") for ext in ("out", "err"))
    process = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=env, stdout=out, stderr=err)
    return process, out, err


def finished(launched) -> str:
    process, out, err = launched
    process.wait(timeout=600)
    out.seek(0), err.seek(0)
    assert process.returncode == 0, err.read()[-5000:]
    return "".join(line for line in out.readlines() if not line.startswith("[Gloo]"))  # gloo's own notices


def two_processes_and_one(module, args, tmp_path):
    """Run `python -m module args` as 2 processes of 1 device and as 1 process of 2 devices; returns
    (the two processes' stdout, the single process's stdout, multi workdir, single workdir)."""
    port = free_port()
    multi_dir, single_dir = str(tmp_path / "multi"), str(tmp_path / "single")
    workers = [launch_cli(module, [*args, f"--workdir={multi_dir}", f"--coordinator_address=localhost:{port}",
                                   "--num_processes=2", f"--process_id={i}"], 1, str(tmp_path), f"p{i}")
               for i in range(2)]
    outs = [finished(w) for w in workers]
    single = finished(launch_cli(module, [*args, f"--workdir={single_dir}"], 2, str(tmp_path), "single"))
    return outs, single, multi_dir, single_dir


def assert_same_rows(multi_path, single_path):
    from jaxrl import metrics as metrics_lib
    multi, single = metrics_lib.read(multi_path), metrics_lib.read(single_path)
    assert [r["env_steps"] for r in multi] == [r["env_steps"] for r in single] == [256, 512]  # written once
    for a, b in zip(multi, single):
        for key in ("episode_return", "policy_loss", "eval_return"):
            if key in b:
                assert abs(a[key] - b[key]) <= 1e-4 * max(1.0, abs(b[key])), (key, a[key], b[key])


def test_train_command_line_in_two_processes(tmp_path):
    outs, single, multi_dir, single_dir = two_processes_and_one("jaxrl.train", CLI_FLAGS, tmp_path)
    assert json.loads(outs[0].strip().splitlines()[-1])["env_steps"] == 512 and outs[1].strip() == ""
    info = json.load(open(os.path.join(multi_dir, "run_info.json")))
    assert info["processes"] == 2 and info["mesh"] == {"runs": 1, "data": 2}  # one run's envs over both
    assert_same_rows(os.path.join(multi_dir, "metrics.jsonl"), os.path.join(single_dir, "metrics.jsonl"))
    assert os.listdir(os.path.join(multi_dir, "checkpoints")) == ["4"]  # the last update, saved once by all processes


def test_sweep_command_line_splits_runs_over_processes(tmp_path):
    args = [*CLI_FLAGS, "--sweep.lr=1e-3,3e-3", "--sweep.seeds=1"]
    outs, single, multi_dir, single_dir = two_processes_and_one("jaxrl.sweep", args, tmp_path)
    assert "learning_rate=0.001" in outs[0] and outs[1].strip() == ""
    for name in ("learning_rate=0.001", "learning_rate=0.003"):
        info = json.load(open(os.path.join(multi_dir, name, "run_info.json")))
        assert info["processes"] == 2 and info["mesh"] == {"runs": 2, "data": 1}  # a run per process
        assert_same_rows(os.path.join(multi_dir, name, "metrics.jsonl"), os.path.join(single_dir, name, "metrics.jsonl"))
    assert open(os.path.join(multi_dir, "summary.csv")).read() == open(os.path.join(single_dir, "summary.csv")).read()
