"""Ending a finished process: its exit status is the work's, whatever signal comes during teardown."""

from __future__ import annotations

import signal
import sys
from typing import NoReturn

__all__ = ['finish']


def finish(code: int) -> NoReturn:
    """Exit with `code` once the work is done (the console scripts' last step).

    SIGINT and SIGTERM are ignored from here on: the work they could stop is over. Without this, a
    signal during interpreter teardown (a launch ending just as a bag player finished, a terminal's
    Ctrl-C to the whole process group) meets Python's finalization, which resets its handlers to the
    default action, and a finished run ends killed by the signal (exit status -2) instead of `code`.
    """
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    sys.exit(code)
