"""One case in a process of its own (forked from a warm runner, or a fresh interpreter), bounded in
time and memory, and its outcome: ok, error, memory, crash, timeout, or lost (not the case's doing)."""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import subprocess
import sys
import time

from ..errors import SweepError
from . import _child

FINAL = ("ok", "error", "memory", "crash", "timeout")  # a case's own outcomes; "lost" is the machine's
LOG_CHARS = 300
_VERSION: dict = {}


def code_version(now: bool = False) -> dict:
    """pt2b's version, and where it runs from a git checkout, that checkout's `git describe`: as it stood
    at this process's first call, or (``now``) as it stands now."""
    if not _VERSION or now:
        from ..version import __version__

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        git = None
        if os.path.exists(os.path.join(root, ".git")):
            try:
                git = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty"], capture_output=True,
                                     text=True, timeout=30).stdout.strip() or None
            except (OSError, subprocess.SubprocessError):
                git = None
        if now and _VERSION:
            return dict(pt2b=__version__, git=git)
        _VERSION.update(pt2b=__version__, git=git)
    return dict(_VERSION)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class Running:
    """A case's process: its messages read as they come, its end turned into an outcome (``poll``)."""

    def __init__(self, spec: dict, timeout: float, log_path: str, fork: bool):
        self.spec, self.log_path = spec, log_path
        self.started = self.partial = self.done = None
        self.eof = False
        self.buffer = b""
        self.t0 = time.monotonic()
        self.deadline = self.limit = self.t0 + timeout
        self.timeout = timeout
        self.step = None  # the seconds of the case's last report that set its time limit
        self.steps: list = []
        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        read, write = os.pipe()
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self.pid = self._fork(write, log) if fork else self._spawn(write, log)
        finally:
            os.close(write)
            os.close(log)
        os.set_blocking(read, False)
        self.fd = read

    def _fork(self, write: int, log: int) -> int:
        parent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the case's process
            code = 0
            try:
                os.setpgid(0, 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                # (the runner's sys.stdout may not write to descriptor 1: a test's capture)
                sys.stdout = open(1, "w", buffering=1, closefd=False)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                _child.serve(self.spec, write, parent)
            except BaseException:  # noqa: BLE001 -- (serve records the case's own failures)
                code = 70
            finally:
                os._exit(code)
        return pid

    def _spawn(self, write: int, log: int) -> int:
        from .case import interpreter_path

        python = interpreter_path(self.spec["interpreter"]) if self.spec.get("interpreter") else sys.executable
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([root, *self.spec.get("path", []), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        spec_read, spec_write = os.pipe()
        high = os.dup(write)  # (the descriptors moved to 0 and 3 must not be 0 to 3 themselves)
        high_spec = os.dup(spec_read)
        try:
            pid = os.posix_spawn(python, [python, _child.__file__, str(os.getpid())], env, setpgroup=0,
                                 file_actions=[(os.POSIX_SPAWN_DUP2, high_spec, 0), (os.POSIX_SPAWN_DUP2, high, 3),
                                               (os.POSIX_SPAWN_DUP2, log, 1), (os.POSIX_SPAWN_DUP2, log, 2)])
        finally:
            for fd in (high, high_spec, spec_read):
                os.close(fd)
        with os.fdopen(spec_write, "wb") as f:
            f.write(json.dumps(self.spec).encode())
        return pid

    def fileno(self) -> int:
        return self.fd

    def _read(self) -> None:
        while not self.eof:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                self.eof = True
                return
            self.buffer += chunk
            *lines, self.buffer = self.buffer.split(b"\n")
            for line in lines:
                try:
                    msg = json.loads(line)
                except ValueError:  # (not the runner's message: something else wrote to its descriptor)
                    continue
                if "started" in msg:
                    self.started = msg["started"]
                elif "partial" in msg:
                    self.partial = msg["partial"]
                    if "step" in msg:
                        self.steps.append(msg["step"])
                    if msg.get("seconds") is not None:
                        self.step = msg["seconds"]
                        self.deadline = min(self.limit, time.monotonic() + self.step)
                elif "done" in msg:
                    self.done = msg["done"]

    def kill(self) -> None:
        """Kill the case's process group (the case and what it started); its leader is not reaped yet,
        so the group's id is still its own."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _ended(self, until: float) -> bool:
        """Whether the case's process has ended (not reaped: its group is still its own), waiting until ``until``."""
        while os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
            if time.monotonic() >= until:
                return False
            time.sleep(0.02)
        return True

    def poll(self) -> dict | None:
        """The outcome once the case's process has ended (killed at its time limit), else None."""
        self._read()
        now = time.monotonic()
        # still running: nothing yet (the pipe open), or its end not yet visible (the pipe just closed)
        if now < self.deadline and not self._ended(min(self.deadline, now + 0.5) if self.eof else now):
            return None
        timed_out = time.monotonic() >= self.deadline and self.done is None
        self.kill()
        _, status, usage = os.wait4(self.pid, 0)
        self._read_to_end()
        return self._outcome(status, usage, timed_out)

    def _read_to_end(self) -> None:
        os.set_blocking(self.fd, True)
        while not self.eof and select.select([self.fd], [], [], 1.0)[0]:
            os.set_blocking(self.fd, False)
            self._read()
            os.set_blocking(self.fd, True)
        os.close(self.fd)

    def _outcome(self, status: int, usage, timed_out: bool = False) -> dict:
        seconds = round(time.monotonic() - self.t0, 3)
        out = {"seconds": seconds, "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 3) if usage else None,
               "peak_rss_mb": round(usage.ru_maxrss / 1024, 1) if usage else None}
        if self.done is not None and not timed_out:
            out.update(self.done)
        elif timed_out:
            within = f"{self.step:g} s of its last report" if self.step is not None and self.deadline < self.limit \
                else f"{self.timeout:g} s"
            out.update(outcome="timeout", error=f"no result within {within}, killed")
        elif self.started is None:
            out.update(outcome="lost", error="the case's process ended before it started the case" + self._why(status))
        else:
            out.update(outcome="crash", error="the case's process " + self._why(status).strip(" :"))
            if os.WIFSIGNALED(status):
                out["signal"] = _signal_name(os.WTERMSIG(status))
        if out["outcome"] not in ("ok",):
            tail = self._log_tail()
            if tail:
                out["log_tail"] = tail
            if self.partial is not None:
                out["partial"] = self.partial
            if self.steps:
                out["steps"] = self.steps
        return out

    @staticmethod
    def _why(status) -> str:
        if status is None:
            return ""
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            extra = " (the kernel's out-of-memory killer, or another process)" if sig == signal.SIGKILL else ""
            return f": killed by {_signal_name(sig)}{extra}"
        return f": exit code {os.WEXITSTATUS(status)} without a result"

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - LOG_CHARS))
                return f.read().strip()
        except OSError:
            return ""


def launch(spec: dict, timeout: float, log_path: str, fork: bool) -> Running | dict:
    """Start the case's process; a start the machine refuses (no process or memory to fork) is the
    outcome "lost", run again elsewhere or later."""
    try:
        return Running(spec, timeout, log_path, fork)
    except SweepError:
        raise
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE):
            raise SweepError(f"case {spec['id']!r} cannot start: {e}") from None
        return {"outcome": "lost", "error": f"the case's process could not start: {e}", "seconds": 0.0,
                "peak_rss_mb": None}


def run_one(spec: dict, timeout: float, log_path: str) -> dict:
    """The case in a fresh interpreter, to its end (a Ray task's body)."""
    running = launch(spec, timeout, log_path, fork=False)
    if isinstance(running, dict):
        return running
    while True:
        out = running.poll()
        if out is not None:
            return dict(out, **code_version())
        select.select([running], [], [], max(0.0, min(1.0, running.deadline - time.monotonic())))
