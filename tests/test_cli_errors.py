"""Bad input on the command line of `jaxrl.train` and `jaxrl.sweep`: one line `error: <message>` naming what
was wrong, exit status 2, no traceback (but with --verbose), and before anything compiles or is written.
A crash (an exception that is not about the input) keeps its traceback and Python's status 1."""

import os

import pytest

from helpers import ROOT, load_experiment

CARTPOLE = "--config=experiments/cartpole_ppo.py"


def _assert_one_line_error(out, *names):
    """Status 2 and stderr a single `error: ...` line naming every one of `names`."""
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert len(lines) == 1, out.stderr
    assert lines[-1].startswith("error: "), out.stderr
    for name in names:
        assert name in lines[-1], (name, lines[-1])
    return lines[-1]


TRAIN_CASES = {
    "unknown scenario": (["--config=experiments/smax_mappo.py:3mm"], ["unknown SMAX scenario '3mm'", "2s3z"]),
    "argument not taken": ([f"{CARTPOLE}:3m"], ["takes no config argument", "'3m'"]),
    "missing config file": (["--config=experiments/nope.py"], ["experiments/nope.py", "no such file"]),
    "unknown env": ([CARTPOLE, "--config.env.name=nope"], ["config.env.name 'nope'", "CartPole-v1"]),
    "unknown algorithm": ([CARTPOLE, "--config.algorithm=nope"], ["config.algorithm 'nope'", "ppo"]),
    "misspelt key": ([CARTPOLE, "--config.totl_steps=5"], ["'totl_steps'", "did you mean 'total_steps'"]),
    "misspelt section": ([CARTPOLE, "--config.optm.learning_rate=1"], ["'optm.learning_rate'", "'optim.learning_rate'"]),
    "wrong type int": ([CARTPOLE, "--config.num_envs=four"], ["config.num_envs must be an integer", "'four'"]),
    "wrong type float": ([CARTPOLE, "--config.optim.learning_rate=fast"], ["config.optim.learning_rate", "'fast'"]),
    "wrong type bool": ([CARTPOLE, "--config.log.progress_bar=maybe"], ["config.log.progress_bar", "'maybe'"]),
    "out of range": ([CARTPOLE, "--config.num_envs=-3"], ["config.num_envs must be a positive integer, got -3"]),
    "unknown choice": ([CARTPOLE, "--config.optim.schedule=cosin"], ["schedule 'cosin'", "cosine"]),
    "bad layer sizes": ([CARTPOLE, "--config.network.hidden_sizes=(64,0)"], ["config.network.hidden_sizes", "(64, 0)"]),
    "unknown flag": ([CARTPOLE, "--workdirr=x"], ["--workdirr", "did you mean --workdir?"]),
    # (compiled for the state's shapes alone: the 86 GB buffer is never allocated)
    "too big for memory": (["--config=experiments/cartpole_dqn.py", "--config.replay.buffer_size=2000000000"],
                           ["does not fit in memory", "state 86.0 GB", "lower replay.buffer_size"]),
}


@pytest.mark.parametrize("args,names", TRAIN_CASES.values(), ids=TRAIN_CASES.keys())
def test_train_input_error_is_one_line(args, names, tmp_path, run_command):
    workdir = tmp_path / "run"
    _assert_one_line_error(run_command("jaxrl.train", *args, f"--workdir={workdir}"), *names)
    assert not workdir.exists(), "an input error must stop before the run directory is created"


@pytest.mark.parametrize("args,names", [([], ["give --config="]), (["--resume"], ["--resume needs --config"])],
                         ids=["no flags", "resume without config"])
def test_train_without_a_run_to_start_or_resume(args, names, run_command):
    _assert_one_line_error(run_command("jaxrl.train", *args), *names)


def test_divisibility_error_names_the_keys_before_the_run_directory(tmp_path, run_command):
    out = run_command("jaxrl.train", CARTPOLE, "--config.num_envs=3", "--config.num_steps=5",
                      f"--workdir={tmp_path / 'run'}")
    _assert_one_line_error(out, "num_envs * num_steps = 3 * 5 = 15", "optim.num_minibatches = 4")
    assert not (tmp_path / "run").exists()


def test_resuming_a_missing_workdir(tmp_path, run_command):
    missing = tmp_path / "nope"
    _assert_one_line_error(run_command("jaxrl.train", f"--workdir={missing}"), f"--workdir={missing} does not exist")
    assert not missing.exists()
    _assert_one_line_error(run_command("jaxrl.train", f"--workdir={tmp_path}"), "has no config.json")


def test_config_override_without_a_config(tmp_path, run_command):
    out = run_command("jaxrl.train", f"--workdir={tmp_path}", "--config.total_steps=5")
    _assert_one_line_error(out, "--config.total_steps needs --config=")


def test_workdir_of_a_different_config(tmp_path, run_command):
    from jaxrl import config as config_lib

    config_lib.save(load_experiment("cartpole_ppo"), tmp_path / "config.json")
    out = run_command("jaxrl.train", CARTPOLE, "--config.num_envs=8", f"--workdir={tmp_path}")
    _assert_one_line_error(out, "holds a run with a different config", "num_envs")
    assert sorted(os.listdir(tmp_path)) == ["config.json"]


