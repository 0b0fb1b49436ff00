"""What the command lines (apply.py, mtpq) write: stdout that a reader may close early (`| head`), and
notes on stderr about slow work, with progress only where a person watches a terminal."""

from __future__ import annotations

import contextlib
import os
import sys
import time


class _ClosedPipeSink:
    """stdout that turns into /dev/null once its reader has gone: the command still finishes and
    exits with its own code, and nothing reports the pipe at interpreter exit."""

    def __init__(self, stream):
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._discard()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._discard()

    def _discard(self) -> None:
        self._gone = True
        # What the stream still buffers is flushed at exit: into /dev/null, not the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def closed_pipe_tolerated():
    """Run a command whose stdout reader may stop reading early."""
    real = sys.stdout
    sys.stdout = _ClosedPipeSink(real)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = real


def note(text: str) -> None:
    """One line on stderr about slow work being done (a download, a build)."""
    print(text, file=sys.stderr, flush=True)


class Progress:
    """Bytes done of a known total: a line redrawn on a terminal at most every 0.2 s; nothing when
    stderr is piped or a file (note() said what is being done)."""

    def __init__(self, what: str, total: int | None):
        self.what, self.total, self.done = what, total, 0
        self._shown = 0.0
        self._live = sys.stderr.isatty()

    def add(self, count: int) -> None:
        self.done += count
        if self._live and time.monotonic() - self._shown >= 0.2:
            self._shown = time.monotonic()
            self._draw()

    def finish(self) -> None:
        if self._live:
            self._draw()
            sys.stderr.write("\n")
            sys.stderr.flush()

    def _draw(self) -> None:
        done = f"{self.done / 2**20:.1f} MiB"
        if self.total:
            done += f" of {self.total / 2**20:.1f} MiB ({100 * self.done // self.total} %)"
        sys.stderr.write(f"\r{self.what}: {done}")
        sys.stderr.flush()
