"""jaxrl: pure-functional, jitted RL on device meshes (see README.md).

    config (config.py, algos.default_config)
      -> env + networks (envs, networks.py, algos/env_policy.py)
      -> rollout (algos/*: lax.scan over steps)
      -> advantages (advantages.py: GAE, group estimators)
      -> loss (losses.py)
      -> sharded update (engine: gradient steps over the mesh, one compiled chunk of updates)
      -> metrics and checkpoints (run/program.py; `python -m jaxrl.train`)
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # `jaxrl.load_policy(workdir)` without importing the training machinery on `import jaxrl`.
    if name in ("load_policy", "evaluate_run", "export_policy"):
        from jaxrl.run import policies
        return getattr(policies, name)
    raise AttributeError(f"module 'jaxrl' has no attribute {name!r}")
