"""Where a run's metric rows go: metrics.jsonl always, TensorBoard and Weights & Biases when config.log.backends
names them ("jsonl", "tensorboard", "wandb", comma-separated).

metrics.jsonl is written whatever the backends say, since resuming, the plots and sweep summaries read it; the
other backends add to it. The loop opens one `Loggers` per workdir, on the main process only (with several
processes, process 0 writes every log), and calls `write(row)` each log interval, `write_gif(path, step)` for an
evaluation episode saved to disk, and `close()` at the end. tensorboardX and wandb are imported only when a
config asks for them (`pip install -e ".[log]"`).

    <workdir>/metrics.jsonl   one JSON row per log interval
    <workdir>/tensorboard/    event files: tensorboard --logdir <workdir>/tensorboard
    <workdir>/wandb/          the W&B run; offline (the default) until `wandb sync <workdir>/wandb/offline-run-*`
    <workdir>/wandb_run_id    the W&B run's id, so that a resumed run continues the same W&B run
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
import time
import uuid

from ml_collections import ConfigDict

from jaxrl import config as config_lib, files
from jaxrl.metrics import MetricsWriter

STEP_KEY = "env_steps"  # every backend's x axis
LIBRARIES = {"tensorboard": "tensorboardX", "wandb": "wandb"}  # backend -> the module (and pip package) it needs


def scalars(row: dict) -> dict[str, float]:
    """A metrics row -> {tag: value} for the step row["env_steps"]: every other number, and each
    `<key>_per_seed` list [S] as `<key>/seed_<i>`. None (no episode ended in the interval; NaN) is left out,
    so a curve has a gap rather than a fake zero."""
    out = {}
    for key, value in row.items():
        if key.endswith("_per_seed") and isinstance(value, list):
            base = key.removesuffix("_per_seed")
            out.update({f"{base}/seed_{i}": float(v) for i, v in enumerate(value) if _is_number(v)})
        elif key != STEP_KEY and _is_number(value):
            out[key] = float(value)
    return out


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _import(backend: str):
    """The library `backend` writes with, or a ValueError that says what to install."""
    module = LIBRARIES[backend]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(f"config.log.backends names {backend!r}, which needs the {module} package: "
                         f'pip install -e ".[log]" (or pip install {module})') from None


def _tag(path: str) -> str:
    """eval_episode.gif -> "eval_episode": a media file's tag."""
    return os.path.splitext(os.path.basename(path))[0]


