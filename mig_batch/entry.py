"""The one top-level error handler every entry point runs under: a message and exit status 2, never a
traceback (``--debug`` or ``MIG_BATCH_DEBUG=1`` shows it)."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable, Sequence

from mig_batch.errors import MigBatchError

TYPE_CHECKING = False  # typing costs ~2 ms at every start; annotations here are strings
if TYPE_CHECKING:
    from typing import Any

DEBUG_HELP = "on an error, show the Python traceback too (also MIG_BATCH_DEBUG=1)"
INTERNAL = "internal error"  # the bad-input test looks for this: a user-caused error must never read so


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# pyproject.toml's extras and the modules each brings: a GPU node installs mig_batch alone (the agents, the
# hooks, doctor, migsub: PyYAML and nvidia-ml-py); the controller host adds `controller`; the simulators,
# planners, benchmarks and plots need `sim` (which holds `controller`)
EXTRA_MODULES = {"controller": ("numpy", "rich"), "sim": ("numpy", "rich", "matplotlib", "ortools")}


class MissingExtraError(MigBatchError):
    """A command needs an optional dependency (an extra) that is not installed."""


def extra_message(command: str, extra: str, missing: Sequence[str]) -> str:
    return (f"`{command}` needs the {extra} extra ({', '.join(missing)} not installed): "
            f"pip install 'mig-batch[{extra}]'")  # fmt: skip


def require_extra(extra: str, command: str) -> None:
    """Refuse ``command`` (exit 2, naming the extra and how to install it) when ``extra`` is not installed.
    Looks the modules up without importing them."""
    from importlib.util import find_spec

    missing = [name for name in EXTRA_MODULES[extra] if name not in sys.modules and find_spec(name) is None]
    if missing:
        raise MissingExtraError(extra_message(command, extra, missing))


def needs_extra(extra: str, command: str) -> Callable[[Callable[[Any], int]], Callable[[Any], int]]:
    """A command handler's decorator: :func:`require_extra` before the handler runs (and imports)."""

    import functools  # loaded already: argparse's re imports it

    def wrap(handler: Callable[[Any], int]) -> Callable[[Any], int]:
        @functools.wraps(handler)
        def run(args: Any) -> int:
            require_extra(extra, command)
            return handler(args)

        return run

    return wrap


def missing_extra(exc: BaseException, prog: str, args: Sequence[str]) -> str | None:
    """A command that got past :func:`require_extra` (or has none) but imported a module of an extra that is
    not installed: which extra to install, never an ImportError."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    extras = [extra for extra, modules in EXTRA_MODULES.items() if top in modules]
    if not extras:
        return None
    words = [a for a in args if not a.startswith("-")][:2] if prog == "mig-batch" else []
    words = words[:1] if words[:1] == ["plan"] else words  # plan's second word is its queue file
    extra = "sim" if words[:1] and words[0] in ("simulate", "plan", "bench") else extras[0]
    return extra_message(" ".join([prog, *words]), extra, [top])


def log_level(text: str) -> str:
    """argparse type for ``--log-level``: one of the logging module's level names, any case."""
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a log level; accepted: {', '.join(LOG_LEVELS)}")
    return text.upper()


def terminal_columns() -> int:
    """shutil.get_terminal_size().columns without importing shutil (with its archive modules, ~2 ms)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, as wide as argparse would make it, found without shutil."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, terminal_columns() - 2 if width is None else width)


class CommandParser(argparse.ArgumentParser):
    """The entry points' parser: :class:`HelpFormatter` by default, here and in every subcommand."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def wants_debug(args: Sequence[str]) -> bool:
    """``--debug`` among the options (not after ``--``), or MIG_BATCH_DEBUG set."""
    options = args[: args.index("--")] if "--" in args else args
    return "--debug" in options or os.environ.get("MIG_BATCH_DEBUG", "") not in ("", "0")


def add_debug_option(parser: argparse.ArgumentParser) -> None:
    """``--debug`` on ``parser`` and on every subcommand under it, so it is accepted in any position."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                add_debug_option(sub)


def describe(exc: BaseException) -> str:
    """What went wrong, in a user's words."""
    if isinstance(exc, MigBatchError):
        return str(exc)
    if isinstance(exc, OSError):
        return describe_os_error(exc)
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str) and " " in exc.args[0]:
        return exc.args[0]  # a KeyError raised with a sentence (older code), not a bare missing key
    if isinstance(exc, ValueError) and type(exc) is ValueError:
        return str(exc)  # commands raise plain ValueError("--x must be ...") for option checks
    return (f"{INTERNAL}: {type(exc).__name__}: {exc} (a bug in mig_batch; run again with --debug for the "
            "traceback and report it)")  # fmt: skip


def describe_os_error(exc: OSError) -> str:
    where = exc.filename if exc.filename is not None else ""
    if exc.errno == errno.ENOTDIR:
        return f"{where}: a part of this path is a file, not a directory; give a path under a directory"
    if exc.errno == errno.EACCES or exc.errno == errno.EPERM:
        return f"{where}: permission denied; give a path you can write to (or run as the user that owns it)"
    if exc.errno == errno.ENOENT:
        return f"{where}: no such file or directory"
    if exc.errno == errno.EROFS:
        return f"{where}: read-only file system; give a writable path"
    return f"{where}: {exc.strerror or exc}" if where else str(exc)


def run_guarded(body: Callable[[list[str]], int], argv: Sequence[str] | None, prog: str) -> int:
    """Run an entry point's ``body(args)``; user errors become ``prog: error: ...`` and exit 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return int(body(args) or 0)
    except BrokenPipeError:  # output piped into head & co.: stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if wants_debug(args):
            import traceback  # only on an error: its import is not free

            traceback.print_exc()
        print(f"{prog}: error: {missing_extra(exc, prog, args) or describe(exc)}", file=sys.stderr)
        return 2
