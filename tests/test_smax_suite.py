"""benchmarks/smax_suite.py: every learner's config on every scenario, the resumable suite, and its report."""

import json
import os
import sys

import numpy as np
import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCHMARKS)

import smax_suite  # noqa: E402
from jaxrl.run import fit  # noqa: E402


@pytest.mark.parametrize("learner", smax_suite.LEARNERS)
def test_every_learner_has_a_valid_config_on_every_scenario(learner):
    from jaxrl import algos

    for scenario in smax_suite.SCENARIOS:
        config = smax_suite.cell_config(learner, scenario, seeds=3, total_steps=None, eval_every=262_144)
        algos.validate(algos.resolve(config))
        assert config.env.kwargs.scenario == scenario and config.num_seeds == 3
        assert config.total_steps >= 2_000_000  # the experiment's own budget when none is given


def test_three_seeds_of_qmix_fit_a_24_gb_machine_on_every_scenario():
    """The replay buffer grows with agents x units; the big scenarios' configs cap it (experiments/smax_qmix.py)."""
    from jaxrl import algos, mesh as mesh_lib

    sizes = {}
    for scenario in smax_suite.SCENARIOS:
        config = smax_suite.cell_config("qmix", scenario, seeds=3, total_steps=None, eval_every=262_144)
        algo, _ = algos.build(config, mesh_lib.mesh_for_runs(config.mesh, 3))
        sizes[scenario] = fit.per_device_bytes(algo.abstract_seeds(config.seed, config.num_seeds))
    assert max(sizes.values()) <= 14e9, {s: fit.format_bytes(b) for s, b in sizes.items()}
    assert sizes["3s5z"] > 7e9  # the default capacity where it fits: 327,680 steps per seed


def _record(marks, training, greedy, seeds=3):
    return {"seeds": seeds, "total_steps": marks[-1], "env_steps": marks[-1], "wall": 10.0, "steps_per_second": 1.0,
            "training": {"marks": marks, "values": training}, "greedy": {"marks": marks[-1:], "values": greedy},
            "date": "d", "machine": "m", "jax": "j"}


def test_the_comparison_takes_the_last_mark_both_logged_and_tests_at_95_percent():
    ours = _record([65_536, 131_072], [[0.1, 0.2, 0.3], [0.50, 0.55, 0.60]], [[0.9, 0.8, 1.0]])
    script = {"runs": [{"rows": [{"env_steps": m, "win_rate": w} for m, w in zip((65_536, 131_072, 196_608), ws)]}
                       for ws in ((0.2, 0.9, 1.0), (0.3, 0.95, 1.0), (0.1, 0.85, 1.0))], "source": "s", "date": "d"}
    text, verdicts = smax_suite.reference_table({"3m": {"mappo": ours}}, {"3m": {"mappo": script}})
    assert verdicts == {("3m", "mappo"): "BELOW"}  # 0.55 +- 0.12 against 0.90 +- 0.12 at 131,072
    assert "0.13M" in text and "0.55 [" in text and "0.90 [" in text
    close = _record([65_536, 131_072], [[0.1, 0.2, 0.3], [0.80, 0.85, 0.90]], [[0.9, 0.8, 1.0]])
    _, verdicts = smax_suite.reference_table({"3m": {"mappo": close}}, {"3m": {"mappo": script}})
    assert verdicts == {("3m", "mappo"): "within"}


def test_the_summary_gives_each_cell_its_final_greedy_interval_and_marks_failures():
    cells = {"2s3z": {"mappo": _record([65_536], [[0.5] * 3], [[0.25, 0.5, 0.75]]),
                      "qmix": {"error": "ValueError: boom"}},
             "3m": {"ippo": _record([65_536], [[0.5] * 3], [[1.0, 1.0, 1.0]])}}
    table = smax_suite.summary_table(cells, ["mappo", "ippo", "qmix"])
    lines = table.splitlines()
    assert lines[2].split("|")[1].strip() == "3m"  # the paper's order, not the dictionary's
    assert "0.50 [0.00, 1.00]" in lines[3] and "failed" in lines[3]  # t(2): -0.12, 1.12, clipped to win rates
    assert "1.00 [1.00, 1.00]" in lines[2] and " at " not in lines[2]
    cells["3m"]["mappo"] = _record([131_072], [[0.5] * 3], [[1.0, 1.0, 1.0]])  # two budgets in a row: each cell says
    row = smax_suite.summary_table(cells, ["mappo", "ippo"]).splitlines()[2]
    assert "0.07M / 0.13M" in row and "1.00 [1.00, 1.00] at 0.13M" in row and "at 0.07M" in row


