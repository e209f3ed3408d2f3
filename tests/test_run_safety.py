"""No run is lost, clobbered or mislabelled: the ordinary command sequences that used to do so now end with every
saved file as it was and one line on stderr (status 2), and the run directory, its checkpoints and its small
files keep what they hold through kills, damaged disks and read-only use."""

import ast
import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import pytest

from helpers import ROOT, small_cartpole
from jaxrl import checkpoint, files, metrics as metrics_lib, train
from jaxrl.run import sweep_programs, workdir as workdir_lib

CARTPOLE = "--config=experiments/cartpole_ppo.py"
# small_cartpole() on the command line, with a checkpoint at every log interval (updates 2 and 4)
SMALL = ["--config.num_envs=8", "--config.num_steps=16", "--config.total_steps=512", "--config.log.every_steps=256",
         "--config.eval.episodes=4", "--config.log.progress_bar=False", "--config.optim.schedule=constant",
         "--config.checkpoint.every_steps=256"]


def _small(**overrides):
    return small_cartpole(**{"checkpoint.every_steps": 256, **overrides})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A single run (checkpoints at updates 2 and 4) and a sweep of two learning rates, to copy from."""
    root = tmp_path_factory.mktemp("saved")
    run_dir = str(root / "run")
    train.run(_small(), run_dir)
    sweep_dir = str(root / "sweep")
    sweep_programs.run_sweep(_small(), {"optim.learning_rate": [1e-3, 3e-3]}, sweep_dir)
    return {"run": run_dir, "sweep": sweep_dir}


def _copy(saved, kind, tmp_path, name=None):
    target = str(tmp_path / (name or kind))
    shutil.copytree(saved[kind], target)
    return target


def _snapshot(directory):
    """{relative path: sha256 of its bytes} of every file under `directory`."""
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _one_line(result, *expected, status=2):
    assert result.returncode == status, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines and lines[-1].startswith("error: "), result.stderr[-2000:]
    for text in expected:
        assert text in lines[-1], (text, lines[-1])
    return lines[-1]


# --- a directory knows what it is ---------------------------------------------------------------------------------

def test_resume_finds_the_newest_single_run_never_a_sweep(saved, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.makedirs("runs")
    older = shutil.copytree(saved["run"], "runs/cartpole_ppo-20261101-000000")
    os.utime(older, (1, 1))
    shutil.copytree(saved["sweep"], "runs/cartpole_ppo-sweep-20261201-000000")  # newer, and matches the old glob
    shutil.copytree(saved["run"], "runs/cartpole_ppo_other-20261201-000000")  # another experiment's name
    assert workdir_lib.latest_workdir("cartpole_ppo") == older
    shutil.rmtree(older)
    assert workdir_lib.latest_workdir("cartpole_ppo") is None


@pytest.mark.parametrize("target", ["sweep", "setting"])
def test_train_refuses_a_sweep_and_a_sweeps_setting(saved, target, tmp_path, run_command):
    sweep_dir = _copy(saved, "sweep", tmp_path)
    workdir = sweep_dir if target == "sweep" else os.path.join(sweep_dir, "learning_rate=0.001")
    before = _snapshot(sweep_dir)
    line = _one_line(run_command("jaxrl.train", CARTPOLE, *SMALL, f"--workdir={workdir}"))
    assert ("is a sweep" if target == "sweep" else "is one setting of the sweep") in line
    assert _snapshot(sweep_dir) == before
    _one_line(run_command("jaxrl.train", f"--workdir={workdir}", "--overwrite"), "not a place for a single run")
    assert _snapshot(sweep_dir) == before


def test_a_sweep_of_other_values_is_refused_in_a_sweeps_directory(saved, tmp_path, run_command):
    sweep_dir = _copy(saved, "sweep", tmp_path)
    before = _snapshot(sweep_dir)
    _one_line(run_command("jaxrl.sweep", CARTPOLE, *SMALL, "--sweep.lr=1e-4,1e-3", f"--workdir={sweep_dir}"),
              "holds a sweep of other settings", "[0.001, 0.003]", "--overwrite")
    _one_line(run_command("jaxrl.sweep", CARTPOLE, *SMALL, "--sweep.lr=1e-3,3e-3", "--sweep.seeds=2",
                          f"--workdir={sweep_dir}"), "num_seeds")
    assert _snapshot(sweep_dir) == before


def test_a_sweep_is_refused_in_a_single_runs_directory(saved, tmp_path, run_command):
    run_dir = _copy(saved, "run", tmp_path)
    before = _snapshot(run_dir)
    _one_line(run_command("jaxrl.sweep", CARTPOLE, *SMALL, "--sweep.lr=1e-3,3e-3", f"--workdir={run_dir}"),
              "is a single run", "--sweep.fork=")
    assert _snapshot(run_dir) == before


def test_metrics_without_a_checkpoint_are_refused_and_overwrite_starts_again(saved, tmp_path, run_command):
    run_dir = _copy(saved, "run", tmp_path)
    shutil.move(os.path.join(run_dir, "checkpoints"), str(tmp_path / "aside"))  # deleted to save space, say
    before = _snapshot(run_dir)
    _one_line(run_command("jaxrl.train", f"--workdir={run_dir}"), "has metrics up to update 4",
              "no checkpoint", "--overwrite")
    assert _snapshot(run_dir) == before
    # --overwrite: on purpose, from update 0 (and a total_steps that is not a multiple of an update says so)
    done = run_command("jaxrl.train", CARTPOLE, *SMALL, "--config.total_steps=600", f"--workdir={run_dir}",
                       "--overwrite")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "training 4 updates, 512 env steps" in done.stderr and "--overwrite: deleted" in done.stderr
    rows = metrics_lib.read(os.path.join(run_dir, "metrics.jsonl"))
    assert [r["update"] for r in rows] == [2, 4] and rows[0]["wall_time"] < rows[1]["wall_time"]


def test_a_run_killed_before_its_first_complete_checkpoint_starts_again(saved, tmp_path):
    run_dir = _copy(saved, "run", tmp_path)
    assert files.read_json(os.path.join(run_dir, "run_info.json"))["checkpointed"] is True
    shutil.rmtree(os.path.join(run_dir, "checkpoints"))
    info = files.read_json(os.path.join(run_dir, "run_info.json"))
    files.write_json(os.path.join(run_dir, "run_info.json"), {**info, "checkpointed": False})  # as a kill leaves it
    result = train.run(_small(), run_dir)
    assert [r["update"] for r in result.metrics] == [2, 4]
    assert [r["episode_return"] for r in result.metrics] == [
        r["episode_return"] for r in metrics_lib.read(os.path.join(saved["run"], "metrics.jsonl"))]


@pytest.fixture(scope="module")
def extended(saved, tmp_path_factory):
    """A copy of the saved run as an older jaxrl and a kill leave it, extended by one log interval (to update 6):
    its run_info.json predates the "checkpointed" record, and its metrics.jsonl ends in a row cut by a kill."""
    run_dir = str(tmp_path_factory.mktemp("extended") / "run")
    shutil.copytree(saved["run"], run_dir)
    info = files.read_json(os.path.join(run_dir, "run_info.json"))
    files.write_json(os.path.join(run_dir, "run_info.json"), {k: v for k, v in info.items() if k != "checkpointed"})
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        f.write('{"update": 6, "env_steps"')  # killed while writing the next row
    result = train.run(_small(total_steps=8 * 16 * 6), run_dir)  # resumed at update 4
    return run_dir, result


def test_a_resumed_run_from_before_the_record_counts_as_checkpointed(extended, tmp_path):
    run_dir = _copy({"run": extended[0]}, "run", tmp_path)
    assert files.read_json(os.path.join(run_dir, "run_info.json"))["checkpointed"] is True
    shutil.rmtree(os.path.join(run_dir, "checkpoints"))
    with pytest.raises(ValueError, match="has metrics up to update 6 but no checkpoint"):
        train.run(_small(total_steps=8 * 16 * 6), run_dir)


def test_a_sweep_setting_with_metrics_but_no_program_checkpoint_is_refused(saved, tmp_path):
    sweep_dir = _copy(saved, "sweep", tmp_path)
    shutil.rmtree(os.path.join(sweep_dir, "checkpoints"))
    before = _snapshot(sweep_dir)
    with pytest.raises(ValueError, match="has metrics up to update 4 but no checkpoint"):
        sweep_programs.run_sweep(_small(), {"optim.learning_rate": [1e-3, 3e-3]}, sweep_dir)
    assert _snapshot(sweep_dir) == before


def test_a_shorter_total_steps_on_resume_is_refused(saved, tmp_path, run_command):
    run_dir = _copy(saved, "run", tmp_path)
    before = _snapshot(run_dir)
    _one_line(run_command("jaxrl.train", CARTPOLE, *SMALL, "--config.total_steps=256", f"--workdir={run_dir}"),
              "total_steps=256 is below the 512")
    assert _snapshot(run_dir) == before


def test_a_workdir_that_is_a_file_is_one_line(tmp_path, run_command):
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    _one_line(run_command("jaxrl.train", CARTPOLE, f"--workdir={path}"), "is a file")
    _one_line(run_command("jaxrl.sweep", CARTPOLE, "--sweep.lr=1e-3", f"--workdir={path}"), "is a file")
    _one_line(run_command("jaxrl.evaluate", f"--workdir={path}"), "a file")
    _one_line(run_command("jaxrl.train", CARTPOLE, *SMALL, f"--workdir={path}/run"), "cannot be created or opened")
    assert path.read_text() == "mine"


def test_a_second_process_is_refused_while_one_trains(saved, tmp_path, run_command):
    run_dir = _copy(saved, "run", tmp_path)
    before = _snapshot(run_dir)
    with workdir_lib.locked(run_dir):  # what a training process holds (the lock is the kernel's: no file)
        _one_line(run_command("jaxrl.train", f"--workdir={run_dir}"), "is in use: another process is training in it")
        _one_line(run_command("jaxrl.train", CARTPOLE, *SMALL, f"--workdir={run_dir}", "--overwrite"), "is in use")
    assert _snapshot(run_dir) == before
    with workdir_lib.locked(run_dir):  # released when the holder is done
        pass


def test_run_info_keeps_every_command_that_trained_in_the_run(saved, extended):
    first = files.read_json(os.path.join(saved["run"], "run_info.json"))
    assert first["kind"] == "run" and [h["start_update"] for h in first["history"]] == [0]
    info = files.read_json(os.path.join(extended[0], "run_info.json"))  # extended by one log interval
    assert [h["start_update"] for h in info["history"]] == [0, 4]
    assert info["argv"] == first["argv"] and info["history"][0] == first["history"][0]
    assert {"argv", "git_revision", "jax_version", "devices", "processes", "mesh", "time"} <= set(info["history"][1])
    sweep_info = files.read_json(os.path.join(saved["sweep"], "run_info.json"))
    setting_info = files.read_json(os.path.join(saved["sweep"], "learning_rate=0.001", "run_info.json"))
    assert sweep_info["kind"] == "sweep" and setting_info["kind"] == "sweep setting"


# --- checkpoints: moved aside only when damaged, never by a reader ------------------------------------------------

STATE = {"a": jnp.arange(4096.0), "b": {"c": jnp.ones((3, 4))}}


def _three_checkpoints(directory):
    saver = checkpoint.Checkpointer(directory, keep=3)
    for step in (1, 2, 3):
        saver.save(step, jax.tree.map(lambda x: x * step, STATE))
    saver.close()
    return checkpoint.abstract_state(STATE)


def _data_files(directory, step):
    found = []
    for root, _, names in os.walk(os.path.join(directory, str(step))):
        found += [os.path.join(root, n) for n in names if "/d/" in os.path.join(root, n)]
    assert found
    return found


def _truncate_data(directory, step):
    for path in _data_files(directory, step):
        with open(path, "r+b") as f:
            f.truncate(5)


@pytest.mark.parametrize("error", [MemoryError("out of memory"), PermissionError(errno.EACCES, "Permission denied"),
                                   OSError(errno.ESTALE, "Stale file handle"), OSError(errno.EIO, "I/O error")],
                         ids=["out of memory", "permission denied", "stale handle", "I/O error"])
def test_a_restore_error_without_damage_moves_nothing(error, tmp_path, monkeypatch):
    directory = str(tmp_path / "checkpoints")
    target = _three_checkpoints(directory)
    before = sorted(os.listdir(directory))
    manager = checkpoint.Checkpointer(directory)

    def failing(*args, **kwargs):
        raise error
    monkeypatch.setattr(manager._manager, "restore", failing)
    with pytest.raises(checkpoint.CheckpointError, match="nothing was moved"):
        manager.restore_latest(target)
    manager.close()
    assert sorted(os.listdir(directory)) == before


def test_an_unreadable_file_is_no_evidence_of_damage(tmp_path, monkeypatch):
    directory = str(tmp_path / "checkpoints")
    target = _three_checkpoints(directory)
    _truncate_data(directory, 3)  # damaged, but that cannot be seen: its files cannot be looked at

    def denied(path):  # (as root, chmod cannot deny a read)
        raise PermissionError(errno.EACCES, "Permission denied", path)
    monkeypatch.setattr(os.path, "getsize", denied)
    manager = checkpoint.Checkpointer(directory)
    with pytest.raises(checkpoint.CheckpointError, match="could not be read .*nothing was moved"):
        manager.restore_latest(target)
    monkeypatch.undo()
    manager.close()
    assert checkpoint.saved_steps(directory) == [1, 2, 3]


def test_a_damaged_checkpoint_is_moved_aside_alone_and_the_previous_one_used(tmp_path, capsys):
    directory = str(tmp_path / "checkpoints")
    target = _three_checkpoints(directory)
    _truncate_data(directory, 3)
    manager = checkpoint.Checkpointer(directory)
    step, state = manager.restore_latest(target)
    manager.close()
    assert step == 2 and float(state["a"][1]) == 2.0
    assert sorted(os.listdir(directory)) == ["1", "2", "3.corrupt", "manifests"]
    err = capsys.readouterr().err
    assert "is damaged" in err and "bytes" in err and "moved it to" in err


def test_readers_never_move_a_checkpoint(tmp_path, capsys):
    directory = str(tmp_path / "checkpoints")
    target = _three_checkpoints(directory)
    for path in _data_files(directory, 3):
        os.remove(path)
    step, _ = checkpoint.restore_from(directory, target)  # what evaluate, load_policy and forks call
    assert step == 2 and "is damaged" in capsys.readouterr().err
    assert sorted(os.listdir(directory)) == ["1", "2", "3", "manifests"]
    with pytest.raises(checkpoint.CheckpointError, match="is damaged"):
        checkpoint.restore_from(directory, target, step=3)
    assert sorted(os.listdir(directory)) == ["1", "2", "3", "manifests"]


def test_evaluate_on_a_damaged_newest_checkpoint_moves_nothing(saved, tmp_path, run_command):
    run_dir = _copy(saved, "run", tmp_path)
    for path in _data_files(os.path.join(run_dir, "checkpoints"), 4):
        os.remove(path)
    before = _snapshot(run_dir)
    done = run_command("jaxrl.evaluate", f"--workdir={run_dir}", f"--out={tmp_path / 'eval'}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["update"] == 2 and "is damaged" in done.stderr
    assert _snapshot(run_dir) == before


def test_keep_best_keeps_the_best_scored_checkpoints_beside_the_newest(tmp_path):
    directory = str(tmp_path / "checkpoints")
    saver = checkpoint.Checkpointer(directory, keep=2, keep_best=2)
    for step, score in [(1, 5.0), (2, 9.0), (3, 1.0), (4, None), (5, 7.0), (6, 2.0), (7, None)]:
        saver.save(step, STATE, score)
    saver.close()
    assert checkpoint.Checkpointer(directory).steps() == [2, 5, 6, 7]  # best two (9, 7) and the newest two
    assert files.read_json(os.path.join(directory, checkpoint.SCORES)) == {"2": 9.0, "5": 7.0, "6": 2.0}


def test_a_run_with_keep_best_keeps_its_best_evaluation(tmp_path):
    config = _small(total_steps=8 * 16 * 8, **{"log.every_steps": 8 * 16, "eval.every_steps": 8 * 16,
                                               "checkpoint.keep": 1, "checkpoint.keep_best": 1})
    result = train.run(config, str(tmp_path / "run"))
    scores = {r["update"]: r["eval_return"] for r in result.metrics}
    assert len(scores) == 8
    best = max(scores, key=lambda u: (scores[u], u))
    kept = checkpoint.Checkpointer(os.path.join(result.workdir, "checkpoints")).steps()
    assert kept == sorted({best, 8})


# --- small files are whole or absent; a cut metrics row is dropped -------------------------------------------------

def test_an_atomic_write_interrupted_midway_leaves_the_old_file(tmp_path, monkeypatch):
    path = str(tmp_path / "config.json")
    files.write_json(path, {"total_steps": 1})
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left")))
    with pytest.raises(OSError):
        files.write_json(path, {"total_steps": 2})
    assert files.read_json(path) == {"total_steps": 1} and os.listdir(tmp_path) == ["config.json"]


def _writing_opens(source: str) -> list[int]:
    """Lines of `source` that call the builtin open() with a mode that writes or truncates ("w", "wb", "w+", ...)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
            mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"),
                                                                 None)
            if isinstance(mode, ast.Constant) and "w" in str(mode.value):
                lines.append(node.lineno)
    return lines


