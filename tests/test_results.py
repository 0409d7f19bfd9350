"""results.csv / results.png (core/results.py): one row per epoch with the epoch's mean losses, its last lr,
the APs when evaluated, its time; a resumed run keeps the epochs its checkpoint had, redoes the rest."""

import csv

import pytest

from yolox_fast.core.results import COLUMNS, EpochResults, read_results


def _epoch(results: EpochResults, epoch: int, losses: list[float], ap=None) -> None:
    for value in losses:
        results.add_step({"total_loss": value, "iou_loss": value / 2, "l1_loss": 0.0, "conf_loss": 1.0})
    results.end_epoch(epoch, lr=0.01 / epoch, ap=ap, seconds=12.34)


def test_results_csv_has_a_row_per_epoch_with_each_column(tmp_path):
    results = EpochResults(str(tmp_path), done_epochs=0)
    _epoch(results, 1, [4.0, 2.0])
    _epoch(results, 2, [1.0, 3.0], ap=(0.25, 0.5))
    with open(tmp_path / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS
    assert [r["epoch"] for r in rows] == ["1", "2"]
    assert float(rows[0]["total_loss"]) == 3.0 and float(rows[1]["iou_loss"]) == 1.0  # means over the epoch
    assert rows[0]["cls_loss"] == ""  # a loss the model did not report
    assert (rows[0]["AP50_95"], rows[0]["AP50"]) == ("", "")  # not evaluated
    assert (float(rows[1]["AP50_95"]), float(rows[1]["AP50"])) == (0.25, 0.5)
    assert float(rows[1]["lr"]) == 0.005 and rows[1]["time_s"] == "12.3"
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_resume_keeps_the_finished_epochs_and_rewrites_the_later_ones(tmp_path):
    first = EpochResults(str(tmp_path), done_epochs=0)
    for epoch in (1, 2, 3):
        _epoch(first, epoch, [float(epoch)])
    # killed during epoch 4 after its checkpoint at the end of epoch 2 (kill -9 keeps no later one)
    resumed = EpochResults(str(tmp_path), done_epochs=2)
    _epoch(resumed, 3, [30.0], ap=(0.1, 0.2))
    rows = read_results(str(tmp_path / "results.csv"))
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert [r["total_loss"] for r in rows] == [1.0, 2.0, 30.0]  # epoch 3 replaced, not repeated
    assert rows[2]["AP50"] == pytest.approx(0.2)


def test_other_ranks_write_nothing(tmp_path):
    results = EpochResults(str(tmp_path), done_epochs=0, enabled=False)
    _epoch(results, 1, [1.0])
    assert not (tmp_path / "results.csv").exists()
