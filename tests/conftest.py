import os
import sys
import textwrap

import pytest

from helpers import ROOT


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes minutes (still run in CI; `-m 'not slow'` leaves it out)")
    config.addinivalue_line("markers", "optimized: compiles with XLA's full optimisations, as a user's run does "
                            "(learning over many updates, a pretrained model's forward passes: where the optimised "
                            "program's speed repays its compile)")
    # One XLA compilation cache for the whole session, shared by the xdist workers and the subprocesses the
    # tests start (they inherit the environment): many tests compile the same small programs. Set by the
    # controlling process only, before the workers start; a fresh directory each session, so that no test
    # depends on what an earlier session compiled.
    if not hasattr(config, "workerinput") and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        import tempfile

        config._jaxrl_xla_cache = tempfile.mkdtemp(prefix="jaxrl-tests-xla-cache-")
        os.environ["JAX_COMPILATION_CACHE_DIR"] = config._jaxrl_xla_cache
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
    if not hasattr(config, "workerinput"):  # before the workers start: they and their subprocesses inherit it
        compile_as_the_suite(os.environ)
    _name_the_fusion_emitters_in_every_compile()


def pytest_collection_modifyitems(config, items):
    """The long tests (marked slow or optimized: a minute or two each) first, in their collected order: started
    last, one of them would keep a worker busy after the others have run out of tests."""
    items.sort(key=lambda item: not (item.get_closest_marker("slow") or item.get_closest_marker("optimized")))


def pytest_unconfigure(config):
    cache = getattr(config, "_jaxrl_xla_cache", None)
    if cache:
        import shutil

        shutil.rmtree(cache, ignore_errors=True)


# Most tests are bound by XLA's compile time: small programs that run a few updates. They compile cheaply:
# without LLVM's expensive passes (`jax_disable_most_optimizations`, set for the whole session in the
# environment, so that module-scoped fixtures and the subprocesses tests start compile the same way) and with
# XLA:CPU's older fusion emitters (LLVM IR per fusion, not the MLIR fusion emitters), which compile in about half
# the time for programs that run about 1.7x slower (CartPole PPO, 2026-11-27, Intel Xeon: 3.7 s against 6.7 s to
# compile, 2.7 s against 1.6 s for 300 updates). The whole suite with `-n 2` on that machine: 25:52 against
# 48:56 before (with DQN's and PQN's learning tests stopping at their bar, golden runs compiled cheaply).
# Tests marked `optimized` (learning over many updates) compile as a user's run does, and so do the
# subprocesses they start.
# Every other test compares only what it computes itself under the one setting, or (golden runs) numbers
# recorded under it, so the setting does not change what it asserts.
CHEAP_COMPILES = "JAX_DISABLE_MOST_OPTIMIZATIONS"
OLDER_FUSION_EMITTERS = "--xla_cpu_use_fusion_emitters=false"  # in XLA_FLAGS, for the subprocesses tests start
# Cheap or optimised, every program is generated as one LLVM module, not split into parts for parallel code
# generation: on 2 cores the parts only add work (a scanned MLP's gradient, cheaply compiled on a 2-core Intel
# Xeon, 2026-12-01: 1.08-1.14 s against 1.43-1.69 s in three alternating pairs; optimised, no difference). It changes
# the generated code's bits (golden runs' sha256), so the golden records are made under it.
ONE_CODEGEN_PART = "--xla_cpu_parallel_codegen_split_count=1"
# MLIR locations name only each operation's own source line, not its whole Python stack (pytest's included):
# shorter modules to lower and compile; nothing a test computes depends on them.
SHORT_LOCATIONS = ("JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS", "0")


def compile_as_the_suite(env, cheap: bool | None = None) -> None:
    """Set in `env` (os.environ before jax starts, or a command's environment) how the test session compiles:
    cheaply if `cheap`, or when None unless CHEAP_COMPILES is "0" there already; in one code-generation part, with
    short locations."""
    if cheap is None:
        env.setdefault(CHEAP_COMPILES, "1")
    else:
        env[CHEAP_COMPILES] = "1" if cheap else "0"
    flags = with_flag(env.get("XLA_FLAGS", ""), ONE_CODEGEN_PART)
    env["XLA_FLAGS"] = with_flag(flags, OLDER_FUSION_EMITTERS) if env[CHEAP_COMPILES] == "1" else flags
    env.setdefault(*SHORT_LOCATIONS)


