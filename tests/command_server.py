"""`python -m <module> args` and `python -c <code>` without paying for an interpreter that imports jax and jaxrl
each time (about 2 s of the 2.5 s most command-line tests took): started once per test process by conftest, this
imports what every command imports and then, for each request on stdin (a JSON line: module and args, or code and
the environment to run it in; stdout and stderr paths), forks a child that runs the module as `python -m` runs it
(the module itself fresh, as __main__) or the code as `python -c` does, with its own stdout, stderr and exit status,
and answers with the exit status. It imports no command module (runpy would warn that it ran one already imported)
and never starts a JAX backend: its children start their own, with the XLA_FLAGS of their environment (8 host
devices for the tests that compare meshes)."""

import json
import os
import runpy
import sys

# As `python -m` from the repository root would: this checkout's jaxrl, not one installed elsewhere (an editable
# install of another checkout would otherwise serve every command).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jaxrl.algos  # noqa: F401
import jaxrl.run.cli  # noqa: F401
import jaxrl.run.program  # noqa: F401
import jaxrl.run.policies  # noqa: F401
import jaxrl.run.sweep_programs  # noqa: F401


STARTED_WITH = dict(os.environ)


def enter_environment(env: dict) -> None:
    """In a forked child: `env` as the whole environment, as a fresh interpreter started with it would see it: its
    PYTHONPATH before the rest of sys.path, and the jax settings read from JAX_* variables at import (which this
    server made from its own environment) set again where they differ. XLA_FLAGS needs nothing: no backend has
    started yet."""
    os.environ.clear()
    os.environ.update(env)
    sys.path[:0] = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    for name, value in env.items():
        option = name.lower()
        if name.startswith("JAX_") and value != STARTED_WITH.get(name) and option in jax.config.values:
            current = jax.config.values[option]
            if isinstance(current, bool):
                value = value.lower() in ("1", "true", "yes", "on")
            elif isinstance(current, (int, float)):
                value = type(current)(value)
            jax.config.update(option, value)


def run_as_main(request: dict) -> None:
    """In a forked child: `python -m module *args` (request["module"], ["args"]) or `python -c code` (["code"], in
    the environment ["env"]) with its output in the files ["stdout"] and ["stderr"]; exits with the status the
    interpreter would."""
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    if "env" in request:
        enter_environment(request["env"])
    code = 0
    try:
        if "code" in request:
            sys.argv = ["-c"]
            exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = [request["module"], *request["args"]]
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as exit:  # as the interpreter reads its code
        code = exit.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def serve() -> None:
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_as_main(request)
        _, status = os.waitpid(pid, 0)
        print(json.dumps(os.waitstatus_to_exitcode(status)), flush=True)


if __name__ == "__main__":
    serve()