def test_published_figures_are_compared_with_our_final_greedy_mean_and_the_budget_share():
    cells = {"2s3z": {"ippo": _record([262_144], [[0.5] * 3], [[0.9, 1.0, 1.0]]),  # 0.97 >= 0.90
                      "mappo": _record([262_144], [[0.5] * 3], [[0.8, 0.9, 1.0]])},  # 0.90 [0.65, 1.15] holds 1.00
             "5m_vs_6m": {"mappo": _record([1_000_000], [[0.0] * 3], [[0.0, 0.0, 0.01]]),  # 0.003 [-0.01, 0.02] < 0.05
                          "ippo": {"error": "boom"}},
             "3m": {"mappo": _record([65_536], [[0.5] * 3], [[1.0] * 3])}}  # no published figure: no row
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in
            smax_suite.published_table(cells).splitlines()[2:]}
    assert set(rows) == {("2s3z", "ippo"), ("2s3z", "mappo"), ("5m_vs_6m", "mappo")}
    verdict = {key: line.split("|")[5].strip() for key, line in rows.items()}
    assert verdict == {("2s3z", "ippo"): ">=", ("2s3z", "mappo"): "within", ("5m_vs_6m", "mappo"): "lower"}
    assert "2.6%" in rows[("2s3z", "ippo")] and "10.0%" in rows[("5m_vs_6m", "mappo")]
    assert "0.90 at 10M" in rows[("2s3z", "ippo")]


def test_storing_a_cell_keeps_what_a_suite_beside_it_saved_meanwhile(tmp_path, monkeypatch):
    monkeypatch.setattr(smax_suite, "JSON_PATH", str(tmp_path / "suite.json"))
    smax_suite.store("cells", "3m", "mappo", {"env_steps": 1})
    other = smax_suite.load_saved()  # another suite's process writes its cell after this one started
    other["cells"]["2s3z"] = {"qmix": {"env_steps": 2}}
    (tmp_path / "suite.json").write_text(json.dumps(other))
    smax_suite.store("cells", "3m", "ippo", {"env_steps": 3})
    smax_suite.store("references", "3m", "mappo", {"runs": []})
    assert smax_suite.load_saved() == {"cells": {"3m": {"mappo": {"env_steps": 1}, "ippo": {"env_steps": 3}},
                                                 "2s3z": {"qmix": {"env_steps": 2}}},
                                       "references": {"3m": {"mappo": {"runs": []}}}}
    assert os.listdir(tmp_path) == ["suite.json"]  # no partial file left behind


@pytest.mark.slow
def test_the_suite_resumes_skips_finished_cells_and_extends_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(smax_suite, "JSON_PATH", str(tmp_path / "suite.json"))
    monkeypatch.setattr(smax_suite, "PLOT_PATH", str(tmp_path / "suite.png"))
    monkeypatch.setattr(smax_suite, "LOG_EVERY", 1_024)  # one update of 8 envs x 128 steps
    cell_config = smax_suite.cell_config

    def small_cell(*args, **kwargs):  # the experiment's config with 8 envs (64 in the suite) and 8 battles
        config = cell_config(*args, **kwargs)
        config.num_envs = config.eval.episodes = 8
        return config

    monkeypatch.setattr(smax_suite, "cell_config", small_cell)
    args = ["--runs-dir", str(tmp_path / "runs"), "--scenarios", "3m", "--learners", "mappo", "--seeds", "2",
            "--eval-every", "1024"]
    assert smax_suite.main(args + ["--total-steps", "1024"]) == 0
    first = json.load(open(tmp_path / "suite.json"))["cells"]["3m"]["mappo"]
    assert first["env_steps"] == 1_024 and first["greedy"]["marks"] == [1_024]
    won = np.asarray(first["greedy"]["values"][0]) * 8  # per seed, battles won of the 8 played
    assert won.shape == (2,) and np.allclose(won, np.clip(np.round(won), 0, 8), atol=1e-5), won

    capsys.readouterr()
    assert smax_suite.main(args + ["--total-steps", "1024"]) == 0
    assert "3m mappo: done (1,024 env steps)" in capsys.readouterr().out

    assert smax_suite.main(args + ["--total-steps", "2048"]) == 0  # continues from the checkpoint
    extended = json.load(open(tmp_path / "suite.json"))["cells"]["3m"]["mappo"]
    assert extended["greedy"]["marks"] == [1_024, 2_048]
    assert extended["greedy"]["values"][0] == first["greedy"]["values"][0]  # the first half was not retrained
    assert extended["wall"] > first["wall"]
    assert os.path.exists(tmp_path / "suite.png")


