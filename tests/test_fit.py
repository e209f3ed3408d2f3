"""Fit before you run: the chunk program's memory, read from its compiled form for the state's shapes alone,
against formulas for the state; a program too big fails before anything is allocated or written."""

import dataclasses
import io
import re
import shutil
import sys

import pytest

from helpers import load_experiment, set_keys
from jaxrl import algos, checkpoint, mesh as mesh_lib, train
from jaxrl.run import fit, program


def _dqn(**overrides):
    config = load_experiment("cartpole_dqn")
    return algos.resolve(set_keys(config, {"num_seeds": 2, "log.progress_bar": False, **overrides}))


def _fit(config, donate: bool):
    algo, hp = algos.build(config, mesh_lib.mesh_for_runs(config.mesh, config.num_seeds))
    return fit.check(algo, algo.abstract_seeds(config.seed, config.num_seeds), hp, donate)


@pytest.fixture(scope="module")
def big_buffer():
    """cartpole_dqn with a replay buffer of 400,000 steps per seed, 2 seeds, 2,000 env steps: its config and the
    fits of its chunk program as the loop keeps and as it donates its input state."""
    config = _dqn(**{"replay.buffer_size": 400_000, "total_steps": 2_000})
    return config, _fit(config, False), _fit(config, True)


def test_the_state_is_counted_once_when_donated_and_twice_when_kept(big_buffer):
    _, kept, donated = big_buffer
    # the buffer: per seed, 400,000 steps x (obs and next_obs of 4 float32, reward float32, action int32,
    # terminated, done and first bools) = 400,000 x 43 bytes
    buffer = 2 * 400_000 * (2 * 4 * 4 + 4 + 4 + 3)
    assert buffer + 1e5 <= kept.state == donated.state <= buffer + 1e6  # (+ networks, optimiser, envs)
    assert kept.largest[0] == "buffer" and buffer <= kept.largest[1] <= buffer + 64  # (+ its write position)
    assert kept.held_twice and not donated.held_twice
    assert kept.peak >= 2 * kept.state
    assert kept.state <= donated.peak < kept.peak
    # XLA's count for an update: at least one gradient step's matrix products for each of the 2 seeds (the
    # online network forward and backward on the batch of 128, and forward on the next observations for the
    # double-Q action and the target's values: 5 passes of 4-128-128-2), and at most the update's 2 gradient
    # steps with as much again for the rest (layer norms, Adam, acting). 2026-11-28: 5.7 passes' worth (XLA
    # counts the loop of gradient steps once).
    passes = 2 * 128 * 2 * (4 * 128 + 128 * 128 + 128 * 2)  # seeds x batch x multiply-adds of one forward pass
    assert 5 * passes <= kept.flops <= 2 * 2 * 5 * passes, kept.flops / passes
    assert f"state {kept.state / 1e6:.0f} MB, held twice" in kept.describe()


def test_a_program_that_cannot_fit_fails_before_anything_is_written(big_buffer, tmp_path, monkeypatch):
    monkeypatch.setattr(fit, "memory_available", lambda device: 50e6)
    with pytest.raises(fit.DoesNotFit) as raised:
        train.run(big_buffer[0], str(tmp_path / "run"), progress=False)
    message = str(raised.value)
    assert "does not fit in memory" in message and "50 MB free" in message
    assert "its largest part is buffer" in message and "lower replay.buffer_size" in message
    assert "replay.store_dtype=float16 (halves its observations)" in message  # its observations are float32
    assert "set checkpoint.on_nonfinite=stop (holds the state once)" in message
    assert raised.value.fit.needed > 0.9 * 50e6
    assert not (tmp_path / "run").exists()


def test_the_buffer_advice_offers_float16_only_to_a_float32_buffer():
    # the algorithm's own advice (`sized_by`, from its settings), which the message above gives for its largest part
    for dtype, float16_offered in (("float32", True), ("float16", False)):
        config = _dqn(**{"replay.store_dtype": dtype})
        advice = algos.build(config, mesh_lib.mesh_for_runs(config.mesh, config.num_seeds))[0].sized_by["buffer"]
        assert advice.startswith("replay.buffer_size")
        assert ("replay.store_dtype=float16" in advice) == float16_offered, (dtype, advice)


