"""Start a training function in one or many processes with torch.distributed.

Every launcher a cluster uses ends in one process group (`cluster_env` tells them apart):
- ``torchrun`` (also inside ``srun``): join with env:// or torchrun's agent store;
- RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set by something else (Kubeflow PyTorchJob, a
  script): join at MASTER_ADDR:MASTER_PORT;
- ``srun`` without torchrun: the same, with rank, world and address read from SLURM's variables;
- ``-d K`` on a plain ``python`` command: spawn K processes here (torch.multiprocessing);
- YOLOX's ``--num_machines M --machine_rank R --dist-url tcp://HOST:PORT``: spawn K processes on each
  of M machines started by hand.
``-d K`` under the RANK/WORLD_SIZE or srun launchers makes each launched process a "machine" that
spawns K workers (YOLOX's layout: machine = launched rank); under torchrun it is ignored.
NCCL on CUDA, gloo on CPU, unless a backend is named.

Every rank checks at the rendezvous that all ranks were started with the same world size and
distinct ranks (`agree_on_world`), so a misconfigured job stops with a message, not a hang.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from loguru import logger

from yolox_fast.core.cluster_env import ClusterEnv, LaunchEnvError, detect_cluster_env
from yolox_fast.utils.checkpoint import AGREED_RESTARTS_VAR, restart_count

DEFAULT_TIMEOUT = timedelta(minutes=30)
LAUNCHER_VAR = "YOLOX_FAST_LAUNCHER"  # what launched this process, for the trainer's summary
LAUNCHER_LABELS = {
    "torchrun": "torchrun",
    "env": "RANK/WORLD_SIZE environment (e.g. Kubeflow PyTorchJob)",
    "slurm": "srun (SLURM)",
    "spawn": "-d K (spawned here)",
    "yolox": "YOLOX --num_machines/--machine_rank/--dist-url",
}
_KEY = "yolox_fast/rendezvous"
ATTEMPT_PROBE_TIMEOUT = timedelta(seconds=3)  # per try to reach rank 0's store of this torchrun attempt


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def launcher_name() -> str:
    """How this process was launched: one of LAUNCHER_LABELS' values (maybe with "+ -d K"), or
    "single process"."""
    return os.environ.get(LAUNCHER_VAR, "single process")


def launch(
    main_func: Callable[..., Any],
    num_procs_per_machine: int | None,
    num_machines: int = 1,
    machine_rank: int = 0,
    backend: str | None = None,
    dist_url: str | None = None,
    args: Sequence[Any] = (),
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> Any:
    """Run ``main_func(*args)`` in every process of the job; returns its result when the job is this one
    process (None otherwise).

    ``num_procs_per_machine`` None (no -d): one process per launched process under torchrun, srun or
    RANK/WORLD_SIZE, else one per GPU (1 on CPU). ``main_func`` and ``args`` must be picklable (a
    module-level function and plain data) when processes are spawned. ``dist_url`` None or "auto"
    picks a free local port (one machine only).
    """
    backend = backend or default_backend()
    env = detect_cluster_env()
    if env.launcher == "torchrun":
        _warn_ignored_flags(env, num_procs_per_machine, num_machines)
        _announce(env, "torchrun")
        init = _torchrun_init(env.rank, env.world_size, timeout)
        _run_in_group(main_func, args, backend, init, env.rank, env.local_rank, env.world_size, timeout)
        return
    if env.world_size > 1:
        if num_machines == 1:
            _launch_from_env(main_func, args, backend, env, num_procs_per_machine or 1, timeout)
            return
        logger.info(f"--num_machines {num_machines} given: ignoring the {env.launcher} variables ({env.how})")
    elif env.how:  # e.g. an sbatch script without srun, WORLD_SIZE=1: say why this is not distributed
        logger.info(f"launcher: {env.describe()}")
    procs = num_procs_per_machine or max(1, torch.cuda.device_count())
    world_size = procs * num_machines
    if world_size <= 1:
        os.environ[LAUNCHER_VAR] = "single process"
        return main_func(*args)
    if dist_url in (None, "auto"):
        if num_machines > 1:
            raise ValueError("--dist-url tcp://HOST:PORT of machine 0 is required with --num_machines > 1")
        dist_url = f"tcp://127.0.0.1:{_free_port()}"
    kind = "yolox" if num_machines > 1 else "spawn"
    _spawn(main_func, args, backend, dist_url, machine_rank, procs, world_size, timeout, kind)


def _launch_from_env(main_func, args, backend, env: ClusterEnv, procs: int, timeout: timedelta) -> None:
    """srun or RANK/WORLD_SIZE: this process is a rank (procs 1) or a machine that spawns `procs`."""
    url = f"tcp://{_url_host(env.master_addr)}:{env.master_port}"
    if procs > 1:
        if env.local_rank != 0:
            raise LaunchEnvError(
                f"-d {procs} makes each {env.launcher} process spawn {procs} workers, so start one process "
                f"per machine (srun --ntasks-per-node 1); this one has local rank {env.local_rank}"
            )
        logger.info(
            f"launcher: {env.describe()}; -d {procs}: machine {env.rank} of {env.world_size} "
            f"spawns {procs} workers"
        )
        _spawn(main_func, args, backend, url, env.rank, procs, env.world_size * procs, timeout, env.launcher)
        return
    _announce(env, env.launcher)
    if env.local_rank_assumed and torch.cuda.is_available() and torch.cuda.device_count() > 1:
        logger.warning(
            f"this process sees {torch.cuda.device_count()} GPUs and uses one: start one process per GPU "
            "(LOCAL_RANK set, torchrun, or srun --ntasks-per-node) or pass -d to spawn one per GPU"
        )
    # the variables torchrun sets, so that code below (dist helpers, loaders) sees one convention
    os.environ.update(
        RANK=str(env.rank),
        WORLD_SIZE=str(env.world_size),
        LOCAL_RANK=str(env.local_rank),
        MASTER_ADDR=str(env.master_addr),
        MASTER_PORT=str(env.master_port),
    )
    _run_in_group(main_func, args, backend, url, env.rank, env.local_rank, env.world_size, timeout)


def _warn_ignored_flags(env: ClusterEnv, procs: int | None, num_machines: int) -> None:
    if procs is not None and procs > 1 and procs != env.local_world_size:
        logger.warning(
            f"-d {procs} is ignored under torchrun: it started {env.local_world_size} processes "
            "on this machine"
        )
    if num_machines > 1:
        logger.warning(f"--num_machines {num_machines} is ignored under torchrun: it set WORLD_SIZE")


def _announce(env: ClusterEnv, kind: str) -> None:
    os.environ[LAUNCHER_VAR] = LAUNCHER_LABELS[kind]
    logger.info(f"launcher: {env.describe()}")


def _spawn(main_func, args, backend, dist_url, machine_rank, procs, world_size, timeout, kind) -> None:
    label = LAUNCHER_LABELS[kind]
    os.environ[LAUNCHER_VAR] = label if kind in ("spawn", "yolox") else f"{label} + -d {procs}"
    context = mp.start_processes(
        _spawned_worker,
        nprocs=procs,
        args=(main_func, args, backend, dist_url, machine_rank, procs, world_size, timeout),
        daemon=False,
        join=False,
        start_method="spawn",
    )
    # `kill PID` on this parent reaches every worker, so each saves and exits as under torchrun. Ctrl-C
    # already reaches them all (same process group): forwarding it would count as a second signal.
    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, _forward_to(context)),
        signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
    }
    try:
        while not context.join():
            pass
    except mp.ProcessExitedException as err:
        if err.exit_code is not None and err.exit_code > 0:
            # a worker exited on purpose (e.g. 128 + signal after saving): pass its code on, no traceback
            raise SystemExit(err.exit_code) from None
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _forward_to(context) -> Callable[[int, Any], None]:
    def forward(signum: int, frame: Any) -> None:
        for proc in context.processes:
            if proc.is_alive():
                os.kill(proc.pid, signum)

    return forward


def _spawned_worker(
    local_rank: int,
    main_func: Callable[..., Any],
    args: Sequence[Any],
    backend: str,
    dist_url: str,
    machine_rank: int,
    procs_per_machine: int,
    world_size: int,
    timeout: timedelta,
) -> None:
    rank = machine_rank * procs_per_machine + local_rank
    # the same variables torchrun sets, so code below (dist helpers, loaders) sees one convention
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(procs_per_machine),
        GROUP_RANK=str(machine_rank),
    )
    if not torch.cuda.is_available() and "OMP_NUM_THREADS" not in os.environ:
        # K CPU processes on one machine: split the cores this process may use (SLURM and containers
        # bind fewer than os.cpu_count()) instead of oversubscribing them K times; an explicit
        # OMP_NUM_THREADS is the user's choice and wins
        torch.set_num_threads(max(1, _usable_cpus() // procs_per_machine))
    _run_in_group(main_func, args, backend, dist_url, rank, local_rank, world_size, timeout)


def _torchrun_init(rank: int, world_size: int, timeout: timedelta):
    """env://, or under torchrun's agent store a store private to this restart attempt.

    Workers of every attempt talk to the same agent-hosted TCPStore, so keys of a dead attempt stay
    there: a restarted rank could read the address a dead rank published and fail to connect (seen
    with gloo after killing a rank under --max-restarts). A prefix per TORCHELASTIC_RESTART_COUNT is
    not enough: an agent whose workers were healthy restarts them for another machine's failure
    without counting it, so two machines can be at different counts (seen with two agents: a hang).
    Instead rank 0 starts a fresh store for each attempt and publishes its address with a random
    nonce through the agent store; the other ranks retry until they reach a store with that nonce.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or world_size == 1:
        return "env://"
    agent = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=timeout,
    )
    key = "yolox_fast/attempt_store"
    if rank == 0:
        fresh = dist.TCPStore(
            os.environ["MASTER_ADDR"], 0, None, is_master=True, timeout=timeout, wait_for_workers=False
        )
        nonce = uuid.uuid4().hex
        fresh.set(f"{key}/nonce", nonce)
        agent.set(key, f"{fresh.port} {nonce}")
        return dist.PrefixStore("yolox_fast/pg", fresh)
    deadline = time.monotonic() + timeout.total_seconds()
    while time.monotonic() < deadline:
        port, nonce = agent.get(key).decode().split()
        # a stale address (a dead attempt's) has a closed port, or another nonce if the port was reused
        if _accepts_connections(os.environ["MASTER_ADDR"], int(port)):
            try:
                fresh = dist.TCPStore(
                    os.environ["MASTER_ADDR"], int(port), None, is_master=False, timeout=ATTEMPT_PROBE_TIMEOUT
                )
                if fresh.get(f"{key}/nonce").decode() == nonce:
                    fresh.set_timeout(timeout)
                    return dist.PrefixStore("yolox_fast/pg", fresh)
            except RuntimeError:
                pass
        time.sleep(0.2)
    raise LaunchEnvError(f"rank {rank}: rank 0 did not publish this attempt's store within {timeout}")


