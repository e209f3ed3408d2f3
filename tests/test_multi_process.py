"""Two local processes joined by jax.distributed (CPU collectives over gloo) train as one run: the same
parameters as one process holding both devices."""

import json
import os
import socket
import subprocess
import sys

import numpy as np

from conftest import ROOT

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
