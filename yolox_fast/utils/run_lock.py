"""One training run per output folder: a lock file ``<folder>/.lock``, held by rank 0 for the whole run.

Two runs into one folder would replace each other's latest/best checkpoints and interleave
train_log.txt. The lock combines two things, chosen for shared filesystems:

- a POSIX record lock (``fcntl.lockf``) on the file. NFS (through lockd, or natively in NFSv4),
  Lustre and GPFS share it between machines, where ``flock`` may stay local to one NFS client. The
  kernel drops it when the process ends, however it ends (exit, exception, SIGKILL, OOM kill), and
  forked data-loader workers do not inherit it. One catch of POSIX locks: closing *any* descriptor of
  the file in the holding process drops the lock, so nothing else in the process may open it.
- the file's content, JSON with the holder's PID, host, start time, command and job id: the refusal
  names the run that holds the folder, and a file whose lock is free tells who left it.

The lock is free but the file is there — its run ended without releasing it (SIGKILL, a crash, a node
failure):

- written on this host: the kernel lock is authoritative here, that process is gone: taken over, with
  a warning naming it;
- written by an earlier attempt of the same job (same SLURM_JOB_ID across requeues, same torchrun run
  id across restarts), wherever it ran: taken over — a restart may put rank 0 on another machine;
- written on another host by another job: whether that run still runs cannot be checked from here
  (a filesystem mounted without lock support would hide its lock): refused, unless ``--force-lock``.

A lock held by a live process is always refused. If a filesystem keeps the lock of a dead machine
(an NFS server that never learnt the client crashed), deleting the file after checking frees it.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
from collections.abc import Mapping
from typing import Any

from loguru import logger

from yolox_fast.utils import dist as dist_utils

LOCK_NAME = ".lock"
_held: set[str] = set()  # lock files this process holds: a second claim of one of them is refused


class RunLockError(RuntimeError):
    """The output folder is in use by another run (or its lock cannot be taken)."""


def owner_record(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What the lock file says about the run holding it."""
    env = os.environ if environ is None else environ
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": shlex.join(sys.argv),
        "cwd": os.getcwd(),
        "job": job_id(env),
    }


def job_id(environ: Mapping[str, str]) -> str | None:
    """The id every attempt of one job shares: SLURM_JOB_ID (kept by requeues), else torchrun's run id."""
    if environ.get("SLURM_JOB_ID"):
        return f"slurm:{environ['SLURM_JOB_ID']}"
    if environ.get("TORCHELASTIC_RUN_ID"):
        return f"torchrun:{environ['TORCHELASTIC_RUN_ID']}"
    return None


def describe_owner(owner: Mapping[str, Any]) -> str:
    """'PID 123 on host h, started ..., command: ...' (fields that are missing are left out)."""
    if not owner:
        return "a run that has not written its details yet"
    if "raw" in owner:
        return f"unreadable lock content {owner['raw'][:200]!r}"
    text = f"PID {owner.get('pid', '?')} on host {owner.get('host', '?')}"
    if owner.get("started"):
        text += f", started {owner['started']}"
    if owner.get("command"):
        text += f", command: {owner['command']}"
    if owner.get("job"):
        text += f" (job {owner['job']})"
    return text


