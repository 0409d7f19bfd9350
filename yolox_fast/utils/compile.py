"""torch.compile for the models: compiled in place, recompiles bounded, compile time reported apart.

Compiling is lazy: the first call at a new input shape, grad mode or train/eval mode traces and compiles a
graph; later calls that match reuse it. In training the first multi-scale size gets a static graph, the
second a graph with symbolic sizes that then serves every other size (tests/test_compile.py counts them).
The recompile limit is raised well above that anyway (past it torch would silently run the model eagerly),
and the counts are logged. The loss (SimOTA's data-dependent shapes) stays eager: `compile_module` excludes
the methods a module class names in `eager_under_compile` (`YOLOXHead._losses`) from compilation.

On a 2-core CPU (docs/training.md, "torch.compile") a compiled nano training step is slower than eager
(0.9x) and inference 1.1-1.2x faster after a minute or more of compiling, so it is off by default: the exp
field `compile` or the tools' `--compile` turn it on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from loguru import logger

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_module(
    module: torch.nn.Module,
    mode: str = "default",
    max_graphs: int = 16,
    backend: str = "inductor",
    dynamic: bool | None = None,
) -> torch.nn.Module:
    """Compile `module` in place (its state_dict keys unchanged, so checkpoints and the EMA are unaffected)
    with torch.compile `backend` ("inductor" generates kernels; "aot_eager" only traces, to check that a
    model compiles) and, for inductor, `mode`, allowing up to `max_graphs` graphs for its forward (input
    sizes x grad modes) before torch gives up and runs it eagerly. `dynamic`: torch.compile's (None: a
    second input size recompiles once with symbolic sizes that then serve every size; False: one static
    graph per size, quicker to build and run when there are only a few). Returns `module`."""
    if mode not in MODES:
        raise ValueError(f"compile mode must be one of {', '.join(MODES)}, got {mode!r}")
    if backend not in torch.compiler.list_backends(exclude_tags=()):
        raise ValueError(
            f"compile backend must be one of {', '.join(torch.compiler.list_backends())}, got {backend!r}"
        )
    keep_eager(module)
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, max_graphs)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * max_graphs)
    module.compile(backend=backend, mode=mode if backend == "inductor" else None, dynamic=dynamic)
    return module


def keep_eager(module: torch.nn.Module) -> None:
    """Exclude from compilation, once per class, the methods each submodule's class names in its
    `eager_under_compile` attribute: torch then runs them eagerly inside compiled graphs (a graph break)."""
    for cls in {type(m) for m in module.modules()}:
        for name in getattr(cls, "eager_under_compile", ()):
            method = getattr(cls, name)
            if not getattr(method, "_yolox_fast_eager", False):
                method = torch.compiler.disable(method)
                method._yolox_fast_eager = True
                setattr(cls, name, method)


@dataclass(frozen=True)
class CompileStats:
    """What compiling has cost so far in this process: graphs built, frames that fell back to eager and
    seconds spent compiling (forward and backward graphs)."""

    graphs: int
    fallbacks: int
    seconds: float

    def __str__(self) -> str:
        return f"{self.graphs} graphs compiled in {self.seconds:.1f} s, {self.fallbacks} eager fallbacks"

    @property
    def recompiles(self) -> int:
        """Graphs beyond the first: one per new input size or mode."""
        return max(self.graphs - 1, 0)


def compile_stats() -> CompileStats:
    """The process's compile counters (torch._dynamo's), for logs and tests."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    seconds = sum(compilation_time_metrics.get("_compile.compile_inner", [])) + sum(
        compilation_time_metrics.get("backward._backward_impl", [])
    )
    frames = counters["frames"]
    return CompileStats(
        graphs=int(counters["stats"]["unique_graphs"]),
        fallbacks=max(int(frames["total"]) - int(frames["ok"]), 0),
        seconds=float(seconds),
    )


def run_batch_sizes(num_images: int, batch_size: int) -> list[int]:
    """The batch sizes a pass over `num_images` in batches of `batch_size` runs: the batch, and the smaller
    last one if any (the graphs an inference warm-up has to build)."""
    return sorted({min(batch_size, num_images)} | ({num_images % batch_size} - {0}))


def compile_for_inference(
    module: torch.nn.Module,
    mode: str,
    warm_up: Callable[[int], object],
    batch_sizes: Iterable[int],
    backend: str = "inductor",
) -> CompileStats:
    """Compile `module` in place and build its graphs now, one `warm_up(batch_size)` call (a forward down the
    path the timed images take: same dtype, layout and autocast) per batch size, so that the images/s that
    follow leave compile time out; logs and returns what compiling cost."""
    sizes = sorted(set(batch_sizes))
    # static graphs: inference sees one or two batch sizes (the batch and a last, smaller one)
    compile_module(module, mode, max_graphs=2 * len(sizes) + 4, backend=backend, dynamic=False)
    for size in sizes:
        warm_up(size)
    stats = compile_stats()
    logger.info(f"torch.compile (mode {mode}) for batch sizes {sizes}: {stats}; not in the timings below")
    return stats


def compile_for_training(
    modules: Iterable[torch.nn.Module], mode: str, backend: str, input_sizes: int
) -> None:
    """Compile the training `modules` (the model and its EMA copy) in place, for a run that trains at
    `input_sizes` multi-scale sizes; the graphs build on first use."""
    # in place, before the DDP wrap (DDP then runs the compiled forward) and after the EMA's copy. The first
    # size gets a static graph, the second a symbolic-size one that serves the rest, eval mode its own; the
    # recompile limit is set far above that, so that no size can silently fall back to eager
    budget = 4 * (input_sizes + 1) + 8
    for module in modules:
        compile_module(module, mode, budget, backend)
    logger.info(
        f"torch.compile ({backend}, mode {mode}): graphs compile on first use, at most {budget}; their count "
        "and compile time are logged at each epoch's end"
    )