def _run_in_group(main_func, args, backend, init, rank, local_rank, world_size, timeout) -> None:
    """`init` is a Store, a tcp:// URL (joined through `rendezvous_store`) or another init_method URL."""
    if torch.cuda.is_available():
        torch.cuda.set_device(cuda_index(local_rank))
    if world_size > 1:
        if isinstance(init, str) and init.startswith("tcp://"):
            url = urlparse(init)
            init = rendezvous_store(url.hostname, url.port, rank, world_size, timeout)
        where = {"store": init} if isinstance(init, dist.Store) else {"init_method": init}
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout, **where)
        _agree_on_restarts(backend)
    try:
        main_func(*args)
    finally:
        if dist.is_initialized():
            # DDP's reducer holds the process group: a model left in a reference cycle would free it in
            # the interpreter's final collection, where gloo's worker threads can no longer take the GIL
            # and the process aborts (SIGABRT, "terminate called without an active exception") instead
            # of exiting with its code; collected now, the group goes while everything is alive
            gc.collect()
            dist.destroy_process_group()


def _agree_on_restarts(backend: str) -> None:
    """Every rank takes the highest restart count of any rank (see checkpoint.restart_count): after
    another machine's failure a torchrun agent restarts its healthy workers without counting it, and
    ranks that disagree on "is this a restart" would resume from different epochs."""
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    count = torch.tensor([restart_count()], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    os.environ[AGREED_RESTARTS_VAR] = str(int(count.item()))


def cuda_index(local_rank: int, count: int | None = None) -> int:
    """The GPU of local rank `local_rank` among the `count` this process sees (default: all visible).

    One visible GPU means the launcher bound one GPU to this process (srun --gpus-per-task 1, a pod
    with one GPU): use it whatever the local rank.
    """
    count = torch.cuda.device_count() if count is None else count
    if local_rank < count:
        return local_rank
    if count == 1:
        return 0
    raise LaunchEnvError(
        f"local rank {local_rank} but this process sees {count} GPUs (CUDA_VISIBLE_DEVICES="
        f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): start at most {count} processes per machine"
    )