def test_no_module_writes_a_file_in_place():
    """Every file jaxrl writes beside a run goes through jaxrl.files (or orbax); metrics rows are appended whole."""
    assert _writing_opens('open(p, "w")\nopen(p, mode="wb")\nopen(p)\nopen(p, "a")\nf.open(p, "w")') == [1, 2]
    offenders = []
    for root, _, names in os.walk(os.path.join(ROOT, "jaxrl")):
        for name in names:
            if name.endswith(".py") and name != "files.py":
                offenders += [f"{name}:{line}" for line in _writing_opens(open(os.path.join(root, name)).read())]
    assert offenders == []


def test_a_metrics_row_cut_by_a_kill_is_dropped_and_relogged(saved, extended, tmp_path):
    run_dir = _copy(saved, "run", tmp_path)
    path = os.path.join(run_dir, "metrics.jsonl")
    rows = metrics_lib.read(path)
    with open(path, "a") as f:
        f.write('{"update": 6, "env_steps"')  # killed while writing the next row
    assert metrics_lib.read(path) == rows
    _, result = extended  # the same cut row, resumed
    assert [r["update"] for r in result.metrics] == [2, 4, 6]
    assert metrics_lib.read(os.path.join(extended[0], "metrics.jsonl"))[:2] == rows


# --- one line for every mistake -----------------------------------------------------------------------------------

