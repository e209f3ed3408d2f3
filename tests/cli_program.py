"""A command line whose `main` raises what its argument names (`python -m cli_program <kind>`, from tests/): what
`cli.run_main` makes of each, for tests/test_cli_errors.py."""

from jaxrl.run import cli


def main(argv):
    kind = argv[1]
    if kind == "input":
        raise cli.InputError("bad input")
    if kind == "phase":
        with cli.input_phase():
            raise ValueError("bad value in phase")
    if kind == "exit":
        raise SystemExit("exit message")
    if kind == "status":
        return 3
    raise ValueError("a bug")


if __name__ == "__main__":
    cli.run_main(main)
