"""What the loop (:func:`plasmid.loop.train`) writes each step to: the :class:`StepLog` protocol.

The kernel declares it and never builds one: whoever runs the loop passes its log in
(``plasmid train`` passes the run directory's ``metrics.jsonl`` writer, :class:`RunLog` of the
application; a test may pass anything with these three methods). The loop calls them in this order:

1. :meth:`StepLog.resume_from` once, before the first step, with the step the run starts at
   (0, or the step after the checkpoint a ``--resume`` continues from);
2. :meth:`StepLog.write` once per finished step, after its metrics are complete and the observer
   hook :func:`~plasmid.hookspecs.plasmid_metrics` has seen them; what it returns is handed to
   :func:`~plasmid.hookspecs.plasmid_step_end`;
3. :meth:`StepLog.make_durable` before each checkpoint is written, so that a checkpoint never
   outlives the entries of the steps it holds.

Closing the log is its owner's business, not the loop's.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class StepLog(Protocol):
    """The per-step log the loop writes (see the module docstring for when each method is called)."""

    def resume_from(self, first_step: int) -> None:
        """Keep only the entries of the steps before ``first_step``; the loop starts there."""
        ...

    def write(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Record step ``step``'s ``metrics``; the entry as recorded (the observer hooks get it)."""
        ...

    def make_durable(self) -> None:
        """Make every entry written so far survive a crash (a checkpoint is about to be written)."""
        ...


__all__ = ["StepLog"]