def with_flag(flags: str, flag: str) -> str:
    return flags if flag in flags.split() else " ".join([*flags.split(), flag])


def without_flag(flags: str, flag: str) -> str:
    return " ".join(f for f in flags.split() if f != flag)


def _name_the_fusion_emitters_in_every_compile() -> None:
    """Every compile in this process takes the older fusion emitters when cheap and XLA's default ones when
    optimised, whatever XLA_FLAGS said when the process started (XLA reads it once per process). Through jax's
    compile-options hook, a private one: jax has no public setting for every program; should it move, this
    fails loudly. The option is named only where it differs from what the process's XLA_FLAGS give: the
    compile options are part of the compilation cache's key, so a cheap program compiled here and the same
    program compiled by a subprocess (whose XLA_FLAGS name the older emitters) share one cache entry."""
    from jax._src import compiler

    if getattr(compiler.get_compile_options, "names_fusion_emitters", False):
        return
    import jax

    original = compiler.get_compile_options
    started_with_older = OLDER_FUSION_EMITTERS in os.environ.get("XLA_FLAGS", "").split()
    jax.devices()  # XLA reads XLA_FLAGS now, as `started_with_older` saw them (not later, inside a test)

    def get_compile_options(*args, **kwargs):
        options = original(*args, **kwargs)
        older = compiler._DISABLE_MOST_OPTIMIZATIONS.value
        if older != started_with_older:
            options.env_option_overrides = [*options.env_option_overrides, ("xla_cpu_use_fusion_emitters", not older)]
        return options

    get_compile_options.names_fusion_emitters = True
    compiler.get_compile_options = get_compile_options


@pytest.fixture(autouse=True)
def optimised_compiles_when_marked(request, monkeypatch):
    if not request.node.get_closest_marker("optimized"):
        yield
        return
    import jax

    cheap = os.environ.get(CHEAP_COMPILES) == "1"
    monkeypatch.setenv(CHEAP_COMPILES, "0")
    monkeypatch.setenv("XLA_FLAGS", without_flag(os.environ.get("XLA_FLAGS", ""), OLDER_FUSION_EMITTERS))
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", cheap)


def xla_flags_with_devices(devices: int) -> str:
    """XLA_FLAGS for a subprocess with `devices` host devices, keeping the session's other flags."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count=")]
    return " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])


def run_python(code: str, *, devices: int = 1, timeout: int = 600, env: dict | None = None):
    """`python -c code` as a fresh interpreter with `devices` host devices runs it (XLA device flags act only before
    a backend starts): a forked child of this process's command server, which has imported jax and jaxrl already."""
    import subprocess

    result = command_server().request({"code": code, "env": environment_with_devices(devices, env)}, timeout=timeout)
    return subprocess.CompletedProcess([sys.executable, "-c", code], *result)


def environment_with_devices(devices: int, env: dict | None = None) -> dict:
    """This process's environment with `devices` host CPU devices and `env` on top: a command server child's."""
    return dict(os.environ, XLA_FLAGS=xla_flags_with_devices(devices), JAX_PLATFORMS="cpu", **(env or {}))


@pytest.fixture
def python_subprocess():
    return run_python