def test_a_cell_whose_program_cannot_fit_in_memory_is_skipped_with_the_figure(tmp_path, monkeypatch, capsys):
    """The training loop's own check (`jaxrl.run.fit`) stops the cell before anything is allocated; the suite
    records why and goes on."""
    monkeypatch.setattr(smax_suite, "JSON_PATH", str(tmp_path / "suite.json"))
    monkeypatch.setattr(smax_suite, "PLOT_PATH", str(tmp_path / "suite.png"))
    monkeypatch.setattr(fit, "memory_available", lambda device: 8e9)
    args = ["--runs-dir", str(tmp_path), "--scenarios", "3s5z", "--learners", "qmix", "--total-steps", "262144"]
    assert smax_suite.main(args) == 0
    out = capsys.readouterr().out
    # 3s5z's float16 buffer, held once: 16 envs x 20,480 steps x (2 x 8 agents x 205 + 2 x 192) values x 2 bytes,
    # for each of 3 seeds: 7.4 GB
    assert "3s5z qmix: not run: needs 7.5 GB (3 seeds), 8.0 GB free" in out
    assert not os.path.exists(tmp_path / "qmix" / "3s5z")  # nothing was written
    cell = smax_suite.load_saved()["cells"]["3s5z"]["qmix"]
    assert cell["skipped"] and "not run: needs 7.5 GB" in smax_suite.summary_table({"3s5z": {"qmix": cell}}, ["qmix"])


def test_unknown_names_are_one_line_errors():
    with pytest.raises(SystemExit, match="unknown scenario 3mm"):
        smax_suite.main(["--report", "--scenarios", "3mm"])
    with pytest.raises(SystemExit, match="unknown learner coma"):
        smax_suite.main(["--report", "--learners", "coma"])


def test_the_reference_repo_must_hold_the_script_of_every_learner_chosen(tmp_path, capsys):
    """The scripts checked for before anything trains are those of the learners chosen (here VDN); every learner
    of the suite has one."""
    from jaxmarl_reference import SCRIPTS

    assert set(smax_suite.LEARNERS) <= set(SCRIPTS)
    scripts = tmp_path / "baselines" / "QLearning"
    scripts.mkdir(parents=True)
    (scripts / "qmix_rnn.py").write_text("")
    with pytest.raises(SystemExit):
        smax_suite.main(["--runs-dir", str(tmp_path / "runs"), "--scenarios", "3m", "--learners", "vdn",
                         "--reference-repo", str(tmp_path)])
    assert f"{scripts / 'vdn_rnn.py'} not found" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "runs")


def test_a_failed_cell_is_reported_and_keeps_what_was_saved(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(smax_suite, "JSON_PATH", str(tmp_path / "suite.json"))
    monkeypatch.setattr(smax_suite, "PLOT_PATH", str(tmp_path / "suite.png"))
    saved = _record([65_536], [[0.5] * 3], [[0.25, 0.5, 0.75]])
    smax_suite.store("cells", "3m", "mappo", saved)

    def fail(config, workdir):
        raise ValueError("boom")

    monkeypatch.setattr(smax_suite, "run_cell", fail)
    args = ["--runs-dir", str(tmp_path), "--scenarios", "3m", "--learners", "mappo,qmix", "--total-steps", "131072"]
    assert smax_suite.main(args) == 0
    out = capsys.readouterr().out
    assert "3m mappo: FAILED: ValueError: boom" in out and "3m qmix: FAILED: ValueError: boom" in out
    cells = json.load(open(tmp_path / "suite.json"))["cells"]["3m"]
    assert cells["mappo"] == saved  # the shorter run's record survives the failed extension
    assert cells["qmix"] == {"error": "ValueError: boom"}
