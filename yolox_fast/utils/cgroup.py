"""The memory a container may still use: its cgroup's limit less what it has charged.

In Docker and Kubernetes the host's free RAM (what psutil reports) is not what a process may use: the
container's cgroup has a limit, and pages written to /dev/shm (tmpfs) are charged to it. Crossing it
gets the process killed, not an error. cgroup v2 keeps the limit in `memory.max` ("max": none) and the
charge in `memory.current`; v1 in `memory/memory.limit_in_bytes` (a huge number: none) and
`memory/memory.usage_in_bytes`. The page cache's inactive file pages are charged but given back on
demand, so they count as room.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
NO_LIMIT = 1 << 60  # v1 writes "no limit" as the largest page-aligned int64; anything this big is none


@dataclass
class CgroupMemory:
    """The memory cgroup this process is charged to."""

    limit: int  # bytes
    used: int  # bytes charged now, less the reclaimable inactive page cache
    where: str  # the limit file, for the log

    @property
    def room(self) -> int:
        return max(self.limit - self.used, 0)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


def _own_paths(proc_cgroup: Path) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory-controller path) of this process's cgroup from /proc/self/cgroup."""
    v2 = v1 = None
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _candidates(base: Path, own: str | None) -> list[Path]:
    """The process's own cgroup folder, then the mount's root (inside a container the root is its own)."""
    folders = [base / own.lstrip("/")] if own and own != "/" else []
    return [*folders, base]


def cgroup_memory(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> CgroupMemory | None:
    """The memory limit and charge of this process's cgroup (v2, else v1), or None where no limit is set."""
    v2, v1 = _own_paths(proc_cgroup)
    for folder in _candidates(root, v2):
        limit = _read_int(folder / "memory.max")
        if limit is not None and limit < NO_LIMIT:
            used = _read_int(folder / "memory.current") or 0
            used -= _stat(folder / "memory.stat", "inactive_file")
            return CgroupMemory(limit, max(used, 0), str(folder / "memory.max"))
    for folder in _candidates(root / "memory", v1):
        limit = _read_int(folder / "memory.limit_in_bytes")
        if limit is not None and limit < NO_LIMIT:
            used = _read_int(folder / "memory.usage_in_bytes") or 0
            used -= _stat(folder / "memory.stat", "total_inactive_file")
            return CgroupMemory(limit, max(used, 0), str(folder / "memory.limit_in_bytes"))
    return None