class _CommandServer:
    """A `tests/command_server.py` process: `python -m` commands and `python -c` code as forked children of one
    interpreter that has imported jaxrl."""

    def __init__(self):
        import subprocess
        import tempfile

        self.process = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "command_server.py")],
                                        cwd=ROOT, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env=dict(os.environ, JAX_PLATFORMS="cpu"), start_new_session=True)
        assert self.process.stdout.readline().strip() == "ready", "the command server did not start"
        self.outputs = tempfile.mkdtemp(prefix="jaxrl-command-server-")

    def request(self, request: dict, timeout: float) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) of one request (`command_server.run_as_main`)."""
        import json
        import select
        import signal
        import tempfile

        out_dir = tempfile.mkdtemp(dir=self.outputs)
        out, err = os.path.join(out_dir, "stdout"), os.path.join(out_dir, "stderr")
        self.process.stdin.write(json.dumps({**request, "stdout": out, "stderr": err}) + "\n")
        self.process.stdin.flush()
        if not select.select([self.process.stdout], [], [], timeout)[0]:
            os.killpg(self.process.pid, signal.SIGKILL)  # the server and the command it waits for
            self.process.wait()
            raise TimeoutError(f"{str(request)[:200]} did not end within {timeout} s")
        line = self.process.stdout.readline()
        assert line, "the command server died"
        with open(out) as stdout, open(err) as stderr:
            return json.loads(line), stdout.read(), stderr.read()

    def run(self, module: str, *args: str, timeout: float = 300, devices: int | None = None):
        """The CompletedProcess (returncode, stdout, stderr) of `python -m module *args` in the repository root, in
        this process's environment or, given `devices`, in one with that many host devices."""
        import subprocess

        request = {"module": module, "args": list(args)}
        if devices is not None:
            request["env"] = environment_with_devices(devices)
        result = self.request(request, timeout)
        return subprocess.CompletedProcess([sys.executable, "-m", module, *args], *result)

    def close(self):
        import shutil

        self.process.stdin.close()
        self.process.wait(timeout=60)
        shutil.rmtree(self.outputs, ignore_errors=True)


_SERVER: list = []  # this test process's command server, started when first needed


def command_server() -> _CommandServer:
    """This test process's command server (`tests/command_server.py`), started on first use (and again after one was
    stopped by a command that timed out) and closed at exit."""
    if not _SERVER or _SERVER[-1].process.poll() is not None:
        import atexit

        _SERVER.append(_CommandServer())
        atexit.register(_SERVER[-1].close)
    return _SERVER[-1]


@pytest.fixture
def run_command():
    """`run_command(module, *args)`: the CompletedProcess of `python -m module *args` run from the repository
    root, as a forked child of the test process's command server (`tests/command_server.py`)."""
    return command_server().run


