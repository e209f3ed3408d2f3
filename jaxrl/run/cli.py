"""Command lines that report bad input in one line: `error: <message>` on stderr and exit status 2.

    def main(argv) -> int | None: ...     # raise InputError("...") for bad input
    if __name__ == "__main__":
        define_flags()                     # absl flags, config_flags.DEFINE_config_file, ...
        cli.run_main(main)                 # parses the flags (adding --verbose), runs main, exits

What counts as bad input (one line, status 2; `--verbose` prints the traceback above it):
  * flag errors: an unknown flag or config key (`--config.totl_steps=5`, with a close match suggested), a
    value of the wrong type (`--config.num_envs=four`), a missing config file, and a ValueError or
    TypeError from the config file's `get_config` (`--config=experiments/cartpole_ppo.py:3m`);
  * `InputError`, a `SystemExit` with a message, `jaxrl.checkpoint.CheckpointError` (a run directory
    whose checkpoints do not fit this config, or cannot be read), `jaxrl.run.fit.DoesNotFit` (a program too big
    for memory) and `jaxrl.run.workdir.DirectoryInUse` (another process trains in the directory);
  * an optional package that is not installed (an ImportError while the input is read and checked: an env
    adapter's library, a log backend), named with its pip extra;
  * ValueError, TypeError, KeyError, ImportError and OSError (a file-system problem with a path the command
    was given) raised while the input is read and checked, before any training
    program runs: inside an `input_phase()` block (a CLI's own reading of its flags), or inside one of the
    INPUT_STAGES, however deep: validating the config, building the algorithm and its environment (an
    unknown SMAX scenario), making the mesh, preparing or loading a run directory, checking what a tuning
    method may sweep and the run a fork starts from.
Anything else, e.g. a ValueError raised from inside a running training program, is a crash: the full
traceback and Python's status 1. `is_input_error(error)` says which; `report(error, verbose)` prints the
line and exits.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import os
import re
import shlex
import sys
import traceback
from typing import Callable, NoReturn

from ml_collections import ConfigDict

from jaxrl import algos, checkpoint, config as config_lib, mesh as mesh_lib
from jaxrl.run import fit, loggers, saved, sweep_programs, workdir as workdir_lib

EXIT_INPUT_ERROR = 2  # as argparse exits on a usage error
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C

# Exception types that are the input's fault when raised while the input is read and checked (an ImportError
# there is an optional package the config needs, e.g. gymnax for a gymnax env: the adapters name the pip extra).
INPUT_TYPES = (ValueError, TypeError, KeyError, ImportError, OSError)

# Functions that only read and check the input, before any training program runs: an INPUT_TYPES exception
# raised inside one of them (however deep) is an input error. `input_stage` adds one.
INPUT_STAGES: list[Callable] = [algos.validate, algos.build, mesh_lib.mesh_for_runs, workdir_lib.check_kind,
                                workdir_lib.open_directory,
                                workdir_lib.check_saved, workdir_lib.prepare, config_lib.load,
                                loggers.check_backends, sweep_programs.tuned_hyperparams,
                                sweep_programs.check_one_program, sweep_programs.check_same_sweep,
                                sweep_programs.Fork.check, sweep_programs.Fork.config, saved.warm_start]

_MARK = "_jaxrl_input_error"


class InputError(Exception):
    """Bad input (a flag, a config value, a run directory): the command line prints `error: <message>`."""


def input_stage(fn: Callable) -> Callable:
    """Decorator: INPUT_TYPES exceptions raised inside `fn` are input errors on the command line."""
    INPUT_STAGES.append(fn)
    return fn


@contextlib.contextmanager
def input_phase():
    """A block that reads and checks input: an INPUT_TYPES exception raised inside is an input error.

    The exception itself goes on unchanged (a library caller still sees its ValueError)."""
    try:
        yield
    except INPUT_TYPES as error:
        setattr(error, _MARK, True)
        raise


def is_input_error(error: BaseException) -> bool:
    """Whether `error` is bad input (one line, status 2) rather than a crash (see the module)."""
    if isinstance(error, (InputError, checkpoint.CheckpointError, fit.DoesNotFit, workdir_lib.DirectoryInUse)):
        return True
    if isinstance(error, SystemExit):
        return isinstance(error.code, str)
    if not isinstance(error, INPUT_TYPES):
        return False
    if getattr(error, _MARK, False):
        return True
    stages = {inspect.unwrap(fn).__code__ for fn in INPUT_STAGES}
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in stages:
            return True
        tb = tb.tb_next
    return False


_JAX_FILTERING_NOTE = "\n--------------------\nFor simplicity, JAX has removed"


def message(error: BaseException) -> str:
    """The error's message on one line."""
    if isinstance(error, SystemExit):
        text = str(error.code)
    elif isinstance(error, KeyError) and len(error.args) == 1:
        text = str(error.args[0])
    else:
        text = str(error)
    text = text.split(_JAX_FILTERING_NOTE)[0]  # (an error raised while tracing: jax appends a note on frames)
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return text or type(error).__name__


