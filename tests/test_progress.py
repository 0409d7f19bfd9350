"""utils/progress.Progress: whole log lines (no carriage returns), at most one per 10 % of the work."""

from yolox_fast.utils.progress import Progress


def test_progress_logs_at_most_a_line_per_ten_percent_and_the_last(log_lines):
    progress = Progress("eval", 1000, every=0.0)
    for _ in range(1000):
        progress.step()
    assert 2 <= len(log_lines) <= 11
    assert log_lines[-1].startswith("eval [########################] 1000/1000")
    assert not any("\r" in line for line in log_lines)


def test_progress_is_silent_when_disabled(log_lines):
    progress = Progress("eval", 10, every=0.0, enabled=False)
    for _ in range(10):
        progress.step()
    assert log_lines == []