def assert_one_and_eight_devices_agree(experiment: str, overrides: dict, updates: int, state_fields=("params",),
                                       rtol: float = 1e-5, atol: float = 1e-6, one_device=None, tmp_path=None):
    """Train experiments/<experiment>.py with `overrides` for `updates` updates of 2 seeds on a mesh of 1 device
    and of 8 (a fresh interpreter with 8 host devices); the state's `state_fields` (dotted attributes) must agree.
    `one_device`: the state of that 1-device run, trained already by the caller (a run its test file shares; saved
    in `tmp_path`), so that the fresh interpreter trains on 8 devices only."""
    from operator import attrgetter

    saved = ""
    if one_device is not None:
        import jax
        import numpy as np

        saved = str(tmp_path / "one_device.npz")
        np.savez(saved, *jax.tree.leaves(jax.device_get(attrgetter(*state_fields)(one_device))))
    code = textwrap.dedent(f"""
        from operator import attrgetter
        import jax, numpy as np
        from helpers import load_experiment, set_keys
        from jaxrl import algos, mesh as mesh_lib
        config = set_keys(load_experiment({experiment!r}), {overrides!r})
        algos.validate(config)
        trained = []
        if {saved!r}:
            with np.load({saved!r}) as f:
                trained.append([f[f"arr_{{i}}"] for i in range(len(f.files))])
        for devices in (8,) if trained else (1, 8):
            algo, hp = algos.build(config, mesh_lib.make_mesh(devices))
            state, _ = algo.run_chunk(algo.init_seeds(0, 2), hp, {updates})
            trained.append(jax.device_get(attrgetter(*{tuple(state_fields)!r})(state)))
        for a, b in zip(jax.tree.leaves(trained[0]), jax.tree.leaves(trained[1]), strict=True):
            assert np.isfinite(a).all() and np.isfinite(b).all(), "not finite"  # (NaNs would compare equal)
            np.testing.assert_allclose(a, b, rtol={rtol}, atol={atol})
        print("equal")
    """)
    result = run_python(code, devices=8, env={"PYTHONPATH": "tests"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["equal"]


@pytest.fixture(scope="module")
def builds_shared():
    """For the rest of the test module, `algos.build` returns the algorithm it built before for an equal config and
    mesh, with its compiled programs: a module's fixture run and the two runs of `straight_and_resumed` of one
    config then trace and compile once (compiling is most of such a test's time; a resumed run's state depends on
    the checkpoint it restores, not on which object of equal settings trains it)."""
    import dataclasses

    from jaxrl.algos import registry

    built = {}

    def sharing(build):
        def shared(config, mesh):
            key = (config.to_json(sort_keys=True), repr(mesh))
            if key not in built:
                built[key] = build(config, mesh)
            return built[key]
        return shared

    with pytest.MonkeyPatch.context() as patch:
        for name, recipe in list(registry.ALGORITHMS.items()):
            patch.setitem(registry.ALGORITHMS, name, dataclasses.replace(recipe, build=sharing(recipe.build)))
        yield


def resumed_runs_fixture(experiment: str, overrides: dict, last_checkpoint: int):
    """A module-scoped fixture: experiments/<experiment>.py with `overrides` run by `straight_and_resumed`, one
    algorithm built for both runs (`builds_shared`): (straight result, resumed result)."""
    @pytest.fixture(scope="module")
    def runs(tmp_path_factory, builds_shared):
        from helpers import load_experiment, set_keys

        config = set_keys(load_experiment(experiment), overrides)
        return straight_and_resumed(config, tmp_path_factory.mktemp(experiment), last_checkpoint)
    return runs


def straight_and_resumed(config, tmp_path, last_checkpoint: int):
    """Train `config` straight through in tmp_path/straight, then resume a copy of that run whose last
    checkpoint (`last_checkpoint`, its update count) is lost, as a kill just before it would: (straight result,
    resumed result). Use `assert_same_state` on their states."""
    import shutil

    from jaxrl import train

    straight = train.run(config, str(tmp_path / "straight"))
    workdir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "straight", workdir)
    shutil.rmtree(workdir / "checkpoints" / str(last_checkpoint))
    return straight, train.run(config, str(workdir))


def assert_same_state(a, b):
    """Two training states equal leaf for leaf, bit for bit, and finite (NaNs would compare equal)."""
    import jax
    import numpy as np

    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert not np.issubdtype(x.dtype, np.floating) or np.isfinite(x).all(), "not finite"
        np.testing.assert_array_equal(x, y)


def once_per_session(tmp_path_factory, name: str, produce):
    """`produce(directory)`'s JSON-able result, computed once per test session however many xdist workers ask: the
    first to ask runs it in a directory every worker can read (under the session's shared base temp) while the
    others wait on a lock, then read what it wrote. A training run a fixture makes is not repeated per worker."""
    import fcntl
    import json

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    directory, result = shared / name, shared / f"{name}.json"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (released when the file closes)
        if not result.exists():
            directory.mkdir(exist_ok=True)
            value = produce(str(directory))
            result.write_text(json.dumps(value, default=lambda x: x.item()))  # (numpy scalars)
        return json.loads(result.read_text())


@pytest.fixture(scope="session")
def tiny_sft_run(tmp_path_factory):
    """A `tiny_sft_config` run of 3,200 samples, then resumed with total_steps 4,800: tests/test_text_sft.py checks
    it, and the text GRPO tests start from it (one SFT run for both, its compiles their largest part; read only).
    Returns (workdir, the first run's metric rows, the resumed run's)."""
    def produce(directory):
        from jaxrl import config as config_lib, train
        from helpers import tiny_sft_config

        workdir = os.path.join(directory, "run")
        first = train.run(tiny_sft_config(), workdir).metrics
        config = config_lib.load(os.path.join(workdir, "config.json"))
        with config.unlocked():
            config.total_steps = 4_800
        return workdir, first, train.run(config, workdir).metrics

    return tuple(once_per_session(tmp_path_factory, "tiny_sft", produce))


@pytest.fixture(scope="session")
def countdown_sft_run(tmp_path_factory):
    """tiny_sft_config's model on two-number Countdown, 6,400 samples, evaluated at the end (greedy held-out accuracy
    about 0.4: the text GRPO tests raise it, the reward model tests rank its samples; read only)."""
    def produce(directory):
        from jaxrl import train
        from helpers import countdown_2, set_keys, tiny_sft_config

        workdir = os.path.join(directory, "run")
        config = set_keys(tiny_sft_config("countdown", total_steps=6_400),
                          {**countdown_2(), "eval.every_steps": 6_400, "eval.pass_k": 0})
        train.run(config, workdir)
        return workdir

    return once_per_session(tmp_path_factory, "countdown_sft", produce)
