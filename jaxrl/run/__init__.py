"""The host side of training, one job per module: `loop` (chunks, logging, evaluation, checkpoints, signals),
`workdir` (a run's directory: prepare, resume, run_info), `sweeps` (expansion, programs of settings that
share a compile) and `summary` (confidence intervals, CSV, tables, plots). `python -m jaxrl.train` and
`python -m jaxrl.sweep` are their command lines."""
