"""DatasetProblems: where the dataset readers report bad annotations, so one parser serves two uses.

Training reads with a strict log (the default): the first input it cannot use raises at once with a
message naming the file, line or annotation id. `tools/check_dataset.py` reads with a collecting log:
every problem is recorded (kind, severity, message) and the reader skips the bad item and goes on, so
one run lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ERROR = "error"
WARNING = "warning"


@dataclass
class ProblemKind:
    """All problems of one kind: how many, and the messages of the first `keep`."""

    severity: str
    count: int = 0
    examples: list[str] = field(default_factory=list)


class DatasetProblems:
    """Problems found while a dataset's annotations and images are read.

    Readers call `error(kind, message, exc)` for input training refuses (an unknown class, a malformed
    label line, a missing image): with `collect=False` that raises `exc(message)`; with `collect=True`
    it is recorded and the reader leaves the item out. `note(kind, message, severity)` is for input
    training tolerates (a box clipped to its image, a zero-size box dropped, an annotation naming no
    image): recorded when collecting, never raised. Each kind keeps a count and its first `keep`
    messages.
    """

    def __init__(self, collect: bool = False, keep: int = 5) -> None:
        self.collect = collect
        self.keep = keep
        self.kinds: dict[str, ProblemKind] = {}

    def error(self, kind: str, message: str, exc: type[Exception] = ValueError) -> None:
        """Input the reader cannot use: raise `exc(message)`, or record it when collecting."""
        if not self.collect:
            raise exc(message)
        self._record(kind, message, ERROR)

    def note(self, kind: str, message: str, severity: str = WARNING) -> None:
        """Input the reader tolerates (and handles as it always does); recorded only when collecting."""
        if self.collect:
            self._record(kind, message, severity)

    def _record(self, kind: str, message: str, severity: str) -> None:
        entry = self.kinds.setdefault(kind, ProblemKind(severity))
        entry.count += 1
        if len(entry.examples) < self.keep:
            entry.examples.append(message)

    def count(self, kind: str | None = None, severity: str | None = None) -> int:
        """Problems of `kind` (default: all kinds) and `severity` (default: both)."""
        return sum(
            k.count
            for name, k in self.kinds.items()
            if (kind is None or name == kind) and (severity is None or k.severity == severity)
        )

    @property
    def errors(self) -> int:
        return self.count(severity=ERROR)

    @property
    def warnings(self) -> int:
        return self.count(severity=WARNING)

    def first(self, kind: str) -> str | None:
        """The first message recorded for `kind`, if any."""
        entry = self.kinds.get(kind)
        return entry.examples[0] if entry and entry.examples else None
