"""Training steps the suites time: the model and batch of one (`step_inputs`), our step and official YOLOX
0.3.0's as each trainer runs it (`ours_step`, `official_step`: forward, loss, backward, SGD, EMA), and the
memory activation checkpointing saves at the peak of one (`grad_checkpoint_peak`)."""

from __future__ import annotations

import torch

from benchmarks.kit.inputs import random_batch
from benchmarks.kit.measure import CpuPeak, peak_bytes
from benchmarks.kit.official import with_rule_0_3_0
from yolox_fast.exp import get_exp
from yolox_fast.utils import amp
from yolox_fast.utils.ema import ModelEMA


def step_inputs(args, batch: int, device: torch.device, name: str = "yolox-nano"):
    """(model `name` in train mode, images (batch, 3, size, size) 0-255, targets) on `device`, seeded
    by `batch`; `args` gives num_classes and size."""
    exp = get_exp(exp_name=name)
    exp.num_classes = args.num_classes
    torch.manual_seed(0)
    # the trainer's layout: NHWC weights and images when exp.channels_last (the default)
    layout = torch.channels_last if exp.channels_last else torch.contiguous_format
    model = exp.get_model().to(device, memory_format=layout).train()
    imgs, targets = random_batch(batch, args.size, args.num_classes, device)
    return model, imgs.contiguous(memory_format=layout), targets


def grad_checkpoint_peak(
    args, batch: int, enabled: bool, device: torch.device, amp_dtype, name: str = "yolox-nano"
) -> int:
    """Extra memory (bytes) at the peak of one forward + backward at `batch`, checkpointing on or off."""
    model, imgs, targets = step_inputs(args, batch, device, name)
    model.set_grad_checkpointing(enabled)

    def step() -> None:
        with amp.autocast(device, amp_dtype):
            loss = model(imgs, targets)["total_loss"]
        loss.backward()
        model.zero_grad(set_to_none=False)

    step()  # gradients allocated, kernels chosen: the peak below is the activations'
    return peak_bytes(step, device, None if device.type == "cuda" else CpuPeak())


def official_step(device: torch.device, num_classes: int, amp_dtype, name: str = "yolox-nano"):
    """(model, a function doing one official training step on (imgs, targets))."""
    from yolox.exp import get_exp as official_get_exp
    from yolox.utils import ModelEMA as OfficialEMA

    exp = official_get_exp(None, name)
    exp.num_classes = num_classes
    model = exp.get_model().to(device).train()
    optimizer = exp.get_optimizer(64)
    ema = OfficialEMA(model, 0.9998)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype is torch.float16)

    def step(imgs, targets) -> None:
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            loss = model(imgs, targets)["total_loss"]
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        ema.update(model)

    return model, step


def ours_step(device: torch.device, num_classes: int, amp_dtype, state_dict, name: str = "yolox-nano"):
    """(model, a function doing one of our training steps on (imgs, targets)), from `state_dict`, with
    YOLOX 0.3.0's SimOTA rule: the same assignments as `official_step`'s, so the two time the same work."""
    exp = with_rule_0_3_0(get_exp(exp_name=name))
    exp.num_classes = num_classes
    model = exp.get_model()
    model.load_state_dict(state_dict)
    memory_format = torch.channels_last if exp.channels_last else torch.contiguous_format
    model.to(device, memory_format=memory_format).train()
    optimizer = exp.get_optimizer(64)
    ema = ModelEMA(model, 0.9998)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype is torch.float16)

    def step(imgs, targets) -> None:
        with amp.autocast(device, amp_dtype):
            loss = model(imgs.contiguous(memory_format=memory_format), targets)["total_loss"]
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        ema.update(model)

    return model, step