def rendezvous_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    """The TCPStore at host:port (hosted by rank 0) after every rank agreed on the world size; what
    env:// builds from MASTER_ADDR/MASTER_PORT, plus that check."""
    try:
        store = dist.TCPStore(host, port, None, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
    except RuntimeError as err:  # DistNetworkError: port in use, host unreachable
        role = f"rank 0 could not listen on port {port}" if rank == 0 else f"could not reach {host}:{port}"
        raise LaunchEnvError(
            f"rendezvous: {role} ({str(err).splitlines()[0]}); is another job using MASTER_PORT {port}? "
            "set MASTER_PORT to a free port (the same on every process)"
        ) from err
    agree_on_world(store, rank, world_size, timeout, f"{host}:{port}")
    return dist.PrefixStore("yolox_fast/pg", store)


def agree_on_world(
    store: dist.Store, rank: int, world_size: int, timeout: timedelta, where: str = "the rendezvous"
) -> None:
    """Wait until ranks 0..world_size-1 have checked in; raise LaunchEnvError on every rank present as
    soon as two ranks disagree on the world size or two processes claim one rank.

    A rank that finds a problem publishes it under an error key so that the others stop too instead
    of waiting for ranks that will never come.
    """
    error_key = f"{_KEY}/error"

    def fail(message: str) -> None:
        store.set(error_key, message)
        if rank == 0:
            time.sleep(1.0)  # rank 0 hosts the store: give the others a moment to read the message
        raise LaunchEnvError(message)

    if store.add(f"{_KEY}/claims/{rank}", 1) > 1:
        fail(f"two processes were started as rank {rank} (at {where}): every process needs its own rank")
    store.set(f"{_KEY}/world/{rank}", str(world_size))
    pending = set(range(world_size))
    start = time.monotonic()
    next_note = start + 10
    try:
        while pending:
            if store.check([error_key]):
                raise LaunchEnvError(store.get(error_key).decode())
            for other in sorted(pending):
                key = f"{_KEY}/world/{other}"
                if not store.check([key]):
                    continue
                pending.discard(other)
                theirs = int(store.get(key))
                if theirs != world_size:
                    fail(
                        f"the processes disagree on the world size: rank {rank} was started with "
                        f"{world_size} processes, rank {other} with {theirs} (WORLD_SIZE, SLURM_NTASKS, or "
                        f"-d x --num_machines must be the same everywhere; rendezvous {where})"
                    )
            if not pending:
                break
            now = time.monotonic()
            if now - start > timeout.total_seconds():
                fail(
                    f"ranks {sorted(pending)} of {world_size} did not join the rendezvous at {where} within "
                    f"{timeout}; were all {world_size} processes started?"
                )
            if now > next_note:
                logger.info(f"rank {rank}: waiting for ranks {sorted(pending)} of {world_size} at {where}")
                next_note = now + 60
            time.sleep(0.05)
    except RuntimeError as err:  # DistError and the store's connection: LaunchEnvError passes through
        raise LaunchEnvError(f"lost the rendezvous at {where} (did rank 0 stop?): {err}") from err


def _url_host(host: str | None) -> str:
    return f"[{host}]" if host and ":" in host else str(host)


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):  # Linux: the CPUs this process may run on
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _accepts_connections(host: str, port: int) -> bool:
    """A plain TCP connect: cheaper and quieter than a TCPStore client, which logs every failed try."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
