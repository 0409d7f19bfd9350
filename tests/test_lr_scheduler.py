"""LRScheduler: the YOLOX schedule's shape, its boundaries, and that it is a pure function of the
iteration."""

import math
from itertools import pairwise

import pytest

from yolox_fast.utils.lr_scheduler import LRScheduler

LR, IPE, EPOCHS, WARM, NO_AUG, MIN_RATIO, START = 0.04, 10, 20, 2, 3, 0.05, 0.001


def yolox_sched(**kw):
    args = {
        "warmup_epochs": WARM,
        "warmup_lr_start": START,
        "no_aug_epochs": NO_AUG,
        "min_lr_ratio": MIN_RATIO,
    }
    args.update(kw)
    return LRScheduler("yoloxwarmcos", LR, IPE, EPOCHS, **args)


def test_warmup_is_quadratic_from_start_to_lr():
    s = yolox_sched()
    assert s.update_lr(0) == pytest.approx(START)
    assert s.update_lr(WARM * IPE // 2) == pytest.approx(START + (LR - START) * 0.25)
    assert s.update_lr(WARM * IPE) == pytest.approx(LR)


def test_cosine_reaches_min_lr_where_no_aug_epochs_begin_and_stays_there():
    s = yolox_sched()
    cos_end = (EPOCHS - NO_AUG) * IPE
    mid = (WARM * IPE + cos_end) / 2
    assert s.update_lr(int(mid)) == pytest.approx(LR * MIN_RATIO + 0.5 * (LR - LR * MIN_RATIO))
    assert s.update_lr(cos_end - 1) > LR * MIN_RATIO
    for it in range(cos_end, EPOCHS * IPE + 5):
        assert s.update_lr(it) == pytest.approx(LR * MIN_RATIO)


def test_schedule_is_continuous_and_decreasing_after_warmup():
    s = yolox_sched()
    values = [s.update_lr(i) for i in range(EPOCHS * IPE)]
    after = values[WARM * IPE :]
    assert all(b <= a + 1e-12 for a, b in pairwise(after))
    # no jump bigger than the steepest cosine step anywhere, warmup boundary included
    max_step = max(abs(b - a) for a, b in pairwise(values))
    assert max_step < 2 * (LR - START) / (WARM * IPE)


def test_pure_function_of_iteration():
    a, b = yolox_sched(), yolox_sched()
    forward = [a.update_lr(i) for i in range(EPOCHS * IPE)]
    backward = [b.update_lr(i) for i in reversed(range(EPOCHS * IPE))][::-1]
    assert forward == backward


def test_no_warmup_starts_at_lr():
    s = yolox_sched(warmup_epochs=0)
    assert s.update_lr(0) == pytest.approx(LR)


def test_multistep_divides_at_milestones():
    s = LRScheduler("multistep", 0.1, IPE, EPOCHS, milestones=[5, 8], gamma=0.1)
    assert s.update_lr(5 * IPE - 1) == pytest.approx(0.1)
    assert s.update_lr(5 * IPE) == pytest.approx(0.01)
    assert s.update_lr(8 * IPE) == pytest.approx(0.001)


def test_cos_and_warmcos_end_points():
    cos = LRScheduler("cos", 0.1, IPE, EPOCHS)
    assert cos.update_lr(0) == pytest.approx(0.1)
    assert cos.update_lr(EPOCHS * IPE // 2) == pytest.approx(0.05)
    assert cos.update_lr(EPOCHS * IPE) == pytest.approx(0.0, abs=1e-12)
    warm = LRScheduler("warmcos", 0.1, IPE, EPOCHS, warmup_epochs=1, warmup_lr_start=0.0, min_lr_ratio=0.1)
    assert warm.update_lr(IPE // 2) == pytest.approx(0.05)
    assert warm.update_lr(EPOCHS * IPE) == pytest.approx(0.01)
    assert math.isclose(warm.update_lr(IPE), 0.1)


def test_unknown_name_and_missing_milestones_are_errors():
    with pytest.raises(ValueError, match="unknown lr scheduler"):
        LRScheduler("linear", 0.1, IPE, EPOCHS)
    with pytest.raises(ValueError, match="milestones"):
        LRScheduler("multistep", 0.1, IPE, EPOCHS)