@pytest.fixture(scope="module")
def close_to_the_limit(tmp_path_factory):
    """cartpole_dqn trained for two chunks (a run of one chunk is not timed) with its program at 85% of the free
    memory: (config, workdir, what it printed on stderr)."""
    config = _dqn(total_steps=2_000, **{"log.every_steps": 1_000, "checkpoint.every_steps": 1_000})
    workdir = str(tmp_path_factory.mktemp("close") / "run")
    measure, printed = fit.measure, io.StringIO()

    def at_85_percent(*args, **kwargs):
        measured = measure(*args, **kwargs)
        return dataclasses.replace(measured, available=int(measured.needed / 0.85))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fit, "measure", at_85_percent)
        patch.setattr(sys, "stderr", printed)
        train.run(config, workdir, progress=False)
    return config, workdir, printed.getvalue()


def test_a_run_prints_its_memory_and_warns_close_to_the_limit(close_to_the_limit, tmp_path, capsys):
    config, workdir, err = close_to_the_limit
    assert "memory: " in err and "GFLOP per update" in err
    assert "close to the limit: its largest part is buffer" in err
    # and the time it expects, from one update timed on the initial state before training
    # (in s, min or h: a busy machine can make one timed update of this small run look long)
    duration = r"[0-9.e-]+ (s|min|h)"
    assert re.search(rf"expected: {duration} per chunk of \d+ updates, {duration} for the \d+ updates left", err)
    # resumed with one chunk left (its last checkpoint lost): timing it would cost as much again; not timed
    shutil.copytree(workdir, tmp_path / "run")
    saved = checkpoint.saved_steps(str(tmp_path / "run" / "checkpoints"))
    shutil.rmtree(tmp_path / "run" / "checkpoints" / str(saved[-1]))
    train.run(config, str(tmp_path / "run"), progress=False)
    err = capsys.readouterr().err
    assert "resuming from" in err and "expected:" not in err


def test_restoring_a_checkpoint_counts_the_state_twice_on_the_cpu(big_buffer, close_to_the_limit, tmp_path, capsys):
    """orbax restores into host memory before placing the arrays: a resumed run needs the state twice for a
    moment, though its chunks hold it once."""
    _, _, donated = big_buffer
    assert donated.needed < 2 * donated.state
    restoring = dataclasses.replace(donated, restoring=True)
    assert restoring.needed == 2 * donated.state
    assert "held once, twice while its checkpoint is restored" in restoring.describe()
    config, workdir, _ = close_to_the_limit
    config = set_keys(config.copy_and_resolve_references(), {"total_steps": 4_000, "checkpoint.on_nonfinite": "stop"})
    shutil.copytree(workdir, tmp_path / "run")
    train.run(config, str(tmp_path / "run"), progress=False)  # resumes, its chunks holding the state once
    assert "twice while its checkpoint is restored" in capsys.readouterr().err


@pytest.mark.parametrize("first_seconds_here,first_seconds_of_process_0,calls", [
    (0.2, 0.2, 2), (3.0, 3.0, 2),  # a first call slowed by one-off work on a busy machine is timed again
    (0.2, 30.0, 1), (30.0, 0.2, 2)])
def test_every_process_times_the_same_number_of_updates(monkeypatch, first_seconds_here, first_seconds_of_process_0,
                                                         calls):
    # Each timed update is a collective program: processes that ran it a different number of times (one of
    # them under the re-timing bound, the other over) would wait on each other's collectives. Process 0's
    # timing decides.
    import jax
    from jax.experimental import multihost_utils

    durations = iter([first_seconds_here, 0.1])
    clock = [0.0]

    class Algo:
        calls = 0
        compile_seconds = 0.0  # (the Algorithm protocol's: the timing leaves out what a call spends compiling)

        def run_chunk(self, state, hyperparams, num_updates):
            Algo.calls += 1
            clock[0] += next(durations)
            return state

    monkeypatch.setattr(program.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", lambda x: first_seconds_of_process_0)
    seconds = program._time_one_update(Algo(), {}, {})
    assert Algo.calls == calls
    assert seconds == pytest.approx(0.1 if calls == 2 else first_seconds_of_process_0)
