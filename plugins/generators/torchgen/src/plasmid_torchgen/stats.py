"""Counters of what the engine did since it was built (read with ``TorchEngine.stats()``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class EngineStats:
    """Cumulative counters; a rollout driver diffs two readings to get one step's numbers.

    The engine's totals are written only on its event loop (the worker thread counts each
    step apart and the loop adds the step's counts in), so a reading is always consistent.

    :ivar requests: requests answered, whatever their status.
    :ivar aborted: of those, answered ``ABORTED``.
    :ivar prompt_tokens: prompt tokens prefilled (padding excluded), each distinct prompt of a
        prefill pass once.
    :ivar shared_prompt_tokens: prompt tokens of requests that shared another request's prompt in
        the same prefill pass, so were not computed again (see ``Decoder.prefill``).
    :ivar generated_tokens: response tokens sampled.
    :ivar batches: prefill passes: groups of requests admitted together (one per wave of
        concurrent ``generate`` calls; a group joins the running batch, if any).
    :ivar decode_steps: forward passes that extended every running row by one token.
    :ivar forward_rows: rows summed over all forward passes (prefills and decode steps).
    :ivar max_batch_size: most rows in one forward pass.
    :ivar busy_seconds: wall-clock seconds spent in forward passes and sampling.
    :ivar graph_captures: decoding steps recorded as CUDA graphs (``--torchgen-cuda-graphs``).
    :ivar graph_replays: decoding steps run by replaying one.
    """

    requests: int = 0
    aborted: int = 0
    prompt_tokens: int = 0
    shared_prompt_tokens: int = 0
    generated_tokens: int = 0
    batches: int = 0
    decode_steps: int = 0
    forward_rows: int = 0
    max_batch_size: int = 0
    busy_seconds: float = 0.0
    graph_captures: int = 0
    graph_replays: int = 0

    def add(self, step: EngineStats) -> None:
        """Add the counts of one step (``max_batch_size``: the larger)."""
        for name, value in vars(step).items():
            current = getattr(self, name)
            setattr(self, name, max(current, value) if name == "max_batch_size" else current + value)

    def as_dict(self) -> dict[str, float]:
        """The counters plus derived rates: ``mean_batch_size`` (rows per forward pass) and
        ``tokens_per_second`` (generated tokens per busy second)."""
        forwards = self.batches + self.decode_steps
        return {
            **asdict(self),
            "mean_batch_size": self.forward_rows / forwards if forwards else 0.0,
            "tokens_per_second": self.generated_tokens / self.busy_seconds if self.busy_seconds else 0.0,
        }
