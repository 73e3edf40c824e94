"""`miles-harness`: the command line.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``main(args) -> int``; modules are imported only when their command runs, so a
command that needs torch or matplotlib costs nothing to the others.

Exit codes: 0 ok, 1 a check or comparison failed, 2 bad input (flags, files). The
commands that face an upstream tree (``UPSTREAM_FACING``) share
``harness.upstream.exit_codes.Exit``; a crash of the harness in one of them is exit 2
(a harness error, with the traceback), never 1, which is a finding about upstream.
"""

from __future__ import annotations

import argparse
import importlib
import sys

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

# Commands whose trailing arguments are a Miles command line.
PASSTHROUGH = ("check", "simulate", "run", "check-trace", "advise")


def build_parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="miles-harness", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


def _insert_separator(parser: argparse.ArgumentParser, command: str, argv: list[str]) -> list[str]:
    """A pasted Miles command line without ``--``: everything from the first argument this
    command does not know (a Miles flag, or ``train_async.py``) on is a Miles argument."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    known = {opt: action for opt, action in sub._option_string_actions.items()}
    i = 1
    while i < len(argv):
        token = argv[i]
        name = token.split("=", 1)[0]
        if name not in known:
            return argv[:i] + ["--"] + argv[i:]
        takes_value = known[name].nargs != 0 and "=" not in token
        i += 2 if takes_value else 1
    return argv


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(command)
    if command in PASSTHROUGH and "--" not in argv:
        argv = _insert_separator(parser, command, argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.main(args) or 0)
    except ConfigError as exc:
        print(f"miles-harness {args.command}: error: {exc}", file=sys.stderr)
        return 2
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
