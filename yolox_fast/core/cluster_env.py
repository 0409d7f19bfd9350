"""Which launcher started this process, read from its environment alone.

Four answers, checked in this order (the first that applies wins):

1. ``torchrun`` — TORCHELASTIC_RUN_ID is set; RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
   MASTER_PORT come from torchrun. This also holds for ``srun torchrun ...``: torchrun's variables
   win over SLURM's.
2. ``env`` — RANK and WORLD_SIZE are set by something else: a Kubernetes operator (Kubeflow
   PyTorchJob sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, one process per pod) or a script.
   Local rank: LOCAL_RANK if set, else RANK % LOCAL_WORLD_SIZE if that is set, else 0 — one process
   per machine, what such operators start. The GPU count is not used to guess it: a pod that sees
   8 GPUs but runs one process would get a wrong guess.
3. ``slurm`` — inside an ``srun`` step (SLURM_PROCID and SLURM_STEP_ID set): rank SLURM_PROCID, world
   SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), local rank SLURM_LOCALID. MASTER_ADDR defaults to the
   first host of the step's node list, MASTER_PORT to ``12000 + SLURM_JOB_ID % 20000`` (below Linux's
   ephemeral range 32768-60999, so an outgoing connection rarely holds it; the same for every task of
   the job and for its requeues); either can be set to override. An sbatch script itself also has
   SLURM_PROCID=0 and SLURM_NTASKS=N but no SLURM_STEP_ID: that is one process, not rank 0 of N (it
   would wait for N - 1 processes that never come).
4. ``none`` — none of the above: a plain ``python tools/train.py`` (maybe with -d K or YOLOX's
   --num_machines flags, which launch.py handles).

A half-configured environment (RANK without WORLD_SIZE, a rank outside the world, no MASTER_PORT, a
value that is not a number) is a `LaunchEnvError` naming the variables, never a silent single run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

SLURM_PORT_BASE = 12000
SLURM_PORT_SPAN = 20000


class LaunchEnvError(ValueError):
    """The environment names a launcher but is incomplete or inconsistent."""


@dataclass(frozen=True)
class ClusterEnv:
    """Rank layout of this process as its launcher gave it. world_size 1 means a single process."""

    launcher: str  # "torchrun" | "env" | "slurm" | "none"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    local_world_size: int | None = None
    how: str = ""  # where rank, local rank and address came from, for the log
    local_rank_assumed: bool = False  # nothing said how many processes share this machine: assumed one

    def describe(self) -> str:
        """One log line: launcher, rank of world, local rank, rendezvous address."""
        if self.launcher == "none" or self.world_size == 1:
            return f"{self.launcher}: one process" + (f" ({self.how})" if self.how else "")
        where = f"{self.master_addr}:{self.master_port}"
        return (
            f"{self.launcher}: rank {self.rank} of {self.world_size}, local rank {self.local_rank}, "
            f"rendezvous {where} ({self.how})"
        )


def detect_cluster_env(environ: Mapping[str, str] | None = None, scontrol: str | None = "auto") -> ClusterEnv:
    """Read the launcher's variables from `environ` (default os.environ).

    `scontrol` is the scontrol binary used to expand SLURM node lists ("auto": the one on PATH, if
    any; None: always the built-in parser).
    """
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in env:
        return _torchrun(env)
    if any(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return _plain_env(env)
    if "SLURM_PROCID" in env:
        return _slurm(env, shutil.which("scontrol") if scontrol == "auto" else scontrol)
    return ClusterEnv("none")


def _torchrun(env: Mapping[str, str]) -> ClusterEnv:
    _require(env, ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"), "torchrun")
    world = _int(env, "WORLD_SIZE", minimum=1)
    rank = _rank(env, "RANK", "WORLD_SIZE", world)
    local_world = _int(env, "LOCAL_WORLD_SIZE", minimum=1) if "LOCAL_WORLD_SIZE" in env else None
    return ClusterEnv(
        "torchrun",
        rank,
        world,
        _int(env, "LOCAL_RANK", minimum=0),
        env["MASTER_ADDR"],
        _port(env, "MASTER_PORT"),
        local_world,
        f"TORCHELASTIC_RUN_ID {env['TORCHELASTIC_RUN_ID']}",
    )


def _plain_env(env: Mapping[str, str]) -> ClusterEnv:
    missing = [k for k in ("RANK", "WORLD_SIZE") if k not in env]
    if missing:
        present = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k in env]
        raise LaunchEnvError(
            f"{' and '.join(present)} {'is' if len(present) == 1 else 'are'} set but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not: a launcher that sets RANK must also set WORLD_SIZE "
            "(and MASTER_ADDR, MASTER_PORT). Unset them for a single-process run."
        )
    world = _int(env, "WORLD_SIZE", minimum=1)
    rank = _rank(env, "RANK", "WORLD_SIZE", world)
    if world == 1:
        return ClusterEnv("env", how="WORLD_SIZE 1")
    _require(env, ("MASTER_ADDR", "MASTER_PORT"), f"RANK/WORLD_SIZE (WORLD_SIZE {world})")
    local_world = _int(env, "LOCAL_WORLD_SIZE", minimum=1) if "LOCAL_WORLD_SIZE" in env else None
    if "LOCAL_RANK" in env:
        local_rank, rule = _int(env, "LOCAL_RANK", minimum=0), "from LOCAL_RANK"
    elif local_world is not None:
        local_rank, rule = rank % local_world, "= RANK % LOCAL_WORLD_SIZE"
    else:
        local_rank, rule = 0, "0 (no LOCAL_RANK: one process per machine)"
    return ClusterEnv(
        "env",
        rank,
        world,
        local_rank,
        env["MASTER_ADDR"],
        _port(env, "MASTER_PORT"),
        local_world,
        f"RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; local rank {rule}",
        local_rank_assumed="LOCAL_RANK" not in env and local_world is None,
    )


def _slurm(env: Mapping[str, str], scontrol: str | None) -> ClusterEnv:
    if "SLURM_STEP_ID" not in env and "SLURM_STEPID" not in env:
        return ClusterEnv("none", how="SLURM batch script, not an srun step")
    world_key = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    _require(env, (world_key, "SLURM_LOCALID"), "srun (SLURM_PROCID)")
    world = _int(env, world_key, minimum=1)
    rank = _rank(env, "SLURM_PROCID", world_key, world)
    local_rank = _int(env, "SLURM_LOCALID", minimum=0)
    if world == 1:
        return ClusterEnv("slurm", how=f"{world_key} 1")
    if "MASTER_ADDR" in env:
        addr, addr_from = env["MASTER_ADDR"], "MASTER_ADDR"
    else:
        list_key = next(
            (k for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if k in env), None
        )
        if list_key is None:
            raise LaunchEnvError(
                "srun step without SLURM_STEP_NODELIST, SLURM_JOB_NODELIST or SLURM_NODELIST: "
                "set MASTER_ADDR to the host of task 0"
            )
        addr, addr_from = first_host(env[list_key], scontrol), f"first host of {list_key}"
    if "MASTER_PORT" in env:
        port, port_from = _port(env, "MASTER_PORT"), "MASTER_PORT"
    elif "SLURM_JOB_ID" in env:
        port, port_from = slurm_default_port(env["SLURM_JOB_ID"]), "from SLURM_JOB_ID"
    else:
        raise LaunchEnvError("srun step without SLURM_JOB_ID: set MASTER_PORT (the same on every task)")
    return ClusterEnv(
        "slurm",
        rank,
        world,
        local_rank,
        addr,
        port,
        None,
        f"SLURM_PROCID/{world_key}/SLURM_LOCALID; address {addr_from}, port {port_from}",
    )


def slurm_default_port(job_id: str) -> int:
    """MASTER_PORT of a SLURM job when none is set: 12000 + job id % 20000 (a hash for a non-numeric id)."""
    number = int(job_id) if job_id.isdigit() else zlib.crc32(job_id.encode())
    return SLURM_PORT_BASE + number % SLURM_PORT_SPAN


def first_host(nodelist: str, scontrol: str | None = None) -> str:
    """The first host of a SLURM node list: `scontrol show hostnames` when given, else `expand_hostlist`."""
    if scontrol:
        try:
            done = subprocess.run(
                [scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30
            )
            hosts = done.stdout.split()
            if done.returncode == 0 and hosts:
                return hosts[0]
        except (OSError, subprocess.TimeoutExpired):
            pass  # the parser below reads the same syntax
    return expand_hostlist(nodelist)[0]


def expand_hostlist(text: str) -> list[str]:
    """SLURM's compact host list to host names, in order.

    "node[01-03,07],gpu5" -> ["node01", "node02", "node03", "node07", "gpu5"]. A range keeps the width
    of its first number ("[08-10]" -> 08, 09, 10); several bracket groups in one name multiply
    ("r[1-2]n[1-2]" -> r1n1, r1n2, r2n1, r2n2). Raises ValueError naming the list when it is malformed.
    """
    hosts = [host for item in _split_top_level(text) for host in _expand_item(item, text)]
    if not hosts:
        raise ValueError(f"empty SLURM host list {text!r}")
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in SLURM host list {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in SLURM host list {text!r}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in SLURM host list {text!r}")
    items.append(text[start:])
    for item in items:
        if not item.strip():
            raise ValueError(f"empty name in SLURM host list {text!r}")
    return [item.strip() for item in items]


def _expand_item(item: str, text: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    prefix, body, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    return [prefix + value + tail for value in _expand_range(body, text) for tail in _expand_item(rest, text)]


def _expand_range(body: str, text: str) -> list[str]:
    values = []
    for part in body.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(
                f"bad range [{body}] in SLURM host list {text!r}: expected numbers like [01-04,07]"
            )
        if not sep:
            values.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"descending range {part} in SLURM host list {text!r}")
        values.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return values


def _require(env: Mapping[str, str], keys: tuple[str, ...], launcher: str) -> None:
    missing = [k for k in keys if not env.get(k)]
    if missing:
        present = ", ".join(f"{k}={env[k]}" for k in keys if env.get(k))
        raise LaunchEnvError(
            f"{launcher} environment is incomplete: {', '.join(missing)} not set"
            + (f" (have {present})" if present else "")
        )


def _int(env: Mapping[str, str], key: str, minimum: int) -> int:
    try:
        value = int(env[key])
    except ValueError:
        raise LaunchEnvError(f"{key}={env[key]!r} is not a whole number") from None
    if value < minimum:
        raise LaunchEnvError(f"{key}={value} must be at least {minimum}")
    return value


def _rank(env: Mapping[str, str], key: str, world_key: str, world: int) -> int:
    rank = _int(env, key, minimum=0)
    if rank >= world:
        raise LaunchEnvError(f"{key}={rank} is outside {world_key}={world} (ranks are 0..{world - 1})")
    return rank


def _port(env: Mapping[str, str], key: str) -> int:
    port = _int(env, key, minimum=1)
    if port > 65535:
        raise LaunchEnvError(f"{key}={port} is not a TCP port (1-65535)")
    return port