def report(error: BaseException, verbose: bool = False) -> NoReturn:
    """Print `error: <message>` (after the traceback when `verbose`) and exit with status 2."""
    if verbose:
        traceback.print_exception(error)
    print(f"error: {message(error)}", file=sys.stderr, flush=True)
    sys.exit(EXIT_INPUT_ERROR)


def run_main(main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> NoReturn:
    """absl's `app.run(main, argv)` (flags defined beforehand, plus `--verbose`), exiting with main's return
    value; input errors, in the flags or from main, print one line and exit with status 2 (see the module)."""
    from absl import app, flags

    if "verbose" not in flags.FLAGS:
        flags.DEFINE_bool("verbose", False, "on an input error, print the traceback above the one-line message")
    argv = list(sys.argv if argv is None else argv)

    def checked_main(args):
        try:
            return main(args)
        except KeyboardInterrupt:  # a second Ctrl-C, or one outside a training loop: nothing more is saved
            print("error: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
            sys.exit(EXIT_INTERRUPTED)
        except BaseException as error:  # noqa: B036 (SystemExit with a message is an input error)
            if is_input_error(error):
                report(error, flags.FLAGS.verbose)
            raise

    app.run(checked_main, argv=argv, flags_parser=_parse_flags)
    sys.exit(0)  # app.run exits itself; this is for the type checker


def _parse_flags(argv: list[str]) -> list[str]:
    from absl import flags

    FLAGS = flags.FLAGS
    for name in _config_flags():
        argument = _argument(argv, name)
        if argument:
            config_lib.make_siblings_importable(argument.split(":", 1)[0])
    try:
        args = FLAGS(argv)
    except SystemExit as exit:  # absl's --help exits with status 1 after printing the help: asked for, it is 0
        if exit.code == 1 and any(re.fullmatch(r"--?(help|helpshort|helpfull|\?|h)", a) for a in argv[1:]):
            sys.exit(0)
        raise
    except (flags.Error, AttributeError, KeyError, OSError) as error:
        text = _flag_error(error, argv)
        if text is None:
            raise
        input_error = InputError(text)
        input_error.__cause__ = error
        report(input_error, verbose_requested(argv))
    for name in _config_flags():
        value = FLAGS[name].value
        if value is not None and not isinstance(value, ConfigDict):  # ml_collections defers an OSError
            try:
                value.lock()  # raises the deferred error
                text = f"--{name}: the config file did not return a ConfigDict"
            except OSError as error:
                text = f"--{name}: {message(error)}"
            report(InputError(_config_file_error(name, argv) or text), verbose_requested(argv))
    return args


def resume_command(module: str, argv: list[str], workdir: str) -> str:
    """The command line that resumes what `argv` started: `python -m <module>`, the same flags, `--workdir` naming
    `workdir` and no `--overwrite` (which would start it again)."""
    drop = re.compile(r"--?(workdir(=.*)?|(no)?overwrite(=.*)?|resume)$")
    args, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        if drop.match(arg):
            skip = arg.lstrip("-") == "workdir"  # `--workdir DIR`: drop its value too
            continue
        args.append(shlex.quote(arg))
    return " ".join(["python -m", module, *args, f"--workdir={shlex.quote(workdir)}"])


def verbose_requested(argv: list[str]) -> bool:
    """--verbose, before the flags are parsed (when parsing them failed)."""
    return any(re.fullmatch(r"--?verbose(=(true|1|yes))?", arg, re.IGNORECASE) for arg in argv[1:])


def _flag_error(error: BaseException, argv: list[str]) -> str | None:
    """A one-line message for an exception from parsing the flags, or None when it is not about them."""
    from absl import flags

    for name in _config_flags():
        text = _config_file_error(name, argv)
        if text:
            return text
    if isinstance(error, (AttributeError, KeyError)):  # what ml_collections raises for a key the config lacks
        return _unknown_config_key(argv)
    if not isinstance(error, flags.Error):
        return None
    text = message(error)
    if isinstance(error, flags.UnrecognizedFlagError) and error.flagname:
        for name in _config_flags():
            if error.flagname.startswith(f"{name}."):
                return f"--{error.flagname} needs --{name}=<config file> before it"
        known = [name for name in flags.FLAGS if len(name) > 1]
        close = difflib.get_close_matches(error.flagname, known, n=1, cutoff=0.6)
        hint = f" (did you mean --{close[0]}?)" if close else ""
        return f"unknown flag --{error.flagname}{hint}"
    if isinstance(error, flags.IllegalFlagValueError):
        found = re.match(r"flag --([^=\s]+)=", text)
        if found and found.group(1) in flags.FLAGS:
            flag_name = found.group(1)
            value = _argument(argv, flag_name)
            if flag_name in _config_flags():
                # A ValueError or TypeError from the config file's get_config (e.g. an argument it does not
                # take), which config_flags re-raises with its traceback in the message, and absl wraps.
                return message(_config_file_exception(error))
            expected = _type_name(flags.FLAGS[flag_name].default)
            if expected and value is not None:
                return f"{flag_name} must be {expected}, got {value!r}"
    return text.replace("FATAL Flags parsing error: ", "")


def _config_file_exception(error: BaseException) -> BaseException:
    """The exception the config file raised, from the chain absl's IllegalFlagValueError ends."""
    chain = [error]
    while (nested := chain[-1].__cause__ or chain[-1].__context__) is not None and nested not in chain:
        chain.append(nested)
    for outer, inner in zip(chain, chain[1:]):
        if str(outer).startswith("Error whilst parsing config file"):
            return inner
    return chain[1] if len(chain) > 1 else error


def _type_name(value) -> str | None:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    return None


def _config_flags() -> list[str]:
    """The names of the flags defined with `config_flags.DEFINE_config_file`."""
    from absl import flags
    from ml_collections.config_flags.config_flags import ConfigFileFlagParser, is_config_flag

    return [name for name in flags.FLAGS
            if is_config_flag(flags.FLAGS[name]) and isinstance(flags.FLAGS[name].parser, ConfigFileFlagParser)]


def _argument(argv: list[str], name: str) -> str | None:
    """The value given to --name on the command line (the last one), or None."""
    value = None
    for i, arg in enumerate(argv[1:], 1):
        if arg in (f"--{name}", f"-{name}") and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            value = argv[i + 1]
        elif arg.startswith((f"--{name}=", f"-{name}=")):
            value = arg.split("=", 1)[1]
    return value


def _config_file_error(name: str, argv: list[str]) -> str | None:
    """'--config=<path>: no such file' when the config file named on the command line does not exist."""
    argument = _argument(argv, name)
    if argument is None:
        return None
    path = argument.split(":", 1)[0]
    if not os.path.isfile(path):
        return f"--{name}={argument}: no such file"
    return None


def _unknown_config_key(argv: list[str]) -> str | None:
    """`config has no key 'totl_steps' (did you mean 'total_steps'?)` for the first override on the command
    line that names no key of its config (loaded again: a failed parse keeps no config)."""
    from ml_collections.config_flags.config_flags import ConfigFileFlagParser

    for name in _config_flags():
        argument = _argument(argv, name)
        if argument is None:
            continue
        overrides = [m.group(2) for arg in argv[1:]
                     if (m := re.match(rf"--?(no)?{re.escape(name)}\.([^=]+)", arg))]
        if not overrides:
            continue
        try:
            config = ConfigFileFlagParser(name).parse(argument)
        except Exception:  # noqa: BLE001  (the parse error itself is reported otherwise)
            return None
        if not isinstance(config, ConfigDict):
            return None
        keys = _flat_keys(config)
        for key in overrides:
            if not _has_key(config, key):
                close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                return f"{name} has no key {key!r}{hint}"
    return None


def _has_key(config: ConfigDict, key: str) -> bool:
    node = config
    for part in key.split("."):
        if not isinstance(node, ConfigDict) or part not in node:
            return False
        node = node[part]
    return True


def _flat_keys(config: ConfigDict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in config.items():
        keys.append(prefix + key)
        if isinstance(value, ConfigDict):
            keys += _flat_keys(value, f"{prefix}{key}.")
    return keys
