"""StopSignal: SIGINT and SIGTERM as a flag that the training loop reads after each step.

The handler only sets the flag (logging or saving in a handler could deadlock on a lock the main thread
holds); the loop finishes its step, every rank agrees to stop (one collective with the finiteness flags),
and the checkpoint is written at that step. A second signal raises KeyboardInterrupt: stop now, without
a checkpoint.
"""

from __future__ import annotations

import signal


class StopSignal:
    """`install()` takes over SIGINT and SIGTERM, `restore()` gives them back; `signum` is the first signal
    received since (None: none)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict = {}

    def install(self) -> None:
        def on_signal(signum, frame):
            if self.signum is not None:
                raise KeyboardInterrupt
            self.signum = signum

        self._previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


class TrainingStopped(Exception):
    """Raised after a SIGINT/SIGTERM was handled: the checkpoint is written, the process should exit."""

    def __init__(self, signum: int, path: str | None) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.path = path
