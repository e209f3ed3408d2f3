"""Multi-process runs: one JAX process per host (or per GPU), joined by `jax.distributed`.

    from jaxrl import distributed
    distributed.initialize()                                   # TPU pod, SLURM, Open MPI: detected
    distributed.initialize("10.0.0.1:1234", num_processes=2, process_id=0)   # explicit, e.g. two CPU hosts

Call it first, before any JAX computation. Afterwards `jax.devices()` lists every process's devices, so
`jaxrl.mesh.make_mesh()` spans all of them and the same compiled update runs on every process: each one
steps the environments of its own devices, and gradients are averaged over the whole mesh. On CPU the
cross-process collectives go through gloo.
"""

from __future__ import annotations

import jax


def initialize(coordinator_address: str = "", num_processes: int = 0, process_id: int = -1) -> None:
    """Join the multi-process run (a no-op for a single process with no coordinator given).

    With a coordinator address, `num_processes` and `process_id` are required; without one, JAX
    detects them from the environment of a TPU pod, a SLURM job or Open MPI.
    """
    if coordinator_address and (num_processes < 1 or not 0 <= process_id < num_processes):
        raise ValueError(f"with a coordinator address, give num_processes >= 1 and 0 <= process_id < "
                         f"num_processes (got {num_processes}, {process_id})")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # only affects the CPU backend
    if coordinator_address:
        jax.distributed.initialize(coordinator_address, num_processes=num_processes, process_id=process_id)
    else:
        jax.distributed.initialize()


def is_main_process() -> bool:
    """Whether this process writes metrics, checkpoints and files (process 0)."""
    return jax.process_index() == 0
