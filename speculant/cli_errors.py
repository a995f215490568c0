"""How every ``speculant`` command reports a failure: one line on stderr and one exit status.

The line is ``speculant COMMAND: error: MESSAGE`` (argparse's own form, so a usage error and a
failure look alike), never a traceback. The exit status says what went wrong:

- 0: done;
- 1 (:data:`EXIT_FAILURE`): the command could not do its job: a missing or damaged file or
  graph, a model or tokenizer that does not load, a port in use, a backend that is down;
- 2 (:data:`EXIT_USAGE`): the command line is wrong (an unknown flag, a value out of range, flags
  that do not go together); found before any work starts, as argparse does;
- 130: interrupted (Ctrl-C); 141: the reader of its output went away (``| head``).

:func:`launcher.cli.main` sets the command name; handlers call :func:`fail` (or raise
:class:`CommandError`) and return its status.
"""

from __future__ import annotations

import sys

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a tool killed by the signal

_program = ["speculant"]


def set_program(name: str) -> None:
    """The name error lines start with: ``speculant COMMAND`` for the command being run."""
    _program[0] = name


def fail(message: object, code: int = EXIT_FAILURE) -> int:
    """Print ``speculant COMMAND: error: MESSAGE`` (its first line) to stderr; return `code`."""
    lines = str(message).strip().splitlines() or [""]
    print(f"{_program[0]}: error: {lines[0]}", file=sys.stderr, flush=True)
    return code


def usage_error(message: object) -> int:
    """A wrong command line: the error line, exit status 2."""
    return fail(message, EXIT_USAGE)


def warn(message: object) -> None:
    """Print ``speculant COMMAND: warning: MESSAGE`` to stderr."""
    print(f"{_program[0]}: warning: {message}", file=sys.stderr, flush=True)


class CommandError(Exception):
    """Raised by a handler (at any depth) to end the command with one error line."""

    def __init__(self, message: object, code: int = EXIT_FAILURE) -> None:
        super().__init__(str(message))
        self.code = code
