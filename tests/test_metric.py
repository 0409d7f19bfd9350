"""utils/metric.py: the device probes of a measurement."""

import torch

from yolox_fast.utils.metric import sync_device


def test_sync_device_waits_for_cuda_work_and_leaves_a_cpu_alone(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
    sync_device(torch.device("cpu"))
    sync_device(torch.device("cuda", 1))
    assert synced == [torch.device("cuda", 1)]
