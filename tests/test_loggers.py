"""The log backends beside metrics.jsonl: TensorBoard event files and W&B offline runs hold the rows' values at
their env steps (read back with each library's own reader), resuming hides or skips what the resumed run logs
again, and config.log.backends is checked before anything runs."""

import glob
import json
import os
import struct
import subprocess
import sys

import pytest
from PIL import Image

from jaxrl import config as config_lib, metrics as metrics_lib
from jaxrl.run import loggers as loggers_lib

ROWS = [
    {"update": 1, "env_steps": 100, "wall_time": 1.5, "steps_per_second": 66.7, "episode_return": 1.0,
     "episode_return_per_seed": [0.5, 1.5], "policy_loss": 0.25, "eval_return": None},
    {"update": 2, "env_steps": 200, "wall_time": 3.0, "steps_per_second": 70.0, "episode_return": 2.0,
     "episode_return_per_seed": [None, 2.0], "policy_loss": 0.125, "eval_return": 3.0,
     "eval_return_per_seed": [2.5, 3.5]},
    {"update": 3, "env_steps": 300, "wall_time": 4.5, "steps_per_second": 80.0, "episode_return": None,
     "episode_return_per_seed": [None, None], "policy_loss": 0.0625, "eval_return": None},
]
# tag -> [(step, value)] that ROWS should give: None values and env_steps (the step) left out.
EXPECTED = {
    "update": [(100, 1.0), (200, 2.0), (300, 3.0)],
    "wall_time": [(100, 1.5), (200, 3.0), (300, 4.5)],
    "steps_per_second": [(100, 66.7), (200, 70.0), (300, 80.0)],
    "episode_return": [(100, 1.0), (200, 2.0)],
    "episode_return/seed_0": [(100, 0.5)],
    "episode_return/seed_1": [(100, 1.5), (200, 2.0)],
    "policy_loss": [(100, 0.25), (200, 0.125), (300, 0.0625)],
    "eval_return": [(200, 3.0)],
    "eval_return/seed_0": [(200, 2.5)],
    "eval_return/seed_1": [(200, 3.5)],
}


def log_config(backends):
    config = config_lib.base_config()
    config.experiment, config.log.backends = "logger_test", backends
    return config


def write_gif(path):
    frames = [Image.new("RGB", (12, 8), (80 * i, 40, 0)) for i in range(3)]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100, loop=0)
    return path


def write_all(loggers, rows):
    for row in rows:
        loggers.write(row)


def tensorboard_scalars(workdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(os.path.join(workdir, "tensorboard"))
    events.Reload()
    return events, {tag: [(e.step, pytest.approx(e.value)) for e in events.Scalars(tag)]
                    for tag in events.Tags()["scalars"]}


def test_tensorboard_holds_the_rows_per_seed_curves_config_and_gif(tmp_path):
    config = log_config("jsonl,tensorboard")
    loggers = loggers_lib.open_loggers(config, str(tmp_path))
    write_all(loggers, ROWS)
    gif = write_gif(str(tmp_path / "eval_episode.gif"))
    loggers.write_gif(gif, 300)
    loggers.close()

    assert metrics_lib.read(str(tmp_path / "metrics.jsonl")) == ROWS
    events, scalars = tensorboard_scalars(str(tmp_path))
    assert scalars == EXPECTED
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert json.loads(text) == config_lib.to_dict(config)  # the config's JSON, indented as a code block
    [image] = events.Images("eval_episode")
    assert (image.step, image.width, image.height) == (300, 12, 8)
    assert image.encoded_image_string == open(gif, "rb").read()


def test_tensorboard_resume_shows_only_the_resumed_runs_later_points(tmp_path):
    config = log_config("tensorboard")  # metrics.jsonl is written all the same
    loggers = loggers_lib.open_loggers(config, str(tmp_path))
    write_all(loggers, ROWS)
    loggers.close()
    # Resumed from the checkpoint of update 1: updates 2 and 3 run again (with other numbers here).
    again = [{**row, "policy_loss": -row["policy_loss"]} for row in ROWS[1:]]
    loggers = loggers_lib.open_loggers(config, str(tmp_path), start_update=1, start_env_steps=100)
    write_all(loggers, again)
    loggers.close()

    assert metrics_lib.read(str(tmp_path / "metrics.jsonl")) == ROWS[:1] + again
    _, scalars = tensorboard_scalars(str(tmp_path))
    assert scalars["policy_loss"] == [(100, 0.25), (200, -0.125), (300, -0.0625)]
    assert scalars["update"] == [(100, 1.0), (200, 2.0), (300, 3.0)]


def wandb_records(path):
    """The records of a W&B transaction log (.wandb): LevelDB's log format, 32 KiB blocks of chunks with a
    7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) after a 7-byte file header."""
    from wandb.proto import wandb_internal_pb2

    data, block = open(path, "rb").read(), 32 * 1024
    assert data[:4] == b":W&B"
    pos, pieces = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        pieces += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def wandb_history(run_file):
    """(the run record, [{key: value} of each history row, with "_step"]) of a .wandb file."""
    run, history = None, []
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
    return run, history


def test_wandb_offline_run_holds_the_rows_and_resumes_the_same_run(tmp_path, capfd):
    import wandb

    config = log_config("jsonl,wandb")
    loggers = loggers_lib.open_loggers(config, str(tmp_path))
    write_all(loggers, ROWS)
    loggers.write_gif(write_gif(str(tmp_path / "eval_episode.gif")), 300)
    loggers.close()
    wandb.teardown()  # finish() may return before wandb-core has flushed the offline log; this waits for it
    out, err = capfd.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err  # no banner: one line says where the run is
    assert err.startswith(f"wandb: offline run in {tmp_path / 'wandb' / 'offline-run-'}"), err

    run_id = open(tmp_path / "wandb_run_id").read()
    [run_file] = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / f"run-{run_id}.wandb"))
    run, history = wandb_history(run_file)
    assert (run.run_id, run.project, run.display_name) == (run_id, "jaxrl", tmp_path.name)
    saved_config = {u.key: json.loads(u.value_json) for u in run.config.update if u.key != "_wandb"}
    assert saved_config == config_lib.to_dict(config)
    assert [row["_step"] for row in history] == [100, 200, 300]
    scalars = {}
    for row in history:
        for key, value in row.items():
            if not key.startswith("_") and not key.startswith("eval_episode/"):
                scalars.setdefault(key, []).append((row["_step"], pytest.approx(value)))
    assert scalars == EXPECTED
    video = {k.split("/")[1]: v for k, v in history[-1].items() if k.startswith("eval_episode/")}
    assert video["_type"] == "video-file" and video["path"].endswith(".gif")
    assert os.path.exists(os.path.join(os.path.dirname(run_file), "files", video["path"]))

    loggers = loggers_lib.open_loggers(config, str(tmp_path), start_update=1, start_env_steps=100)
    loggers.close()
    resumed = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / f"run-{run_id}.wandb"))
    assert len(resumed) == 2  # a second offline directory of the same run, for `wandb sync` to add to it


