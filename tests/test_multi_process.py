"""Two local processes joined by jax.distributed (CPU collectives over gloo), started from the command line,
train as one run: the same metrics and parameters as one process holding both devices, and only process 0
writes files."""

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np

from conftest import command_server, xla_flags_with_devices
from helpers import ROOT

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]



CLI_FLAGS = ["--config=experiments/cartpole_ppo.py", "--config.num_envs=8", "--config.num_steps=16",
             "--config.total_steps=512", "--config.log.every_steps=256", "--config.eval.episodes=4",
             "--config.log.progress_bar=false"]


def launch_cli(module, args, devices, log_dir, name):
    env = dict(os.environ, XLA_FLAGS=xla_flags_with_devices(devices), JAX_PLATFORMS="cpu")
    out, err = (open(os.path.join(log_dir, f"{name}.{ext}"), "w+") for ext in ("out", "err"))
    process = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=env, stdout=out, stderr=err)
    return process, out, err


def finished(launched) -> str:
    process, out, err = launched
    process.wait(timeout=600)
    out.seek(0), err.seek(0)
    assert process.returncode == 0, err.read()[-5000:]
    return "".join(line for line in out.readlines() if not line.startswith("[Gloo]"))  # gloo's own notices


def as_one_process(module, args, devices):
    """`python -m module args` in one process of `devices` devices, a forked child of the command server (no
    interpreter to start and import jax in: the two jax.distributed processes need their own)."""
    result = command_server().run(module, *args, devices=devices)
    assert result.returncode == 0, result.stderr[-5000:]
    return result.stdout


def two_processes_and_one(module, args, tmp_path):
    """Run `python -m module args` as 2 processes of 1 device and as 1 process of 2 devices; returns
    (the two processes' stdout, the single process's stdout, multi workdir, single workdir)."""
    port = free_port()
    multi_dir, single_dir = str(tmp_path / "multi"), str(tmp_path / "single")
    workers = [launch_cli(module, [*args, f"--workdir={multi_dir}", f"--coordinator_address=localhost:{port}",
                                   "--num_processes=2", f"--process_id={i}"], 1, str(tmp_path), f"p{i}")
               for i in range(2)]
    alone = as_one_process(module, [*args, f"--workdir={single_dir}"], 2)  # meanwhile
    outs = [finished(w) for w in workers]
    return outs, alone, multi_dir, single_dir


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
    from jaxrl import checkpoint
    assert checkpoint.saved_steps(os.path.join(multi_dir, "checkpoints")) == [4]  # the last update, saved once by all
    # the two processes trained the same parameters as one process holding both devices
    from jaxrl.run.saved import restore_run
    multi, single = restore_run(multi_dir).state, restore_run(single_dir).state
    for a, b in zip(jax.tree.leaves(multi.params), jax.tree.leaves(single.params)):
        a, b = np.asarray(a), np.asarray(b)
        assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(b).max())


def test_sweep_command_line_splits_runs_over_processes(tmp_path):
    # with PBT: after the first chunk the worse run copies the better one, across the two processes
    args = [*CLI_FLAGS, "--sweep.lr=1e-3,3e-3", "--sweep.seeds=1", "--sweep.method=pbt", "--sweep.pbt.every_steps=256"]
    outs, single, multi_dir, single_dir = two_processes_and_one("jaxrl.sweep", args, tmp_path)
    from jaxrl import sweep
    from jaxrl.run import population
    lineages = [population.read_lineage(sweep.lineage_path(d)) for d in (multi_dir, single_dir)]
    assert [e["update"] for e in lineages[0]] == [0, 2] and sorted(lineages[0][1]["parents"]) != [0, 1]
    assert [(e["parents"], e["values"]) for e in lineages[0]] == [(e["parents"], e["values"]) for e in lineages[1]]
    assert "learning_rate=0.001" in outs[0] and outs[1].strip() == ""
    for name in ("learning_rate=0.001", "learning_rate=0.003"):
        info = json.load(open(os.path.join(multi_dir, name, "run_info.json")))
        assert info["processes"] == 2 and info["mesh"] == {"runs": 2, "data": 1}  # a run per process
        assert_same_rows(os.path.join(multi_dir, name, "metrics.jsonl"), os.path.join(single_dir, name, "metrics.jsonl"))
    assert open(os.path.join(multi_dir, "summary.csv")).read() == open(os.path.join(single_dir, "summary.csv")).read()
