"""The log-prob difference between an engine and a trainer over the same token sequences: its
maximum, mean and where in the responses it grows (:class:`LogprobDiff`). Plain Python: no torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def bucket_of(position: int) -> int:
    """The bucket of response position ``position`` (0-based): 0 holds position 0, bucket ``b > 0``
    positions ``2**(b-1)`` to ``2**b - 1`` (1, 2-3, 4-7, 8-15, ...), so early tokens are seen one by
    one and a long response still makes a handful of rows."""
    return position.bit_length()


def bucket_label(bucket: int) -> str:
    """``"0"``, ``"1"``, ``"2-3"``, ``"4-7"``, ... (the positions of :func:`bucket_of`'s bucket)."""
    if bucket <= 1:
        return str(bucket)
    return f"{2 ** (bucket - 1)}-{2 ** bucket - 1}"


@dataclass
class Bucket:
    """The absolute differences of the response positions of one bucket, over every sequence."""

    label: str
    tokens: int = 0
    total: float = 0.0
    max: float = 0.0

    @property
    def mean(self) -> float:
        return self.total / self.tokens if self.tokens else 0.0


@dataclass
class LogprobDiff:
    """``|engine - trainer|`` of every scored response token.

    :ivar max: the largest difference; :ivar mean: over every token.
    :ivar worst: ``(sequence, position)`` of the largest difference (0-based; position in the response).
    :ivar buckets: by response position (:func:`bucket_of`), in position order.
    """

    tokens: int = 0
    max: float = 0.0
    mean: float = 0.0
    worst: tuple[int, int] = (0, 0)
    buckets: list[Bucket] = field(default_factory=list)

    @classmethod
    def of(cls, engine: Sequence[Sequence[float]], trainer: Sequence[Sequence[float]]) -> LogprobDiff:
        """Compare per-sequence log-prob lists (``[sequences][response tokens]`` each); ``ValueError``
        naming the sequence when the two sides scored different numbers of tokens, or a value is
        not finite (NaN compares as a difference of infinity)."""
        if len(engine) != len(trainer):
            raise ValueError(f"the engine scored {len(engine)} sequences, the trainer {len(trainer)}")
        diff, by_bucket, total = cls(), {}, 0.0
        for index, (ours, theirs) in enumerate(zip(engine, trainer, strict=True)):
            if len(ours) != len(theirs):
                raise ValueError(f"sequence {index}: the engine scored {len(ours)} response tokens, the trainer "
                                 f"{len(theirs)}")
            for position, (a, b) in enumerate(zip(ours, theirs, strict=True)):
                gap = abs(a - b)
                if gap != gap:   # NaN on either side
                    gap = float("inf")
                bucket = by_bucket.setdefault(bucket_of(position), Bucket(bucket_label(bucket_of(position))))
                bucket.tokens += 1
                bucket.total += gap
                bucket.max = max(bucket.max, gap)
                total += gap
                diff.tokens += 1
                if gap > diff.max or diff.tokens == 1:
                    diff.max, diff.worst = gap, (index, position)
        diff.mean = total / diff.tokens if diff.tokens else 0.0
        diff.buckets = [by_bucket[key] for key in sorted(by_bucket)]
        return diff

    def lines(self, bound: float) -> list[str]:
        """The report: one summary line, then one line per position bucket."""
        verdict = "within" if self.within(bound) else "EXCEEDS"
        sequence, position = self.worst
        out = [f"log-prob |engine - trainer| over {self.tokens} response tokens: max {self.max:.3e} (sequence "
               f"{sequence}, response position {position}), mean {self.mean:.3e}: {verdict} the bound {bound:g}",
               "  by response position:   tokens        max       mean"]
        out += [f"  {bucket.label:>20} {bucket.tokens:>8} {bucket.max:>10.3e} {bucket.mean:>10.3e}"
                for bucket in self.buckets]
        return out

    def within(self, bound: float) -> bool:
        """Whether every token's difference is at most ``bound``."""
        return self.max <= bound


__all__ = ["Bucket", "LogprobDiff", "bucket_label", "bucket_of"]
