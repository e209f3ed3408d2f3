"""The host side of training, one job per module: `plan` (a program's configs read once: what trains, when
to log, evaluate and save), `program` (start, step one chunk, finish; signals), `workdir` (a run's directory:
prepare, resume, run_info), `sweep_programs` (a sweep's settings, the programs of settings that share a
compile, forks) and `summary` (confidence intervals, CSV, tables, plots). `python -m jaxrl.train` and
`python -m jaxrl.sweep` are their command lines."""
