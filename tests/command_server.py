"""`python -m <module> args` without paying for an interpreter that imports jax and jaxrl each time (about 2 s of
the 2.5 s most command-line tests took): started once per test process by conftest's `run_command`, this imports
what every command imports and then, for each request on stdin (a JSON line: module, args, stdout and stderr
paths), forks a child that runs the module as `python -m` runs it (the module itself fresh, as __main__), with
its own stdout, stderr and exit status, and answers with the exit status. It imports no command module (runpy
would warn that it ran one already imported) and never starts a JAX backend: its children start their own."""

import json
import os
import runpy
import sys

# As `python -m` from the repository root would: this checkout's jaxrl, not one installed elsewhere (an editable
# install of another checkout would otherwise serve every command).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jaxrl.algos  # noqa: F401
import jaxrl.run.cli  # noqa: F401
import jaxrl.run.program  # noqa: F401
import jaxrl.run.policies  # noqa: F401
import jaxrl.run.sweep_programs  # noqa: F401


def run_as_main(module: str, args: list[str], stdout: str, stderr: str) -> None:
    """In a forked child: `python -m module *args` with its output in the files `stdout` and `stderr`; exits
    with the status the interpreter would."""
    for fd, path in ((1, stdout), (2, stderr)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv = [module, *args]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
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
            run_as_main(request["module"], request["args"], request["stdout"], request["stderr"])
        _, status = os.waitpid(pid, 0)
        print(json.dumps(os.waitstatus_to_exitcode(status)), flush=True)


if __name__ == "__main__":
    serve()
