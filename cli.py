"""What every script shares and nothing else: the one-line error path, atomic writes, file hashes. Torch-free.

    from cli import UsageError, Parser, cli_main, exit_process

    def run(argv):                                   # returns an exit code (None = 0)
        args = Parser(prog="x.py").parse_args(argv)  # bad flags raise UsageError, no usage block
        ...

    def main(argv=None):
        return cli_main(run, "x.py", argv)           # UsageError -> "x.py: error: <one line>" on stderr, exit code 2

    if __name__ == "__main__":
        exit_process(main())
"""
import argparse
import hashlib
import json
import math
import os
import sys


class UsageError(Exception):
    """Bad flags or inputs: reported as one line on stderr with exit code 2, never as a traceback."""


class Parser(argparse.ArgumentParser):
    """argparse whose errors (and its subcommands' errors) raise UsageError instead of printing the usage block."""

    def error(self, message):
        raise UsageError(message)


def cli_main(run, prog, argv=None):
    """Call run(argv) and return its exit code (None counts as 0); a UsageError becomes one line
    '<prog>: error: <message>' on stderr and exit code 2."""
    try:
        code = run(argv)
        sys.stdout.flush()  # a closed pipe (`... | head -1`) surfaces here, inside the handler below
    except UsageError as e:
        print(f"{prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
        code = 2
    except BrokenPipeError:  # the reader went away: stop quietly, as Unix tools do (128 + SIGPIPE)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        code = 141
    return 0 if code is None else code


def finite_float(text):
    """argparse type: a float that is finite (nan/inf would flow into plans and JSON as invalid numbers)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def exit_process(code):
    """Exit a script. Under torchrun with several ranks, leave with os._exit: gloo can abort in its worker thread
    during interpreter shutdown (pytorch#190489)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def atomic_write(path, write):
    """write(tmp_path) writes the file; it then replaces `path` in one step, so a reader never sees half of it."""
    tmp = f"{path}.tmp{os.getpid()}"
    write(tmp)
    os.replace(tmp, path)


def write_json(path, obj, allow_nan=True):
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(json.dumps(obj, indent=2, allow_nan=allow_nan) + "\n")
    atomic_write(path, write)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()
