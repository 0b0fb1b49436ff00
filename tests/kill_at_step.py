#!/usr/bin/env python3
"""Run a Python script as __main__ and kill its whole process group at its N-th file-system step.

    python tests/kill_at_step.py N[+DELAY] LOG SCRIPT [ARGS...]

A step is what Python's audit events report as changing the file system: opening a file for
writing, making, renaming or removing a file or directory, changing a mode or times, and starting a
subprocess (git's own work inside it is that one step). At step N, before it happens, the process
group gets SIGKILL; with +DELAY, step N (a subprocess) starts and the group is killed DELAY seconds
later, inside it. N = 0 runs to the end. LOG gets one line per step taken, so a run with N = 0
enumerates the steps of the runs that follow. Start it in a session of its own (start_new_session).
"""

import os
import runpy
import signal
import sys
import threading

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CHANGES = {
    "os.rename",
    "os.remove",
    "os.rmdir",
    "os.mkdir",
    "os.chmod",
    "os.utime",
    "os.truncate",
    "os.symlink",
    "os.link",
    "subprocess.Popen",
}


def _step(event: str, args: tuple) -> str | None:
    """A description of the step an audit event is, or None if it changes nothing."""
    if event == "open":
        path, _, flags = args
        if isinstance(path, int) or not flags & _WRITE_FLAGS:
            return None
        return f"open {os.fsdecode(path)}"
    if event not in _CHANGES:
        return None
    if event == "subprocess.Popen":
        return "run " + " ".join(os.fsdecode(arg) for arg in args[1])
    return f"{event} {os.fsdecode(args[0]) if isinstance(args[0], str | bytes) else args[0]}"


def _kill_group() -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main() -> None:
    target, log_path, script, *script_args = sys.argv[1:]
    kill_at, _, delay = target.partition("+")
    kill_at = int(kill_at)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    count = 0

    def hook(event: str, args: tuple) -> None:
        nonlocal count
        described = _step(event, args)
        if described is None:
            return
        count += 1
        if count == kill_at and not delay:
            _kill_group()
        os.write(log, (described.replace("\n", " ") + "\n").encode(errors="replace"))
        if count == kill_at:  # with a delay: inside the subprocess this step starts
            timer = threading.Timer(float(delay), _kill_group)
            timer.daemon = True  # a run that ends first is not killed
            timer.start()

    sys.argv = [script, *script_args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    sys.addaudithook(hook)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