class _TensorBoard:
    """Event files under <workdir>/tensorboard, flushed with every row so that a live TensorBoard shows the
    latest point."""

    def __init__(self, tensorboardX, config: ConfigDict, workdir: str, start_env_steps: int):
        # purge_step: TensorBoard hides the points that earlier event files hold from this step on, the ones a
        # resumed run logs again (those after the checkpoint it resumes from). tensorboardX names a file by the
        # second and truncates it on opening, and TensorBoard reads files in name order: the suffix keeps a run
        # resumed within the same second from overwriting the file before it, and sorts it after that file.
        self.writer = tensorboardX.SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=start_env_steps + 1,
                                                 filename_suffix=f".{time.time_ns()}")
        config_json = json.dumps(config_lib.to_dict(config), indent=2, sort_keys=True)
        # Indented four spaces: a markdown code block, as TensorBoard's text dashboard renders it.
        self.writer.add_text("config", "\n".join("    " + line for line in config_json.splitlines()), start_env_steps)

    def write(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def write_gif(self, path: str, step: int) -> None:
        """An image summary may hold a GIF's bytes as they are (tensorboardX's add_video would need moviepy to
        encode frames again); TensorBoard's image dashboard shows it animated."""
        from PIL import Image
        from tensorboardX.proto.summary_pb2 import Summary

        with Image.open(path) as image:
            width, height = image.size
        with open(path, "rb") as f:
            image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=f.read())
        self.writer.file_writer.add_summary(Summary(value=[Summary.Value(tag=_tag(path), image=image)]), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    """One W&B run per workdir, with the config; its id is kept in <workdir>/wandb_run_id so that a resumed run
    continues it. Quiet (one line saying where the run is), no questions, no console capture (the progress bar
    stays as it is); offline mode touches no network (wandb-core's crash reports off too)."""

    def __init__(self, wandb, config: ConfigDict, workdir: str):
        mode = config.log.wandb_mode
        if mode == "offline":
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # read when wandb-core starts
        elif wandb.run is None and not wandb.login(prompt=False, verify=False):  # a run open: already logged in
            raise ValueError('config.log.wandb_mode="online" needs W&B credentials: run `wandb login` or set '
                             'WANDB_API_KEY (or use log.wandb_mode="offline" and `wandb sync` later)')
        self.wandb = wandb
        self.run = wandb.init(
            project=config.log.wandb_project, name=os.path.basename(os.path.abspath(workdir)),
            group=config.experiment, dir=workdir, config=config_lib.to_dict(config), mode=mode,
            id=_wandb_run_id(workdir), resume="allow",
            settings=wandb.Settings(silent=True, console="off", reinit="create_new"))
        # W&B's steps only increase: a resumed online run keeps the points it has and skips those again.
        self.first_step = self.run.step
        sync_dir = self.run.settings.sync_dir
        print(f"wandb: offline run in {sync_dir}; upload it with `wandb sync {sync_dir}`" if mode == "offline"
              else f"wandb: {self.run.url}", file=sys.stderr)

    def write(self, values: dict, step: int) -> None:
        if step >= self.first_step:
            self.run.log(values, step=step)

    def write_gif(self, path: str, step: int) -> None:
        self.write({_tag(path): self.wandb.Video(path)}, step)

    def close(self) -> None:
        self.run.finish()


def _wandb_run_id(workdir: str) -> str:
    """The W&B run id saved in `workdir`, or a new one (8 hex digits), saved there."""
    path = os.path.join(workdir, "wandb_run_id")
    if not os.path.exists(path):
        files.write_atomic(path, uuid.uuid4().hex[:8])
    with open(path) as f:
        return f.read().strip()


@dataclasses.dataclass
class Loggers:
    """metrics.jsonl and the other backends of one workdir, written together."""

    jsonl: MetricsWriter
    backends: list  # _TensorBoard / _Wandb

    def write(self, row: dict) -> None:
        """Log one metrics row (a `jaxrl.metrics.summarize` row with update, env_steps, ...) everywhere."""
        self.jsonl.write(row)
        values = scalars(row)
        for backend in self.backends:
            backend.write(values, row[STEP_KEY])

    def write_gif(self, path: str, step: int) -> None:
        """Log a GIF already written to `path` (e.g. <workdir>/eval_episode.gif) at env step `step`, tagged by
        its file name; metrics.jsonl has no place for it."""
        for backend in self.backends:
            backend.write_gif(path, step)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()


def check_backends(config: ConfigDict) -> None:
    """ValueError naming the pip extra when a library that `config.log.backends` names is not installed."""
    for name in config_lib.log_backends(config):
        if name != "jsonl":
            _import(name)


def open_loggers(config: ConfigDict, workdir: str, start_update: int = 0, start_env_steps: int = 0) -> Loggers:
    """The logs of a run in `workdir` that starts at `start_update` (`start_env_steps` env steps; 0 and 0 for a
    fresh run, the checkpoint's update when resuming): metrics.jsonl drops its rows after that update (the run
    logs them again), TensorBoard hides its later points, W&B continues the same run.

    Raises ValueError before anything is written when a backend's library is not installed (or W&B's online
    mode finds no credentials).
    """
    libraries = {name: _import(name) for name in config_lib.log_backends(config) if name != "jsonl"}
    backends = []
    if "wandb" in libraries:  # first: its credentials check is the one thing left that may fail
        backends.append(_Wandb(libraries["wandb"], config, workdir))
    if "tensorboard" in libraries:
        backends.append(_TensorBoard(libraries["tensorboard"], config, workdir, start_env_steps))
    jsonl = MetricsWriter(os.path.join(workdir, "metrics.jsonl"))
    jsonl.truncate_after(start_update)
    return Loggers(jsonl, backends)
