"""Combining reward functions: weights, dict-valued rewards, timeouts and failures.

``--reward math --reward format:0.1`` gives ``reward = 1.0 * math + 0.1 * format``; each
component is kept on the sample (``reward_components``) and logged. A reward that raises, times
out, or returns a value that is not a finite float32 (or whose weighted value, or the running
weighted sum, leaves float32 range) marks the sample with the reward's name and reason; with
``--reward-errors zero`` that component scores 0 and the run goes on (the first failure of each
reward is printed to stderr with the plugin that provides it; counts go to the
``reward/failed/...`` metrics), with ``fail`` the run stops with a :class:`ProviderError` naming
the plugin.

Where rewards run: a reward that declares ``inline = True`` (pure, bounded, synchronous work
such as the match rewards) is scored on the caller's thread inside :meth:`RewardSet.score_group`,
with no thread hop and no timeout (see the ``plasmid_rewards`` hookspec). Every other reward
component has its own *reward worker*, a daemon thread running an event loop;
:meth:`RewardSet.score_group` sends a whole group to it in one hop and waits on the caller's
loop with ``--reward-timeout``. So a reward that blocks its loop (``time.sleep`` in
``async def``, a CPU-bound verifier) can neither stall rollout nor keep the timeout from firing.
A worker whose loop has calls but has not run for a while (a quarter of the timeout, at most
:data:`~plasmid.reward_workers.STALL_SECONDS`) is *abandoned*: the samples it has not started yet move to a fresh worker
(so one stuck verifier call costs its own sample, not its group's or every group queued behind
it), it gets no new calls, finishes what it has, and exits; ``reward/workers_abandoned`` counts
them. At most :data:`~plasmid.reward_workers.MAX_ABANDONED_WORKERS` abandoned
workers of one reward may be alive at once; beyond that new calls queue on the current worker
(and time out if it stays stuck).

A run whose rewards cannot teach anything is reported: when every sample scored since the last
:meth:`RewardSet.pop_metrics` (one rollout step) failed every reward, a one-line warning names
the rewards and the first reason, and after ``max_all_failed_steps`` (default
:data:`ALL_FAILED_STEPS`) such steps in a row ``pop_metrics`` raises :class:`ProviderError`.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from plasmid.errors import ProviderError
from plasmid.reward_workers import (
    HEARTBEAT_SECONDS,
    PENDING,
    STALL_SECONDS,
    Call,
    Failure,
    Hop,
    Mailbox,
    RewardWorker,
    Workers,
    stop_workers,
)
from plasmid.types import RewardParts, Sample

#: The largest finite float32; rewards travel to the trainer as float32 tensors.
FLOAT32_MAX = 3.4028234663852886e38
#: Default number of consecutive steps in which every reward failed on every sample that stops the run.
ALL_FAILED_STEPS = 3


@dataclass
class RewardComponent:
    """One ``--reward NAME:WEIGHT`` entry: the built reward function and who provided it."""

    name: str
    weight: float
    fn: Any
    plugin: str = ""

    @property
    def is_group(self) -> bool:
        return bool(getattr(self.fn, "group", False))

    @property
    def is_inline(self) -> bool:
        """The reward declares ``inline = True``: scored on the caller's loop, without a worker."""
        return getattr(self.fn, "inline", False) is True

    @property
    def where(self) -> str:
        return f"reward '{self.name}'" + (f" from plugin {self.plugin}" if self.plugin else "")


#: per-sample states of one component's calls in a group (see :func:`_call_reward`)
NOT_STARTED, STARTED, MOVED = 0, 1, 2


async def _call_reward(component: RewardComponent, samples: list[Sample], slots: list[Any], states: list[int],
                       positions: list[int]) -> None:
    """Runs on the component's worker loop: fill ``slots[p]`` with sample ``p``'s raw value or a
    :class:`Failure`, for each ``p`` in ``positions``. ``states[p]`` goes from ``NOT_STARTED`` to
    ``STARTED`` when its call begins; the caller sets ``MOVED`` on samples it hands to another
    worker (this one's loop was stuck), which are then skipped here. (Both threads touch
    ``states``; a sample both run by a narrow race is scored twice, harmlessly.) A group reward
    is one call: its state is ``states[0]``. Never raises except when cancelled."""
    if component.is_group:
        if states[0] != NOT_STARTED:
            return
        states[0] = STARTED
        try:
            raw = list(await component.fn(samples))
            if len(raw) != len(samples):
                raise ValueError(f"group reward returned {len(raw)} values for {len(samples)} samples")
            slots[:] = raw
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit included: reported, the worker goes on
            slots[:] = [Failure(exc)] * len(samples)
        return

    async def one(position: int) -> None:
        if states[position] != NOT_STARTED:
            return
        states[position] = STARTED
        try:
            slots[position] = await component.fn(samples[position])
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit included: reported, the worker goes on
            slots[position] = Failure(exc)

    if len(positions) == 1:
        await one(positions[0])
    else:
        await asyncio.gather(*(one(position) for position in positions))