class RunLock:
    """The lock of one output folder. `acquire` raises RunLockError when another run holds it."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = os.path.abspath(folder)
        self.path = os.path.join(self.folder, LOCK_NAME)
        self._fd: int | None = None

    def acquire(self, force: bool = False, environ: Mapping[str, str] | None = None) -> None:
        """Take the lock or raise RunLockError naming the run that has it. `force` takes over a lock
        left on another host (whose liveness cannot be checked); never one a live process holds."""
        key = os.path.realpath(self.path)
        if key in _held:
            raise RunLockError(f"this process already trains into {self.folder}")
        os.makedirs(self.folder, exist_ok=True)
        me = owner_record(environ)
        fd, locked = self._open_locked()
        try:
            previous = _parse(_read(fd))
            if locked is False:
                raise RunLockError(self._in_use_message(previous))
            self._judge_leftover(previous, me, kernel_lock=locked is True, force=force)
            data = (json.dumps(me, indent=1) + "\n").encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        _held.add(key)

    def release(self) -> None:
        """Delete the lock file and drop the lock (a no-op when not held)."""
        if self._fd is None:
            return
        try:
            if _same_file(self._fd, self.path):
                os.unlink(self.path)  # unlinked while still locked: a waiter then sees another inode
        except FileNotFoundError:
            pass
        finally:
            os.close(self._fd)
            self._fd = None
            _held.discard(os.path.realpath(self.path))

    # ------------------------------------------------------------------ internals
    def _open_locked(self) -> tuple[int, bool | None]:
        """(descriptor of the lock file, True: locked / False: held by another process / None: this
        filesystem has no locks)."""
        for _ in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked: bool | None = True
            except OSError as err:
                if err.errno in (errno.EAGAIN, errno.EACCES):
                    return fd, False
                if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    os.close(fd)
                    raise
                logger.warning(
                    f"{self.folder} is on a filesystem without file locks ({os.strerror(err.errno)}): "
                    "relying on the lock file's PID and host alone"
                )
                locked = None
            if _same_file(fd, self.path):
                return fd, locked
            os.close(fd)  # the previous holder deleted the file between our open and lock: again
        raise RunLockError(f"could not take {self.path}: it keeps being replaced by other processes")

    def _in_use_message(self, owner: Mapping[str, Any]) -> str:
        return (
            f"output folder {self.folder} is in use by another training run: {describe_owner(owner)}. "
            "Two runs into one folder would overwrite each other's checkpoints and mix their train_log.txt. "
            "Wait for that run to end or stop it, or train into another folder (-expn NAME or output_dir). "
            f"If that run is certainly gone (e.g. its machine crashed and the file server kept its lock), "
            f"delete {self.path}."
        )

    def _judge_leftover(
        self, previous: Mapping[str, Any], me: Mapping[str, Any], kernel_lock: bool, force: bool
    ) -> None:
        """Return when a lock file whose lock is free may be taken over; raise RunLockError otherwise."""
        if not previous:
            return
        left_by = describe_owner(previous)
        if previous.get("host") == me["host"]:
            pid = previous.get("pid")
            alive = isinstance(pid, int) and pid != os.getpid() and _pid_alive(pid)
            if alive and not kernel_lock:
                raise RunLockError(self._in_use_message(previous))
            reason = "its PID now belongs to another process" if alive else "that process no longer runs"
            logger.warning(f"taking over the stale lock {self.path} left by {left_by}: {reason}")
            return
        if me["job"] is not None and previous.get("job") == me["job"]:
            logger.info(f"taking over {self.path} from an earlier attempt of job {me['job']}: {left_by}")
            return
        if force:
            logger.warning(f"--force-lock: taking over {self.path} left by {left_by}")
            return
        raise RunLockError(
            f"output folder {self.folder} is locked by a run on another host: {left_by}. Its lock is not "
            f"held now, but this filesystem may not share locks between machines, and from host {me['host']} "
            "it cannot be checked whether that run still runs. If it does not, delete "
            f"{self.path} or add --force-lock; otherwise train into another folder (-expn NAME)."
        )


def claim_output_folder(folder: str | os.PathLike, force: bool = False) -> RunLock:
    """Take `folder`'s run lock on rank 0; other ranks get a RunLock they do not hold. Call `release()`
    on it when the run ends (a no-op off rank 0).

    Every rank raises RunLockError when rank 0 could not take it: rank 0's verdict is broadcast
    before anyone trains, so no rank starts alone and none waits for a rank that left.
    """
    lock = RunLock(folder)
    failure: Exception | None = None
    if dist_utils.get_rank() == 0:
        try:
            lock.acquire(force=force)
        except Exception as err:  # any failure here must reach the broadcast, or the others would hang
            failure = err
    verdict = dist_utils.broadcast_object(None if failure is None else str(failure))
    if failure is not None:
        raise failure
    if verdict is not None:
        raise RunLockError(f"rank 0 could not lock the output folder {lock.folder}: {verdict}")
    return lock


def _read(fd: int) -> str:
    return os.pread(fd, 1 << 16, 0).decode(errors="replace")


def _parse(text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        owner = json.loads(text)
    except ValueError:
        return {"raw": text}
    return owner if isinstance(owner, dict) else {"raw": text}


def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
