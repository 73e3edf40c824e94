"""`miles-harness`: the command line.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``main(args) -> int``; modules are imported only when their command runs, so a
command that needs torch or matplotlib costs nothing to the others.

One parsing rule for every command: the words after the first ``--`` are a Miles command
line (``args.miles_args``; only the commands in ``PASSTHROUGH`` take one), every word
before it is the harness's, and the harness's options are recognised wherever they stand
among its positionals (``check-trace TRACE --incomplete``). A Miles flag before ``--``,
an unknown option, or an unknown Miles flag after ``--`` (``harness.flags.known``; opt out
with ``--allow-unknown-miles-flags``) is a usage error whose first line names the word and
the fix.

Exit codes (``EXIT_CODES``): 0 ok, 1 a check or comparison failed, 2 bad input (a usage
error, a flag, a rule a Miles command line breaks, a missing or malformed file), 3 the
harness refuses to run a Miles tree (``doctor``), 130 interrupted.
The commands that face an upstream tree (``UPSTREAM_FACING``) share
``harness.upstream.exit_codes.Exit``; a crash of the harness in one of them is exit 2
(a harness error, with the traceback), never 1, which is a finding about upstream.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from typing import NoReturn

from miles_async_core.errors import ConfigError

COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("harness.commands.check", "validate a Miles command line against a rule profile"),
    "simulate": ("harness.commands.simulate", "run a scenario on virtual time with simulated backends"),
    "check-trace": ("harness.commands.check_trace", "run every trace invariant checker on a stored JSONL trace"),
    "run": ("harness.commands.run", "real engine + trainer: sync vs one-step vs fully-async (the main job)"),
    "gap": ("harness.commands.gap", "kernel-level trainer-engine gap ablation with identical weights"),
    "compare": ("harness.commands.compare", "compare benchmark results files"),
    "report": ("harness.commands.report", "make PNG plots from results files"),
    "diff-upstream": (
        "harness.commands.diff_upstream",
        "same scenario on the core and on upstream Miles' code: first divergence",
    ),
    "gate": (
        "harness.commands.gate",
        "a Miles pull request against its base: the same cases on both trees, judged by the invariants",
    ),
    "doctor": ("harness.commands.doctor", "probe a Miles checkout's seams: can the harness run it faithfully"),
    "advise": ("harness.commands.advise", "predict speedup, sample age and lr for a layout from calibrated costs"),
    "serve": ("harness.commands.serve", "an SGLang-compatible HTTP server on the CPU torch engine"),
    "resume-sweep": (
        "harness.commands.resume_sweep",
        "stop and resume every setting at every save and between saves: groups lost and duplicated per resume",
    ),
}


# Commands whose exit 1 means a finding about upstream Miles: an exception there is the harness'.
UPSTREAM_FACING = ("gate", "diff-upstream", "doctor")

# Commands that take a Miles command line after ``--``.
PASSTHROUGH = ("check", "simulate", "run", "check-trace", "advise")
EXIT_CODES = (0, 1, 2, 3, 130)


class UsageError(Exception):
    """A command line the parser cannot read; the message names the word and the fix."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("miles-async-harness")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """The top-level parser (``--help`` lists the commands); ``command``'s own arguments are
    added to its subparser."""
    parser = _Parser(prog="miles-harness", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"miles-harness {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            _add_command_arguments(p, name)
    return parser


def command_parser(command: str) -> argparse.ArgumentParser:
    p = _Parser(prog=f"miles-harness {command}", description=COMMANDS[command][1], allow_abbrev=False)
    _add_command_arguments(p, command)
    return p


def _add_command_arguments(p: argparse.ArgumentParser, command: str) -> None:
    importlib.import_module(COMMANDS[command][0]).add_arguments(p)
    if command in PASSTHROUGH:
        from harness.commands.miles_args import add_opt_out

        add_opt_out(p)
        p.usage = p.format_usage().removeprefix("usage: ").strip() + " [-- MILES_ARGS]"


def _leftover_error(command: str, parser: argparse.ArgumentParser, head: list[str], word: str) -> UsageError:
    from harness.flags.known import is_known

    name = word.partition("=")[0]
    if name.startswith("--") and is_known(name):
        if command in PASSTHROUGH:
            i = head.index(word)
            fixed = " ".join(["miles-harness", command, *head[:i], "--", *head[i:]])
            return UsageError(
                f"{name} is a Miles flag, not an option of miles-harness {command}: Miles flags go after --. "
                f"Fix: {fixed}"
            )
        return UsageError(f"{name} is a Miles flag; miles-harness {command} takes none. Fix: drop it")
    if word.startswith("-"):
        options = sorted(parser._option_string_actions)
        near = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
        return UsageError(
            f"unknown option {name} of miles-harness {command}"
            + (f"; the nearest option is {near[0]}" if near else "")
            + (". Fix: use " + near[0] if near else f". Fix: see miles-harness {command} --help")
        )
    return UsageError(f"unexpected argument {word!r}. Fix: see miles-harness {command} --help")


def parse(argv: list[str]) -> argparse.Namespace:
    """The namespace for ``argv`` under the parsing rule above; ``UsageError`` otherwise
    (``SystemExit`` for ``--help`` and ``--version``, as argparse does)."""
    if not argv or argv[0] not in COMMANDS:
        top = build_parser(None)
        if argv and not argv[0].startswith("-"):
            near = difflib.get_close_matches(argv[0], list(COMMANDS), n=1)
            raise UsageError(
                f"unknown command {argv[0]!r}"
                + (f"; the nearest is {near[0]}" if near else "")
                + f". Allowed: {', '.join(COMMANDS)}. Fix: miles-harness --help"
            )
        top.parse_args(argv)  # --help, --version, or an error
        raise UsageError("no command. Fix: miles-harness COMMAND ... (miles-harness --help lists them)")
    command, rest = argv[0], argv[1:]
    head, miles = (rest[: rest.index("--")], rest[rest.index("--") + 1 :]) if "--" in rest else (rest, [])
    if "--" in rest and command not in PASSTHROUGH:
        raise UsageError(
            f"miles-harness {command} takes no Miles command line after --. "
            f"Fix: drop -- and what follows; the commands that take one: {', '.join(PASSTHROUGH)}"
        )
    parser = command_parser(command)
    args, leftover = parser.parse_known_intermixed_args(head)
    if leftover:
        raise _leftover_error(command, parser, head, leftover[0])
    args.command, args.miles_args = command, miles
    if command in PASSTHROUGH:
        from harness.commands.miles_args import check_known

        try:
            check_known(miles, allow_unknown=args.allow_unknown_miles_flags)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    prog = f"miles-harness {command}" if command else "miles-harness"
    try:
        args = parse(argv)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        parser = command_parser(command) if command else build_parser(None)
        print(parser.format_usage().rstrip(), file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help or --version: argparse printed them
        return exc.code if isinstance(exc.code, int) else 0
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.main(args) or 0)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file or port the user named: the message, never a traceback
        where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
        print(f"{prog}: error:{where}: {exc.strerror or exc} ({type(exc).__name__})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception:
        if args.command not in UPSTREAM_FACING:
            raise
        import traceback

        traceback.print_exc()
        print(
            f"miles-harness {args.command}: harness error (exit 2): the harness crashed (traceback above); "
            "this is not a finding about upstream Miles",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
