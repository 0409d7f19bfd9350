"""NonFiniteGuard: a training step whose loss or gradient is not finite is not applied, and weights that are
not finite are never saved.

One step's story: `snapshot_bn()` copies the BatchNorm statistics before the forward passes (which fold the
step's batches into them; several with gradient accumulation); after the last backward `check_step()` asks
every rank at once whether its loss or gradients are finite and whether a stop signal arrived (one
collective, one host sync); a bad step is `skip_step()`-ed: its statistics are put back, it is counted, and
MAX_NONFINITE_STREAK in a row stop the run naming the checkpoints that hold good weights. `check_weights()`
runs before every checkpoint is written.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from loguru import logger
from torch import nn

from yolox_fast.utils.checkpoint import load_checkpoint

MAX_NONFINITE_STREAK = 10  # consecutive non-finite losses before training stops


def bn_buffers(model: nn.Module) -> list[torch.Tensor]:
    """The running statistics of every BatchNorm that tracks them (restored after a skipped step)."""
    return [
        buf
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
        for buf in (m.running_mean, m.running_var, m.num_batches_tracked)
    ]


class NonFiniteGuard:
    """The non-finite checks of one run: `model` (unwrapped), its trainable `params`, the loss `scaler`,
    whether the run is distributed, and the output folder whose checkpoints a failure names."""

    def __init__(
        self, model: nn.Module, params: list[torch.Tensor], scaler, is_distributed: bool, output_dir: str
    ) -> None:
        self.params = params
        self.scaler = scaler
        self.is_distributed = is_distributed
        self.output_dir = output_dir
        self.streak = 0
        self._bn_stats = bn_buffers(model)
        self._bn_backup = [b.clone() for b in self._bn_stats]

    def snapshot_bn(self) -> None:
        torch._foreach_copy_(self._bn_backup, self._bn_stats)

    def restore_bn(self) -> None:
        """Put back the statistics of the last `snapshot_bn` (the step's forward passes folded theirs in)."""
        torch._foreach_copy_(self._bn_stats, self._bn_backup)

    def check_step(self, loss: torch.Tensor, stop_requested: bool) -> tuple[bool, bool, bool]:
        """(non-finite loss on some rank, non-finite gradient, a stop signal on some rank), agreed by all
        ranks in one collective: a rank that skipped the step while others took it would hang DDP.

        Gradients are identical on every rank after DDP's all-reduce, so one rank's NaN loss makes every
        rank's gradients non-finite: the whole step is skipped everywhere.
        """
        grads = [p.grad for p in self.params if p.grad is not None]
        grads_finite = torch.stack(torch._foreach_norm(grads, float("inf"))).isfinite().all()
        flags = torch.stack(
            [
                (~torch.isfinite(loss.detach())).float(),
                (~grads_finite).float(),
                torch.tensor(float(stop_requested), device=loss.device),
            ]
        )
        if self.is_distributed:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        bad_loss, bad_grads, stop = flags.tolist()
        return bool(bad_loss), bool(bad_grads), bool(stop)

    def step_ok(self) -> None:
        self.streak = 0

    def skip_step(self, losses: dict[str, float], bad_loss: bool, epoch: int, it: int) -> None:
        """A step with a non-finite loss or gradient is not applied (its BN statistics are put back);
        MAX_NONFINITE_STREAK in a row stop the run, fp16 overflows at a loss scale >= 1 aside. `losses`:
        the step's named losses for the warning; epoch and it are 0-based."""
        # the step's forward passes folded their batches into the BN statistics: a step not applied gives
        # them back, so that weights, EMA and statistics all stay those of the last applied step
        self.restore_bn()
        if not bad_loss and self.scaler.is_enabled() and self.scaler.get_scale() >= 1.0:
            # fp16 overflow at a loss scale >= 1: the scaler's own business (it halves the scale), neither
            # a warning nor a step towards the stop
            logger.debug(
                f"fp16 gradient overflow at epoch {epoch + 1} iter {it + 1}, loss scale "
                f"{self.scaler.get_scale():g}: step skipped"
            )
            return
        self.streak += 1
        values = ", ".join(f"{k} {v:.4g}" for k, v in losses.items())
        what = "loss" if bad_loss else "gradient (the loss was finite)"
        logger.warning(
            f"non-finite {what} at epoch {epoch + 1} iter {it + 1} ({values}): step not applied "
            f"({self.streak}/{MAX_NONFINITE_STREAK} in a row)"
        )
        if self.streak >= MAX_NONFINITE_STREAK:
            raise RuntimeError(
                f"training stopped: the loss or its gradient was non-finite for {MAX_NONFINITE_STREAK} "
                f"iterations in a row (epoch {epoch + 1}, iter {it + 1}); nothing was saved "
                f"from the diverged weights. {self.last_good_checkpoints()} Try a lower learning rate "
                "(basic_lr_per_img), a longer warmup, clip_grad_norm 10, or --bf16 instead of --fp16."
            )

    def check_weights(self, states: list[dict[str, torch.Tensor]], name: str, epoch: int) -> None:
        """Raise, on every rank together, when a tensor of `states` (the model's, the EMA's) is not finite:
        `<name>_ckpt.pth` is then not written, and the message names the files with good weights."""
        named = [(k, t) for state in states for k, t in state.items() if t.is_floating_point()]
        finite = torch.stack(torch._foreach_norm([t for _, t in named], float("inf"))).isfinite()
        all_finite = finite.all().float()
        if self.is_distributed:
            dist.all_reduce(all_finite, op=dist.ReduceOp.MIN)
        if bool(all_finite):
            return
        bad = [k for (k, _), ok in zip(named, finite.tolist()) if not ok]
        raise RuntimeError(
            f"the weights became non-finite at epoch {epoch + 1} ({len(bad)} of {len(named)} tensors, "
            f"e.g. {bad[0] if bad else 'on another rank'}): {name}_ckpt.pth was not written. "
            f"{self.last_good_checkpoints()} Try a lower learning rate (basic_lr_per_img), a longer warmup "
            "or clip_grad_norm 10."
        )

    def last_good_checkpoints(self) -> str:
        """Where the last good weights are: a sentence naming the files and their positions."""
        found = []
        for name in ("latest", "best"):
            path = os.path.join(self.output_dir, f"{name}_ckpt.pth")
            if os.path.isfile(path):
                ckpt = load_checkpoint(path)
                found.append(f"{path} (resumes at epoch {int(ckpt['start_epoch']) + 1})")
        if not found:
            return "No checkpoint had been written before the divergence."
        return "The last good weights are in " + " and ".join(found) + "."