SWEEP_CASES = {
    "unknown swept key": (["--sweep.learning_rat=1e-3,3e-3"], ["'learning_rat'"]),
    "ambiguous swept key": (["--sweep.every_steps=1,2"], ["ambiguous", "log.every_steps"]),
    "bad value list": (["--sweep.lr=1e-3,fast"], ["optim.learning_rate", "'fast' is not a float"]),
    "not an integer": (["--sweep.num_envs=8,2.5"], ["num_envs", "'2.5' is not an integer"]),
    "repeated values": (["--sweep.lr=1e-3,1e-3"], ["repeated values"]),
    "swept value out of range": (["--sweep.num_envs=0,4"], ["config.num_envs must be a positive integer, got 0"]),
    "no values": (["--sweep.lr"], ["--sweep.lr: write --sweep.<key>=<value>"]),
    "misspelt config key": (["--sweep.lr=1e-3", "--config.totl_steps=5"], ["'totl_steps'", "'total_steps'"]),
    "PBT of a shape": (["--sweep.method=pbt", "--sweep.num_envs=4,8"], ["--sweep.num_envs", "changes the program"]),
    "another method's option": (["--sweep.method=pbt", "--sweep.halving.at=0.5", "--sweep.lr=1e-3,1e-2"],
                                ["--sweep.halving.at is an option of --sweep.method=halving"]),
}


@pytest.mark.parametrize("args,names", SWEEP_CASES.values(), ids=SWEEP_CASES.keys())
def test_sweep_input_error_is_one_line(args, names, tmp_path, run_command):
    out = run_command("jaxrl.sweep", CARTPOLE, *args, f"--workdir={tmp_path / 'sweep'}")
    _assert_one_line_error(out, *names)
    assert not (tmp_path / "sweep").exists()


def test_sweep_without_config(run_command):
    _assert_one_line_error(run_command("jaxrl.sweep", "--sweep.lr=1e-3"), "give --config=")


@pytest.mark.parametrize("args", [[CARTPOLE, "--config.num_envs=-3"], [CARTPOLE, "--config.totl_steps=5"]],
                         ids=["from main", "from the flags"])
def test_verbose_shows_the_traceback(args, run_command):
    out = run_command("jaxrl.train", *args, "--verbose")
    assert out.returncode == 2, out.stderr
    assert "Traceback" in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: ")


# `cli.run_main` on its own (tests/cli_program.py): what main raises decides between one line and a traceback.
@pytest.mark.parametrize("kind,status,line", [("input", 2, "error: bad input"),
                                             ("phase", 2, "error: bad value in phase"),
                                             ("exit", 2, "error: exit message"),
                                             ("status", 3, None),
                                             ("crash", 1, "ValueError: a bug")])
def test_run_main_tells_input_errors_from_crashes(kind, status, line, run_command):
    out = run_command("cli_program", kind)
    assert out.returncode == status, out.stderr
    if line:
        assert out.stderr.strip().splitlines()[-1] == line, out.stderr
    assert ("Traceback" in out.stderr) == (kind == "crash"), out.stderr


def test_input_errors_are_classified_by_type_and_phase():
    from jaxrl import algos
    from jaxrl.checkpoint import CheckpointError
    from jaxrl.run import cli

    config = load_experiment("cartpole_ppo")
    config.num_envs = -3
    with pytest.raises(ValueError) as raised:  # a library caller still sees the ValueError
        algos.validate(config)
    assert cli.is_input_error(raised.value), "raised inside an input stage (algos.validate)"
    try:
        raise ValueError("raised in a training program")
    except ValueError as error:
        assert not cli.is_input_error(error)
    with pytest.raises(KeyError) as raised:
        with cli.input_phase():
            {}["key"]
    assert cli.is_input_error(raised.value) and cli.message(raised.value) == "key"
    assert cli.is_input_error(CheckpointError("checkpoint of another config"))
    assert cli.is_input_error(SystemExit("a message")) and not cli.is_input_error(SystemExit(1))
    assert not cli.is_input_error(RuntimeError("a bug"))
    assert cli.message(ValueError("two\n  lines")) == "two lines"


def test_help_texts_keep_their_continued_command_lines():
    """A docstring's `\\` at a line's end, in a plain string, joins the next line to it: `--help` (which prints the
    module's docstring) would show two command lines run together. Every Python file's docstrings keep theirs."""
    import ast

    paths = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in ("build", "runs")]
        paths += [os.path.join(folder, f) for f in files if f.endswith(".py")]
    scopes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)  # what can have a docstring
    glued = []
    for path in sorted(paths):
        source = open(path).read()
        if "\\\n" not in source.replace("\\\\", ""):  # no line continuation at all: nothing to join
            continue
        for scope in (n for n in ast.walk(ast.parse(source)) if isinstance(n, scopes) and ast.get_docstring(n)):
            text = ast.get_source_segment(source, scope.body[0]) or ""  # the docstring as written
            if text.startswith(('"""', "'''")) and "\\\n" in text.replace("\\\\", ""):
                glued.append(f"{os.path.relpath(path, ROOT)}:{scope.body[0].lineno}")
    assert not glued, f"docstrings whose line continuations join lines (make them r\"\"\"...\"\"\"): {glued}"