def _drive_inline(component: RewardComponent, argument: Any) -> Any:
    """Run one call of an inline reward to completion on the calling thread, without a loop:
    its value, or a :class:`Failure` when it raises (``SystemExit`` included) or awaits
    (an inline reward must return without suspending; see ``plasmid_rewards``)."""
    try:
        call = component.fn(argument)
        if not asyncio.iscoroutine(call):
            raise TypeError(f"returned {type(call).__name__}, not a coroutine (an inline reward is still async def)")
        try:
            call.send(None)
        except StopIteration as done:
            return done.value
        call.close()
        raise RuntimeError("declares inline = True but awaited; an inline reward must return without awaiting")
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported with the plugin's name, like a worker's
        return Failure(exc)


def _score_inline(component: RewardComponent, samples: list[Sample], slots: list[Any]) -> None:
    """Fill ``slots`` (one per sample) with an inline component's raw values or :class:`Failure`
    s, on the caller's thread; a group reward is one call whose sequence must match ``samples``."""
    if not component.is_group:
        slots[:] = [_drive_inline(component, sample) for sample in samples]
        return
    raw = _drive_inline(component, samples)
    if not isinstance(raw, Failure):
        try:
            raw = list(raw)
            if len(raw) != len(samples):
                raise ValueError(f"group reward returned {len(raw)} values for {len(samples)} samples")
        except Exception as exc:  # noqa: BLE001 - reported with the plugin's name
            raw = Failure(exc)
    slots[:] = [raw] * len(samples) if isinstance(raw, Failure) else raw


def parts_of(name: str, result: RewardParts) -> dict[str, float]:
    """The finite numeric parts of reward ``name``'s ``result`` as reward components
    (``"<name>.<part>"`` -> value; see :class:`plasmid.types.RewardParts`)."""
    parts: dict[str, float] = {}
    for part, raw in result.parts.items():
        try:
            value = float(raw)
        except (TypeError, ValueError):
            continue
        if math.isfinite(value) and abs(value) <= FLOAT32_MAX:
            parts[f"{name}.{part}"] = value
    return parts


