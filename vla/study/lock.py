"""One ``vla study run`` per folder at a time, and no child left behind.

    with StudyLock(work, log) as lock, Children(lock) as children:
        children.run(["vla", "train", ...], stdout=log_file)   # its own process group, ended with the study

``StudyLock`` creates ``study.lock`` in the folder (pid, host, start, command, and the process groups of the
children running), atomically: a second study run there is refused with the holder named. A lock whose pid is dead
on this host is taken over with a note, unless a child it started still runs (a trainer left by a killed study
would write beside the new one: it is named, with the command that stops it).

``Children`` starts each child in its own process group and, on SIGTERM or SIGINT to the study, ends every group
(SIGTERM, then SIGKILL after a grace period) and raises ``Stopped``: the study exits, its lock released, with
nothing left running.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from vla.io import write_json
from vla.provenance import portable_command

LOCK_FILE = "study.lock"
GRACE_S = 10.0  # seconds a child has to end after SIGTERM before SIGKILL


class Stopped(RuntimeError):
    """The study was stopped by a signal; its children were ended."""


def _alive(pid: Any, signal_to=os.kill) -> bool:
    """Whether process ``pid`` (with ``signal_to=os.killpg``: process group) exists; not an id: False."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        signal_to(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class StudyLock:
    """``folder/study.lock`` held while a study runs there (see the module docstring)."""

    def __init__(self, folder: Path, log=print):
        self.folder, self.path, self.log = Path(folder), Path(folder) / LOCK_FILE, log
        self.info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": portable_command(sys.argv),
            "children": [],
        }
        self._mutex = threading.Lock()
        self.held = False

    def __enter__(self) -> StudyLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            tmp = self.folder / f".{LOCK_FILE}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(self.info))
            try:
                os.link(tmp, self.path)  # fails when a lock is there: creation and content in one step
                self.held = True
                return self
            except FileExistsError:
                self._take_over_or_refuse()
            finally:
                tmp.unlink(missing_ok=True)

    def _take_over_or_refuse(self) -> None:
        try:
            holder = json.loads(self.path.read_text())
        except FileNotFoundError:
            return  # released meanwhile: try again
        except (OSError, ValueError):
            holder = {}
        pid, host = holder.get("pid"), holder.get("host")
        who = f"pid {pid} on {host}, since {holder.get('started')}: {' '.join(map(str, holder.get('command') or []))}"
        if host != socket.gethostname() or _alive(pid):
            gone = f"; if it no longer runs, delete {self.path}" if host != socket.gethostname() else ""
            raise RuntimeError(
                f"{self.folder} is in use by another vla study run ({who}); wait for it to end or "
                f"stop it (kill {pid}), then run again{gone}"
            )
        running = [g for g in holder.get("children") or [] if _alive(g, os.killpg)]
        if running:
            raise RuntimeError(
                f"the study run that held {self.folder} ({who}) is gone, but its child process group "
                f"{running[0]} still runs there; stop it (kill -- -{running[0]}), then run again"
            )
        self.log(f"note: taking over the lock of a study run that stopped without releasing it ({who})")
        self.path.unlink(missing_ok=True)

    def children(self, groups: list[int]) -> None:
        """Record the process groups now running (a study run that finds this lock stale checks them)."""
        with self._mutex:
            if self.held:
                self.info["children"] = list(groups)
                write_json(self.path, self.info)

    def __exit__(self, *exc) -> None:
        if self.held:
            self.held = False
            self.path.unlink(missing_ok=True)


class Children:
    """Child processes in their own process groups, ended with the study (see the module docstring)."""

    def __init__(self, lock: StudyLock | None = None):
        self.lock = lock
        self._procs: list[subprocess.Popen] = []
        self._mutex = threading.Lock()
        self.stopping = threading.Event()
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Children:
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread only
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old.clear()
        self.end_all()

    def _on_signal(self, signum, frame) -> None:
        self.end_all()
        raise Stopped(
            f"stopped by {signal.Signals(signum).name}: its training and evaluation processes were ended; "
            "run the same command again to continue where it stopped"
        )

    def run(self, cmd: list[str], **kwargs: Any) -> int:
        """Run ``cmd`` to its end in a new process group; its exit status (``Stopped`` once the study is stopping)."""
        with self._mutex:
            if self.stopping.is_set():
                raise Stopped("the study is stopping; no new process is started")
            proc = subprocess.Popen(cmd, start_new_session=True, **kwargs)
            self._procs.append(proc)
            self._record()
        try:
            return proc.wait()
        finally:
            with self._mutex:
                self._procs.remove(proc)
                self._record()

    def _record(self) -> None:
        if self.lock is not None:
            self.lock.children([p.pid for p in self._procs])

    def end_all(self) -> None:
        """SIGTERM to every child's group, SIGKILL to those still there after ``GRACE_S``."""
        self.stopping.set()
        procs = list(self._procs)
        for proc in procs:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc.pid, signal.SIGKILL)  # the group's other members too, if any outlived the leader


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
