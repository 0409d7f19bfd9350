"""Start a training function in one or many processes with torch.distributed.

Three ways in, one process group out:
- under ``torchrun`` (RANK / WORLD_SIZE / LOCAL_RANK in the environment): join with ``env://``;
- ``-d K`` on a plain ``python`` command: spawn K processes here (torch.multiprocessing);
- YOLOX's ``--num_machines M --machine_rank R --dist-url tcp://HOST:PORT``: spawn K processes on each
  of M machines started by hand.
NCCL on CUDA, gloo on CPU, unless a backend is named.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from loguru import logger

DEFAULT_TIMEOUT = timedelta(minutes=30)


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def under_torchrun() -> bool:
    """True when torchrun (or another env:// launcher) started this process."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"))


def launch(
    main_func: Callable[..., Any],
    num_procs_per_machine: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    backend: str | None = None,
    dist_url: str | None = None,
    args: Sequence[Any] = (),
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> None:
    """Run ``main_func(*args)`` in every process of the job.

    ``main_func`` and ``args`` must be picklable (a module-level function and plain data) when
    processes are spawned. ``dist_url`` None or "auto" picks a free local port (one machine only).
    """
    backend = backend or default_backend()
    if under_torchrun():
        world_size = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
        if num_procs_per_machine > 1 and num_procs_per_machine != int(
            os.environ.get("LOCAL_WORLD_SIZE", "1")
        ):
            logger.warning(
                f"-d {num_procs_per_machine} is ignored under torchrun: "
                f"it started {os.environ.get('LOCAL_WORLD_SIZE')} processes on this machine"
            )
        rank = int(os.environ["RANK"])
        _run_in_group(
            main_func,
            args,
            backend,
            _torchrun_init(world_size, timeout),
            rank,
            local_rank,
            world_size,
            timeout,
        )
        return

    world_size = num_procs_per_machine * num_machines
    if world_size <= 1:
        main_func(*args)
        return
    if dist_url in (None, "auto"):
        if num_machines > 1:
            raise ValueError("--dist-url tcp://HOST:PORT of machine 0 is required with --num_machines > 1")
        dist_url = f"tcp://127.0.0.1:{_free_port()}"
    context = mp.start_processes(
        _spawned_worker,
        nprocs=num_procs_per_machine,
        args=(main_func, args, backend, dist_url, machine_rank, num_procs_per_machine, world_size, timeout),
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
    if not torch.cuda.is_available():
        # K CPU processes on one machine: split the cores instead of oversubscribing them K times
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // procs_per_machine))
    _run_in_group(main_func, args, backend, dist_url, rank, local_rank, world_size, timeout)


def _torchrun_init(world_size: int, timeout: timedelta):
    """env://, or under torchrun's agent store a view of it private to this restart attempt.

    Workers of every attempt talk to the same agent-hosted TCPStore; without a per-attempt prefix a
    restarted rank can read the address a dead rank of the previous attempt published and fail to
    connect (seen with gloo after killing a rank under --max-restarts).
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or world_size == 1:
        return "env://"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=timeout,
    )
    return dist.PrefixStore(f"yolox_fast/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def _run_in_group(main_func, args, backend, init, rank, local_rank, world_size, timeout) -> None:
    """`init` is an init_method URL or a Store."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    if world_size > 1:
        where = {"store": init} if isinstance(init, dist.Store) else {"init_method": init}
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout, **where)
    try:
        main_func(*args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