def _stub_package(tmp_path, name):
    """A directory for PYTHONPATH in which `import name` fails as when the package is not installed."""
    stub = tmp_path / "stubs" / name
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n")
    return str(tmp_path / "stubs")


def _python(args, tmp_path, pythonpath=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [pythonpath, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_missing_optional_env_package_names_its_extra(tmp_path):
    workdir = tmp_path / "run"
    result = _python(["-m", "jaxrl.train", "--config=experiments/gymnax_ppo.py", f"--workdir={workdir}"], tmp_path,
                     _stub_package(tmp_path, "gymnax"))
    _one_line(result, 'pip install -e ".[gymnax]"')
    assert not workdir.exists()


def test_a_missing_gguf_package_names_its_extra(tmp_path):
    from jaxrl.models import installed

    model = installed.installed_path("smollm2-135m-instruct") or installed.resolve("smollm2-135m-instruct")
    result = _python(["-m", "jaxrl.generate", f"--model={model}", "--prompt=Hi", "--max_new_tokens=2"], tmp_path,
                     _stub_package(tmp_path, "gguf"))
    _one_line(result, "gguf", 'pip install -e ".[models]"')


def test_a_missing_log_backend_is_refused_before_compiling(tmp_path):
    workdir = tmp_path / "run"
    result = _python(["-m", "jaxrl.train", CARTPOLE, *SMALL, "--config.log.backends=jsonl,tensorboard",
                      f"--workdir={workdir}"], tmp_path, _stub_package(tmp_path, "tensorboardX"))
    _one_line(result, "tensorboardX", ".[log]")
    assert "memory:" not in result.stderr and not workdir.exists()  # before the program was compiled


@pytest.mark.parametrize("args,expected", [
    (["--episodes=-3"], "--episodes must be a positive"),
    (["--episodes=0"], "--episodes must be a positive"),
    (["--export={export}", "--seed=5"], "--seed=5 is not a seed of this run: it trained 1"),
    (["--export={occupied}"], "is not an empty directory"),
    (["--seed=1"], "--seed and --format choose what --export writes"),
    (["--format=hf"], "--seed and --format choose what --export writes"),
], ids=["negative episodes", "zero episodes", "seed not in the run", "export into a full dir", "seed without export",
         "format without export"])
def test_evaluate_flag_mistakes_are_one_line_before_restoring(saved, args, expected, tmp_path, run_command):
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "mine.txt").write_text("keep")
    args = [a.format(export=tmp_path / "export", occupied=occupied) for a in args]
    before = _snapshot(saved["run"])
    _one_line(run_command("jaxrl.evaluate", f"--workdir={saved['run']}", *args), expected)
    assert _snapshot(saved["run"]) == before and (occupied / "mine.txt").read_text() == "keep"
    assert not (tmp_path / "export").exists()


def test_help_lists_the_experiments_and_the_config_reference(run_command):
    for module in ("jaxrl.train", "jaxrl.sweep"):
        shown = run_command(module, "--help")
        assert shown.returncode == 0
        assert "experiments/smax_mappo.py" in shown.stdout and "experiments/text_grpo.py" in shown.stdout
        assert "--print_config" in shown.stdout
    printed = run_command("jaxrl.train", CARTPOLE, "--config.total_steps=1234", "--print_config")
    assert printed.returncode == 0 and json.loads(printed.stdout)["total_steps"] == 1234


def test_sigterm_stops_a_sweep_with_143_and_its_resume_command(tmp_path):
    workdir = tmp_path / "sweep"
    args = [sys.executable, "-m", "jaxrl.sweep", CARTPOLE, *SMALL, "--config.total_steps=100000000",
            "--sweep.lr=1e-3,3e-3", f"--workdir={workdir}"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first_row = workdir / "learning_rate=0.001" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (first_row.exists() and first_row.read_text().endswith("\n")):  # written inside the loop that
        assert proc.poll() is None, proc.communicate()[1][-2000:]       # handles SIGTERM
        assert time.monotonic() < deadline, "no metrics row in 240 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err
    resume = err.strip().splitlines()[-1]
    assert resume.endswith(f"--workdir={workdir}") and "python -m jaxrl.sweep" in resume
    assert "--sweep.lr=1e-3,3e-3" in resume and "checkpoints" not in resume
    assert checkpoint.has_checkpoints(str(workdir / "checkpoints" / "0"))


@pytest.mark.slow
def test_kill_9_during_a_sweeps_save_resumes_exactly():
    """benchmarks/fault_injection.py (its 50-trial result: benchmarks/results/fault_injection.md), one sweep trial."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import fault_injection
    assert fault_injection.main(["--trials", "1", "--scenarios", "sweep", "--seed", "3"]) == 0