def test_backends_default_to_jsonl_and_unknown_names_fail():
    config = config_lib.base_config()
    assert config.log.backends == "jsonl" and config_lib.log_backends(config) == ("jsonl",)
    config.log.backends = "jsonl, tensorboard,wandb"
    config_lib.validate_shared(config)
    config.log.backends = "jsonl,neptune"
    with pytest.raises(ValueError, match=r"log.backends 'neptune'; known: jsonl, tensorboard, wandb"):
        config_lib.validate_shared(config)
    config.log.backends, config.log.wandb_mode = "wandb", "disabled"
    with pytest.raises(ValueError, match="log.wandb_mode 'disabled'"):
        config_lib.validate_shared(config)


def test_a_missing_library_is_named_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import tensorboardX now fails
    with pytest.raises(ValueError, match=r'tensorboardX package: pip install -e "\.\[log\]"'):
        loggers_lib.open_loggers(log_config("jsonl,tensorboard"), str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_importing_jaxrl_imports_no_logging_library():
    code = ("import sys, jaxrl, jaxrl.config, jaxrl.run.loggers; "
            "print(sorted({'tensorboardX', 'tensorboard', 'wandb'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


def test_a_training_run_logs_the_same_values_everywhere(tmp_path):
    """Through the whole loop (2 seeds, a GIF-less CartPole run): TensorBoard's reader and the W&B offline log
    give back every number of metrics.jsonl at its env step."""
    import wandb

    from helpers import small_cartpole
    from jaxrl import train

    config = small_cartpole(num_seeds=2, **{"log.backends": "jsonl,tensorboard,wandb"})
    result = train.run(config, str(tmp_path), progress=False)
    wandb.teardown()
    expected = {}
    for row in metrics_lib.read(os.path.join(tmp_path, "metrics.jsonl")):
        for tag, value in loggers_lib.scalars(row).items():
            expected.setdefault(tag, []).append((row["env_steps"], pytest.approx(value)))
    assert "episode_return/seed_1" in expected and "eval_return" in expected
    assert len(result.metrics) == 2
    _, tensorboard = tensorboard_scalars(str(tmp_path))
    assert tensorboard == expected
    [run_file] = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    logged = {}
    for row in wandb_history(run_file)[1]:
        for key, value in row.items():
            if not key.startswith("_"):
                logged.setdefault(key, []).append((row["_step"], pytest.approx(value)))
    assert logged == expected


def test_plots_leave_pyplot_alone(tmp_path):
    """A run's learning curve and a sweep's plot are drawn outside pyplot: a notebook's backend stays as it was
    and no figure is left open in it."""
    import matplotlib
    import matplotlib.pyplot as plt

    from jaxrl.run import summary

    before = matplotlib.get_backend()
    matplotlib.use("svg")  # (a backend no plot of jaxrl's picks)
    try:
        curve = metrics_lib.plot_learning_curve(ROWS, str(tmp_path / "curve.png"))
        sweep = summary.plot_sweep(["a", "b"], [ROWS, ROWS], 2, str(tmp_path / "sweep.png"))
        assert matplotlib.get_backend() == "svg" and plt.get_fignums() == []
    finally:
        matplotlib.use(before)
    with Image.open(curve) as a, Image.open(sweep) as b:
        assert a.size == (600, 400) and b.size == (700, 450)
