"""ModelEMA: the YOLOX decay ramp, the averaging formula, and the update count surviving a checkpoint."""

import math

import pytest
import torch
from torch import nn

from yolox_fast.utils.ema import ModelEMA


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.SiLU())


def test_decay_ramps_up_as_yolox():
    ema = ModelEMA(small_model(), decay=0.9998)
    assert ema.decay(0) == 0.0
    assert ema.decay(2000) == pytest.approx(0.9998 * (1 - math.exp(-1)))
    assert ema.decay(100_000) == pytest.approx(0.9998, abs=1e-12)


def test_update_is_the_exponential_average_of_weights_and_buffers():
    model = small_model()
    ema = ModelEMA(model, decay=0.9, updates=5000)
    before = {k: v.clone() for k, v in ema.ema.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
        model[1].running_mean.add_(2.0)
        model[1].num_batches_tracked += 7
    ema.update(model)
    d = ema.decay(5001)
    now = ema.ema.state_dict()
    src = model.state_dict()
    for k, v in now.items():
        if v.dtype.is_floating_point:
            torch.testing.assert_close(v, d * before[k] + (1 - d) * src[k])
        else:
            assert torch.equal(v, src[k])  # integer buffers are copied, not averaged
    assert ema.updates == 5001


def test_ema_is_a_frozen_copy():
    model = small_model()
    ema = ModelEMA(model)
    assert all(not p.requires_grad for p in ema.ema.parameters())
    assert not ema.ema.training
    assert ema.ema[0].weight.data_ptr() != model[0].weight.data_ptr()


def test_unwraps_data_parallel():
    model = small_model()
    ema = ModelEMA(nn.DataParallel(model))
    ema.update(nn.DataParallel(model))
    assert set(ema.ema.state_dict()) == set(model.state_dict())


def test_state_round_trip_keeps_update_count_and_weights():
    model = small_model()
    ema = ModelEMA(model, ramp=400.0)
    for _ in range(3):
        with torch.no_grad():
            model[0].weight.mul_(1.5)
        ema.update(model)
    restored = ModelEMA(small_model())
    restored.load_state_dict(ema.state_dict(), ema.ema.state_dict())
    assert restored.updates == 3 and restored.ramp == 400.0
    for (k, a), b in zip(ema.ema.state_dict().items(), restored.ema.state_dict().values()):
        assert torch.equal(a, b), k