@dataclass
class RewardSet:
    """The run's rewards. ``score_group`` is what rollout drivers call.

    :ivar failures: ``"name: ExceptionType"`` -> count, since the last :meth:`pop_metrics`.
    :ivar max_all_failed_steps: :meth:`pop_metrics` raises :class:`ProviderError` when every
        reward failed on every sample in this many consecutive steps (0: never).
    """

    components: list[RewardComponent]
    reward_key: str | None = None
    timeout: float = 60.0
    errors: str = "zero"
    max_all_failed_steps: int = ALL_FAILED_STEPS
    failures: Counter[str] = field(default_factory=Counter)
    #: rewards whose first failure was already printed (once per reward, not per sample).
    reported: set[str] = field(default_factory=set)
    #: samples scored since the last pop_metrics, those that failed every reward, and the first reason.
    _scored: int = field(default=0, init=False, repr=False)
    _all_failed: int = field(default=0, init=False, repr=False)
    _first_reason: str = field(default="", init=False, repr=False)
    #: consecutive pop_metrics windows in which every sample failed every reward.
    _all_failed_streak: int = field(default=0, init=False, repr=False)
    _workers: Workers = field(default_factory=Workers, init=False, repr=False)
    #: where workers hand results back: the mailbox of the loop that last called score_group.
    _reply: Mailbox | None = field(default=None, init=False, repr=False)
    #: score_group calls in progress, since when at least one was, and the seconds of such time
    #: before that (see :meth:`pop_busy_seconds`).
    _busy_calls: int = field(default=0, init=False, repr=False)
    _busy_since: float = field(default=0.0, init=False, repr=False)
    _busy_seconds: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        weakref.finalize(self, stop_workers, self._workers)

    async def score_group(self, samples: list[Sample]) -> None:
        """Score ``samples`` (one group) in place: ``reward`` and ``reward_components``.

        Inline components (``inline = True``) are scored first, here, on the caller's thread.
        Each other component gets the whole group in one hop to its reward worker; per-sample rewards
        run concurrently there, group rewards see all samples. A call that has not returned
        ``timeout`` seconds after the group was sent fails with "timed out" (the call is
        cancelled; if its worker's loop is blocked, the worker is abandoned).
        """
        if not samples or not self.components:
            self._combine(samples, [])
            return
        if not self._busy_calls:
            self._busy_since = time.perf_counter()
        self._busy_calls += 1
        try:
            await self._score_group(samples)
        finally:
            self._busy_calls -= 1
            if not self._busy_calls:
                self._busy_seconds += time.perf_counter() - self._busy_since

    def pop_busy_seconds(self) -> float:
        """Wall-clock seconds since the last call during which at least one :meth:`score_group`
        was in progress (groups scored at once count once; the time overlaps the generation of
        other groups); a call still in progress counts up to now."""
        now = time.perf_counter()
        busy = self._busy_seconds + (now - self._busy_since if self._busy_calls else 0.0)
        self._busy_seconds, self._busy_since = 0.0, now
        return busy

    async def _score_group(self, samples: list[Sample]) -> None:
        grace = self.timeout
        loop = asyncio.get_running_loop()
        reply = self._reply
        if reply is None or reply.loop is not loop:
            reply = self._reply = Mailbox(loop)
        slots = [[PENDING] * len(samples) for _ in self.components]
        states = [[NOT_STARTED] * len(samples) for _ in self.components]
        everyone = list(range(len(samples)))
        inline = [component.is_inline for component in self.components]
        for position, component in enumerate(self.components):
            if inline[position]:
                _score_inline(component, samples, slots[position])
        if all(inline):
            self._combine(samples, slots)
            return
        hop = Hop(loop.create_future(), inline.count(False))
        calls: list[list[tuple[RewardWorker, Call]]] = []
        for position, component in enumerate(self.components):
            if inline[position]:
                calls.append([])   # scored above; nothing to wait for, rescue or cancel
                continue
            worker = self._workers.get(position, component.name, grace)
            calls.append([(worker, worker.submit(_call_reward(component, samples, slots[position], states[position],
                                                              everyone), hop, reply))])
        # a worker silent this long has a blocked loop: its unstarted samples move (see _rescue)
        stall = max(min(STALL_SECONDS, self.timeout / 4), 2.5 * HEARTBEAT_SECONDS)
        deadline = loop.time() + self.timeout
        try:
            while not hop.future.done() and (left := deadline - loop.time()) > 0:
                await asyncio.wait([hop.future], timeout=min(left, stall))
                if not hop.future.done():
                    self._rescue(samples, slots, states, calls, hop, reply, stall, grace)
        finally:
            if hop.remaining:   # timed out, or we were cancelled: cancel what is still running
                hop.future.cancel()
                now = time.monotonic()
                for position, component_calls in enumerate(calls):
                    for worker, call in component_calls:
                        if not call.finished:
                            worker.cancel(call)
                            if worker.stalled(now):
                                self._workers.abandon(position, worker, grace)
        self._combine(samples, [list(values) for values in slots])

    def _rescue(self, samples: list[Sample], slots: list[list[Any]], states: list[list[int]],
                calls: list[list[tuple[RewardWorker, Call]]], hop: Hop, reply: Mailbox, stall: float,
                grace: float) -> None:
        """For each component whose latest call sits on a stuck worker (its loop blocked, e.g. by
        one sample's verifier that does not return): abandon that worker and hand the samples it
        has not started to a fresh one, so that one stuck call costs its own sample, not its
        group's and every group queued behind it. Started samples stay where they are, with
        their chance until the deadline; the hop waits for both calls (the old one skips the
        moved samples if its loop comes back)."""
        now = time.monotonic()
        for position, component in enumerate(self.components):
            if not calls[position]:
                continue   # an inline reward: scored before the hop
            worker, call = calls[position][-1]
            if call.finished or not worker.stalled(now, stall):
                continue
            current = states[position]
            waiting = [p for p, state in enumerate(current) if state == NOT_STARTED]
            if component.is_group:
                waiting = list(range(len(samples))) if current[0] == NOT_STARTED else []
            if not waiting or not self._workers.abandon(position, worker, grace):
                continue  # nothing to move, or no thread left for this reward: the calls wait (and time out)
            fresh_states = [MOVED] * len(current)
            for p in waiting:
                current[p], fresh_states[p] = MOVED, NOT_STARTED
            states[position] = fresh_states
            fresh = self._workers.get(position, component.name, grace)
            hop.remaining += 1
            calls[position].append((fresh, fresh.submit(
                _call_reward(component, samples, slots[position], fresh_states, waiting), hop, reply)))

    def _combine(self, samples: list[Sample], results: list[list[Any]]) -> None:
        for position, sample in enumerate(samples):
            total = 0.0
            failed = 0
            for component, values in zip(self.components, results, strict=True):
                value, term, problem = self._checked(component, values[position], total)
                if problem is not None:
                    self._failed(component, sample, problem)
                    failed += 1
                sample.reward_components[component.name] = value
                if problem is None and isinstance(values[position], RewardParts):
                    sample.reward_components.update(parts_of(component.name, values[position]))
                total += term
            sample.reward = total
            self._scored += 1
            if self.components and failed == len(self.components):
                self._all_failed += 1

    def _checked(self, component: RewardComponent, raw: Any, total: float) -> tuple[float, float, BaseException | None]:
        """``(value, weighted value, None)``, or ``(0.0, 0.0, why)`` when the call failed or its value
        (alone, weighted, or added to ``total``) is not a finite float32."""
        if raw is PENDING:
            return 0.0, 0.0, TimeoutError()
        if isinstance(raw, Failure):
            return 0.0, 0.0, raw.exc
        try:
            value = self._as_float(raw)
            term = component.weight * value
            if not abs(term) <= FLOAT32_MAX:
                raise ValueError(f"returned {value!r}, which weighted by {component.weight:g} is {term!r}, "
                                 f"outside float32 range")
            if not abs(total + term) <= FLOAT32_MAX:
                raise ValueError(f"returned {value!r}: the weighted sum of the rewards, {total!r} + {term!r}, "
                                 f"leaves float32 range")
        except Exception as exc:  # noqa: BLE001 - reported with the plugin's name
            return 0.0, 0.0, exc
        return value, term, None

    def _as_float(self, value: Any) -> float:
        if isinstance(value, RewardParts):
            value = value.value
        elif isinstance(value, dict):
            key = self.reward_key
            if key is None:
                if len(value) != 1:
                    raise ValueError(f"returned a dict with keys {sorted(value)}; choose one with --reward-key")
                key = next(iter(value))
            if key not in value:
                raise ValueError(f"returned a dict without --reward-key {key!r} (keys: {sorted(value)})")
            value = value[key]
        result = float(value)
        if not math.isfinite(result):
            raise ValueError(f"returned a non-finite reward {value!r}")
        if abs(result) > FLOAT32_MAX:
            raise ValueError(f"returned {value!r}, outside float32 range (|reward| <= {FLOAT32_MAX:.7g})")
        return result

    def _failed(self, component: RewardComponent, sample: Sample, exc: BaseException) -> None:
        timed_out = isinstance(exc, TimeoutError)
        reason = f"timed out after {self.timeout:g}s (--reward-timeout)" if timed_out \
            else f"{type(exc).__name__}: {exc}"
        where = component.where
        if self.errors == "fail":
            raise ProviderError(f"{where} failed on sample {sample.index}: {reason}",
                                provider=component.name, plugin=component.plugin) from exc
        sample.metadata.setdefault("reward_errors", []).append(
            f"{component.name}: {'timed out' if timed_out else reason}")
        if not self._first_reason:
            self._first_reason = f"{where} on sample {sample.index}: {reason}"
        if component.name not in self.reported:
            self.reported.add(component.name)
            print(f"plasmid: {where} failed on sample {sample.index}: {reason}; the sample scores 0 for it and "
                  f"the run goes on (counted in reward/failed/...; --reward-errors fail stops instead)",
                  file=sys.stderr)
        self.failures[f"{component.name}: timeout" if timed_out else f"{component.name}: {type(exc).__name__}"] += 1

    def pop_metrics(self) -> dict[str, float]:
        """Failure counts since the last call, as ``reward/failed/<name: kind>`` metrics, and
        ``reward/workers_abandoned`` when workers were abandoned (absent when zero).

        Called once per rollout step. When every sample scored since the last call failed every
        reward, prints a one-line warning; raises :class:`ProviderError` when that happened in
        ``max_all_failed_steps`` consecutive calls.
        """
        metrics = {f"reward/failed/{key}": float(count) for key, count in self.failures.items()}
        if self._workers.abandoned_count:
            metrics["reward/workers_abandoned"] = float(self._workers.abandoned_count)
        scored, all_failed, first = self._scored, self._all_failed, self._first_reason
        self.failures.clear()
        self._workers.abandoned_count = 0
        self._scored = self._all_failed = 0
        self._first_reason = ""
        if scored:
            self._all_failed_streak = self._all_failed_streak + 1 if all_failed == scored else 0
        if scored and all_failed == scored:
            rewards = ", ".join(component.where for component in self.components)
            limit = self.max_all_failed_steps
            message = (f"every reward failed on all {scored} samples scored ({rewards}), so every "
                       f"reward is 0 and nothing can be learned; first failure: {first}")
            if limit and self._all_failed_streak >= limit:
                first_component = self.components[0]
                raise ProviderError(f"{message}; stopping after {self._all_failed_streak} such steps in a row",
                                    provider=first_component.name, plugin=first_component.plugin)
            print(f"plasmid: warning: {message} ({self._all_failed_streak} step(s) in a row"
                  + (f"; {limit} stop the run)" if limit else ")"), file=sys.stderr)
        return metrics

    def close(self) -> None:
        """Stop the reward workers (calls still running are cancelled). Scoring again starts new ones."""
        self._workers.stop()
