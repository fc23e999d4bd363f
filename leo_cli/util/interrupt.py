"""SIGINT and SIGTERM as an exception, so a command stops the way Ctrl-C stops Python code.

Python turns SIGINT into `KeyboardInterrupt`, but SIGTERM kills it on the spot: no `finally`
runs, temporary files and folders stay behind. `leo train`, `leo bench` and `leo profile-cache`
install `raise_on_signals` first, so both signals raise `Interrupted` wherever the main thread
is; cleanup runs on the way out, and the CLI prints one line and exits with 128 + the signal's
number (130 for SIGINT, 143 for SIGTERM), as a shell reports a process killed by it.

`Interrupted` subclasses `KeyboardInterrupt`: `except Exception` (and `except LeoError`) never
swallow it, and anything written to survive Ctrl-C survives SIGTERM too.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The command got SIGINT or SIGTERM.

    Attributes:
        signum: the signal's number.
        note: what was kept and how to continue, set by the command on the way out.
    """

    def __init__(self, signum: int, note: str = "") -> None:
        super().__init__(signum)
        self.signum = signum
        self.note = note

    @property
    def name(self) -> str:
        """`SIGINT`, `SIGTERM`, ..."""
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as shells report a process a signal ended."""
        return 128 + self.signum

    def sentence(self) -> str:
        """One line for the terminal."""
        return f"interrupted by {self.name}" + (f"; {self.note}" if self.note else ".")


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


def raise_on_signals() -> None:
    """Make SIGINT and SIGTERM raise `Interrupted` in the main thread (no-op elsewhere)."""
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, _raise)
