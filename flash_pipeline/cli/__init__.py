"""The ``flash-compactor`` command line (docs/cli.md is the contract): one module per command group.

    lake.py         append, export, show, read
    compaction.py   compact, rehash, auto          (flags generated from CompactOptions and TriggerPolicy)
    maintenance.py  optimize, retain/vacuum, verify
    recovery.py     skip-delta, new-stream
    demo.py         demo
    dev.py          dev (dg dev with one Ray for the deployment)
    options.py      the shared option declarations

Exit codes come from the error hierarchy (flash_pipeline/errors.py): 0 success; 2 bad input; 3 a commit
conflict; 4 an integrity problem; 1 anything unexpected. Each failure is one line on stderr,
``flash-compactor: error: <message>`` (set FLASH_DEBUG=1 for the traceback of an unexpected one).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Callable, Sequence

from flash_pipeline.cli import compaction, demo, dev, lake, maintenance, recovery
from flash_pipeline.cli.demo import DEMO_DESTINATION, DEMO_SOURCE, demo_deltas

__all__ = ["DEMO_DESTINATION", "DEMO_SOURCE", "build_parser", "demo_deltas", "entry", "main"]
from flash_pipeline.cli.flags import PROG, Parser, UsageError, one_line
from flash_pipeline.errors import FlashError, Terminated

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Flash compactor: append deltas, compact them, inspect and export tables.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for group in (lake, compaction, maintenance, recovery, demo, dev):
        COMMANDS.update(group.register(sub))
    return parser


# a partition stream's version is committed or not, never half: what a stopped command's user may rely on
_AFTER_A_STOP = ("what was committed before stays committed, nothing half-written is visible; "
                 "run the command again to finish")


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None, exits_after: bool = False) -> int:
    """Run one command; ``exits_after``: the process ends right after it (the console script), so work that only
    serves a process that lives on (returning freed memory) is skipped."""
    # a failed round reports its task's error as one line; the sibling results it never fetched would make Ray
    # log the same error again, with its traceback, when the process exits
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except UsageError as exc:
        print(f"{PROG}: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except SystemExit as done:  # --help, --version: argparse printed and exits; main() returns the code
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 2)
    args.exits_after = exits_after
    # SIGTERM as Ctrl-C: sessions stop at their next step (`dev` keeps its own handling of its children); a
    # caller's handler comes back when main() returns (a process that calls it in-process keeps its own)
    previous = None
    if args.command != "dev" and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return _run(args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    """The command, its failures turned into one line and an exit code."""
    try:
        from flash_pipeline.compactor.runtime.memory import apply_huge_pages_setting

        apply_huge_pages_setting()  # every command of this process runs without transparent huge pages (FLASH_THP)
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"{PROG}: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except FlashError as exc:
        print(f"{PROG}: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except Terminated:
        print(f"{PROG}: error: terminated (SIGTERM; {_AFTER_A_STOP})", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print(f"{PROG}: error: interrupted ({_AFTER_A_STOP})", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback, unless debugging
        if os.environ.get("FLASH_DEBUG"):
            raise
        print(f"{PROG}: error: unexpected {type(exc).__name__}: {one_line(str(exc))} (set FLASH_DEBUG=1 for a "
              "traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())


def entry() -> None:
    """The ``flash-compactor`` console script (and ``python -m flash_pipeline.cli``): :func:`main`, then exit.

    When nothing is left to finish (:func:`nothing_left_to_finish`), the process ends at once after flushing its
    output, skipping the interpreter's teardown of every module and object: 50-60 ms of a 1.1-1.3 s command
    compacting the benchmarks' 1% clustered update (scenario 3; timed with and without), where the work is
    committed and the output written already. Otherwise it exits the usual way, which joins threads and stops
    a Ray it started."""
    code = main(exits_after=True)
    if nothing_left_to_finish():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def nothing_left_to_finish() -> bool:
    """No thread but this one still running (a daemon thread is never waited for anyway), no child process of
    ``multiprocessing``, and no Ray this process started or joined: an exit without teardown loses nothing."""
    if any(t.is_alive() and not t.daemon and t is not threading.current_thread() for t in threading.enumerate()):
        return False
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is not None and multiprocessing.active_children():
        return False
    ray = sys.modules.get("ray")
    return ray is None or not ray.is_initialized()
