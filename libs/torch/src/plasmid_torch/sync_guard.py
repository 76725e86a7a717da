"""Deadlines and load checks that the weight syncs share, so a sync can neither hang nor lie.

- **Deadlines.** Every phase of a sync is awaited under a deadline: ``gather`` (the trainer
  exports its weights), ``connect`` (a transport's group forms), ``send`` (the trainer hands them
  on), ``receive`` and ``load`` (an engine takes them), ``resume`` (an engine flushes its cache
  and serves again). The deadline is ``--sync-timeout`` seconds, or by default
  ``max(60 s, bytes of the phase / 50 MB/s)``. A phase past its deadline raises :class:`SyncTimeout`
  naming the transport, the phase, the engine (or the trainer) and its rank (the trainer is rank
  0, engine ``i`` rank ``i + 1``, as in ``broadcast``'s group). A coroutine stuck in a thread
  (a blocking collective) keeps its thread; the run stops anyway, with the error.
- **Checksums** (``--sync-checksums on``): the sender computes a CRC32 of each tensor's raw bytes
  (:func:`checksum`: about 1.6 GB/s on one core, half the cost of copying the tensor); the
  receiver recomputes them on what it received and refuses a bucket that differs
  (:func:`check_received`, :class:`SyncMismatch`) before loading it.
- **Loaded checksums** (the same option, for engines that load through their own server: SGLang's
  ``/update_weights_from_tensor|distributed|disk``, vLLM's ``/collective_rpc`` and reload): what
  travels inside the server cannot be checked on its way, so the engine reports CRC32s of what it
  *holds* after the load (:meth:`SyncGuard.check_loaded`; an engine offers this with an async
  ``loaded_checksums([(name, rows)])``). Reading a whole model back would cost as much as the sync,
  so it is a sample, the same on both sides: per bucket, :data:`LOADED_TENSORS_PER_BUCKET` tensors
  drawn with a seed made of the weight version and the bucket's index, and of each its first rows
  up to :data:`LOADED_BYTES_PER_TENSOR` bytes (:func:`loaded_sample`), as float32 values
  (:func:`loaded_checksum`; an engine serving bfloat16 passes with the trainer's values rounded to
  bfloat16).
- **Read-back** (``--verify-sync-every N``): every ``N``-th sync, :meth:`SyncGuard.verify` reads a
  sample of named tensors back from every engine (``engine.get_weights``) and compares them bit for
  bit with the trainer's: it proves the engine really loaded what was sent, which no transport
  checksum can.
- **Probe** (the same ``--verify-sync-every`` syncs, for an engine that cannot read weights back): the
  guard scores a fixed probe (:func:`plasmid_torch.scoring.probe_sequences`: 4 sequences of 16
  token ids drawn from ``--model``'s vocabulary with a fixed seed, 12 response tokens each) through
  the engine (``response_logprobs``) and through the trainer (``logprobs``) at temperature 1, and
  raises :class:`SyncMismatch` naming the transport and the engine when the largest log-prob
  difference exceeds ``--verify-sync-bound``. An engine says it cannot read back with a false
  ``reads_weights_back`` attribute (vLLM without plasmid's worker extension), or by raising
  :class:`ReadBackUnsupported` from ``get_weights`` (SGLang for a model class without
  ``get_weights_by_name``); the guard then probes that engine from then on. ``--verify-sync-check``
  forces either check. Where an engine can read back (torchgen, plasmid's vLLM servers, SGLang's
  Llama-like models), read-back stays the check: it is exact, the probe only bounded.
  Cost, measured on the quickstart's model (133k parameters; torchgen and torchtrain in one
  process, CPU, one thread, a shared 2-core machine; medians of 30 in two runs): 5 to 7 ms per
  verifying sync and engine (the trainer's scores are computed once for all engines), against 0.5
  to 0.7 ms for reading 8 tensors back; with the default ``--verify-sync-every 50``, at most 0.15 ms
  per sync. There an honest sync's probe differs by 2.4e-7, and one tensor perturbed after the
  load (noise of standard deviation 0.05) by 2.35. The quickstart's default (torchgen) reads back.

The built-in transports (plasmid-sync's and :mod:`plasmid_torch.disk_sync`) use these; a third-party
transport does the same, and the weight-sync contract suite checks it
(:mod:`plasmid_torch.testing.contracts.weightsync`).
"""

from __future__ import annotations

import asyncio
import math
import random
import zlib
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from plasmid.config import Config
from plasmid.errors import PlasmidError
from plasmid.kernel_options import GeneralOptions
from plasmid.options import Options, option
from plasmid.remote import run_on
from plasmid_torch.tensors import raw_array

#: The default deadline of a phase is at least this many seconds ...
FLOOR_SECONDS = 60.0
#: ... and otherwise the phase's bytes at this many bytes per second.
BYTES_PER_SECOND = 50e6
#: A model's weights on disk are taken as half the bytes a float32 trainer exports (bf16 checkpoints).
CHECKPOINT_TO_EXPORT = 2

#: Loaded checksums (module docstring) cover this many sampled tensors of every bucket ...
LOADED_TENSORS_PER_BUCKET = 1
#: ... and of each its first rows up to this many bytes (at least one row): about 1 ms of CRC32 and,
#: for SGLang, whose only read-back is JSON, a few ms of decoding per bucket.
LOADED_BYTES_PER_TENSOR = 1 << 18

T = TypeVar("T")


class SyncGuardOptions(Options, group="sync checks",
                       description="deadlines and load checks of the weight syncs (every built-in --weight-sync)"):
    """Deadlines, checksums and read-back of the weight syncs that use :class:`SyncGuard`."""

    sync_timeout: float | None = option(
        None, "seconds one phase of a weight sync (gather, connect, send, receive, load, resume) may take; past "
        "it the run stops with an error naming the transport, phase, engine and rank", gt=0,
        default_text="max(60, bytes of the phase / 50 MB/s)")
    sync_checksums: Literal["on", "off"] = option(
        "on", "CRC32 of every tensor a sync sends, checked by the receiver before it loads the bucket; engines that "
        "load through their own server (SGLang, vLLM) also report CRC32s of a sample of each bucket as they hold it")
    verify_sync_every: int = option(
        50, "every N syncs, read sampled tensors back from every engine and compare them bit for bit with the "
        "trainer's (0: never)", min=0)
    verify_sync_tensors: int = option(8, "tensors --verify-sync-every reads back per engine (0: all)", min=0)
    verify_sync_check: Literal["auto", "read-back", "probe"] = option(
        "auto", "how --verify-sync-every checks an engine: read sampled tensors back (exact), or score a fixed probe "
        "through the engine and the trainer and bound the log-prob difference (--verify-sync-bound); auto: "
        "read-back where the engine can, else the probe")
    verify_sync_bound: float | None = option(
        None, "the largest |engine - trainer| log-prob difference on the probe that passes", gt=0,
        default_text="1e-3 at --precision fp32, 5e-2 in bfloat16")


class SyncError(PlasmidError):
    """A weight sync that did not finish or did not deliver what the trainer sent."""


class SyncTimeout(SyncError):
    """A phase of a weight sync ran past its deadline (``--sync-timeout``)."""


class SyncMismatch(SyncError):
    """A received or loaded tensor differs from the trainer's."""


class ReadBackUnsupported(SyncError):
    """Raised by an engine's ``get_weights`` when it cannot read its weights back (the guard then
    checks that engine with the probe)."""


#: The default ``--verify-sync-bound`` by ``--precision``. In float32 an engine and a trainer holding
#: the same weights give log-probs within ~1e-5 of each other (different kernels and batch shapes
#: reorder sums), while one wrong weight moves them by far more; 1e-3 keeps a margin of 100 on both
#: sides. bfloat16 rounds every activation to 8 bits of mantissa (3.9e-3 relative), and matching
#: bfloat16 implementations differ by up to a few 1e-2 per token, so the bound there is 5e-2: it
#: still catches an engine serving other weights, not a single slightly perturbed tensor.
PROBE_BOUNDS = {"fp32": 1e-3, "bf16": 5e-2, "bf16-autocast": 5e-2}
#: The probe's token sequences are drawn with this seed (the same probe at every sync).
PROBE_SEED = 1234


def checksum(tensor: Any) -> int:
    """CRC32 of a tensor's or numpy array's raw bytes in C order (bfloat16 as its bit patterns);
    a CUDA tensor is copied to the host first."""
    array, _dtype = raw_array(tensor)
    return zlib.crc32(memoryview(array.reshape(-1).view("uint8")))


def bucket_checksums(bucket: Sequence[tuple[str, Any]]) -> list[int]:
    """:func:`checksum` of every tensor of ``bucket``, in order."""
    return [checksum(tensor) for _name, tensor in bucket]


def check_received(bucket: Sequence[tuple[str, Any]], expected: Sequence[int] | None, transport: str,
                   receiver: str) -> None:
    """Raise :class:`SyncMismatch` naming the first tensor of ``bucket`` whose checksum is not the
    sender's (``expected``, from :func:`bucket_checksums`); ``None`` (checksums off) checks nothing.
    ``receiver`` names who received it (``"engine 0 (TorchEngine, rank 1)"``)."""
    if expected is None:
        return
    if len(expected) != len(bucket):
        raise SyncMismatch(f"weight sync '{transport}': {receiver} received {len(bucket)} tensors in a bucket of "
                           f"{len(expected)} sent; the transport lost or added tensors")
    for (name, tensor), want in zip(bucket, expected, strict=True):
        got = checksum(tensor)
        if got != want:
            raise SyncMismatch(f"weight sync '{transport}': tensor '{name}' received by {receiver} has CRC32 "
                               f"{got:08x}, the trainer sent {want:08x}; the bucket was corrupted on its way")


def loaded_checksum(values: Any) -> int:
    """CRC32 of ``values`` (a torch tensor or numpy array of floats, any device) as C-order float32:
    what an engine reports for a sampled slice (:meth:`SyncGuard.check_loaded`)."""
    import numpy as np
    import torch

    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float32).contiguous().numpy()
    return zlib.crc32(np.ascontiguousarray(values, dtype=np.float32).tobytes())


def loaded_rows(shape: Sequence[int]) -> int:
    """Rows (first-dimension entries) of a tensor of ``shape`` that :func:`loaded_sample` checks: as
    many as fit :data:`LOADED_BYTES_PER_TENSOR` bytes of float32, at least one, at most all; 0 for a
    scalar (checked whole)."""
    if not shape:
        return 0
    row = 4 * math.prod(shape[1:])
    return max(1, min(int(shape[0]), LOADED_BYTES_PER_TENSOR // max(row, 1)))


def loaded_seed(weight_version: int, bucket: int) -> int:
    """The seed of bucket ``bucket``'s sample in the sync of ``weight_version``."""
    return weight_version * 1_000_003 + bucket


def loaded_sample(bucket: Sequence[tuple[str, Any]], seed: int) -> list[tuple[str, int, list[int]]]:
    """(trainer) What :meth:`SyncGuard.check_loaded` checks of ``bucket``: :data:`LOADED_TENSORS_PER_BUCKET`
    floating-point tensors drawn with ``random.Random(seed)``, each as ``(name, rows, accepted)``:
    :func:`loaded_rows` of it, and the :func:`loaded_checksum` of those rows as the trainer holds them
    and rounded to bfloat16 (an engine may serve bfloat16 weights of a float32 trainer)."""
    import torch

    tensors = [(name, torch.as_tensor(tensor)) for name, tensor in bucket]
    floating = [i for i, (_, tensor) in enumerate(tensors) if tensor.is_floating_point()]
    picked = sorted(random.Random(seed).sample(floating, min(LOADED_TENSORS_PER_BUCKET, len(floating))))
    sample = []
    for i in picked:
        name, tensor = tensors[i]
        rows = loaded_rows(tuple(tensor.shape))
        part = tensor[:rows] if rows else tensor
        own, rounded = loaded_checksum(part), loaded_checksum(part.to(torch.bfloat16))
        sample.append((name, rows, [own] if rounded == own else [own, rounded]))
    return sample


def export_loaded_sample(trainer: Any, bucket_bytes: int, weight_version: int) -> list[tuple[str, int, list[int]]]:
    """(trainer) :func:`loaded_sample` of every bucket of ``trainer.export_weights(bucket_bytes)``, for a
    sync whose transport does not hand the buckets over one by one (``vllm-nccl``)."""
    return [entry for index, bucket in enumerate(trainer.export_weights(bucket_bytes))
            for entry in loaded_sample(bucket, loaded_seed(weight_version, index))]


def reports_loaded(engine: Any) -> bool:
    """(engine) Whether the engine can report loaded checksums: it has ``loaded_checksums`` and does
    not say it cannot read its weights back (``reads_weights_back``)."""
    return hasattr(engine, "loaded_checksums") and reads_back(engine)


async def report_loaded_checksums(engine: Any, requests: list[tuple[str, int]]) -> dict[str, int] | None:
    """(engine) The engine's ``loaded_checksums(requests)``: ``{name: CRC32}`` of the first ``rows`` rows
    of each named tensor as it holds them (:func:`loaded_checksum`); ``None`` when it has no such
    method or cannot read that model's weights (:class:`ReadBackUnsupported`)."""
    report = getattr(engine, "loaded_checksums", None)
    if report is None:
        return None
    try:
        return {str(name): int(crc) for name, crc in (await report(requests)).items()}
    except ReadBackUnsupported:
        return None


def who(target: Any, index: int | None) -> str:
    """``"engine 0 (TorchEngine, rank 1)"`` for engine ``index``, ``"the trainer (X, rank 0)"`` for ``None``."""
    kind = type(target).__name__
    return f"the trainer ({kind}, rank 0)" if index is None else f"engine {index} ({kind}, rank {index + 1})"


def model_bytes_estimate(model: str | Path | None) -> int:
    """Bytes a trainer of ``--model`` exports, guessed before its first sync: the size of the
    directory's ``*.safetensors`` / ``*.bin`` files times :data:`CHECKPOINT_TO_EXPORT`; 0 when unknown."""
    if not model or not Path(model).is_dir():
        return 0
    files = [*Path(model).glob("*.safetensors"), *Path(model).glob("*.bin")]
    return CHECKPOINT_TO_EXPORT * sum(path.stat().st_size for path in files)


class SyncGuard:
    """One transport's deadlines and read-back; built as ``SyncGuard(config, "disk")``.

    :ivar model_bytes: bytes of the whole model, for phases that move all of it: the last sync's
        (:meth:`moved`), or :func:`model_bytes_estimate` before the first.
    """

    def __init__(self, config: Config, transport: str) -> None:
        self.options = SyncGuardOptions.of(config)
        self.transport = transport
        self.model_bytes = model_bytes_estimate(GeneralOptions.of(config).model)
        self.checksums = self.options.sync_checksums == "on"
        self.syncs = 0
        self.model = GeneralOptions.of(config).model
        self.bound = self.options.verify_sync_bound or PROBE_BOUNDS.get(
            str(getattr(config.option, "precision", "fp32")), PROBE_BOUNDS["fp32"])
        #: indices of the engines whose ``get_weights`` raised :class:`ReadBackUnsupported`
        self.probed: set[int] = set()

    def deadline(self, nbytes: int | None = None) -> float:
        """Seconds a phase moving ``nbytes`` (default: the whole model) may take."""
        if self.options.sync_timeout is not None:
            return self.options.sync_timeout
        return max(FLOOR_SECONDS, (self.model_bytes if nbytes is None else nbytes) / BYTES_PER_SECOND)

    def moved(self, nbytes: int) -> None:
        """Record the bytes a finished sync moved (the next whole-model deadlines scale with them)."""
        if nbytes > 0:
            self.model_bytes = nbytes

    async def phase(self, awaitable: Awaitable[T], phase: str, target: Any, index: int | None = None,
                    nbytes: int | None = None) -> T:
        """``await awaitable`` within :meth:`deadline` of ``nbytes``, or raise :class:`SyncTimeout`
        naming the transport, ``phase`` and ``target`` (engine ``index``, or the trainer for ``None``)."""
        seconds = self.deadline(nbytes)
        try:
            return await asyncio.wait_for(awaitable, seconds)
        except TimeoutError:
            raise self._late(phase, who(target, index), seconds) from None

    def _late(self, phase: str, whom: str, seconds: float) -> SyncTimeout:
        return SyncTimeout(
            f"weight sync '{self.transport}': phase '{phase}' of {whom} did not finish within {seconds:g} s "
            f"(--sync-timeout; default max(60, bytes / 50 MB/s)); its process is stuck or too slow (raise "
            f"--sync-timeout if it is only slow)")

    async def each_engine(self, phase: str, engines: Sequence[Any], call: Callable[[Any, int], Awaitable[T]],
                          nbytes: int | None = None) -> list[T]:
        """``call(engine, index)`` for every engine at once, all within one :meth:`deadline` of
        ``nbytes``; the first failure cancels the others and is raised. Past the deadline the
        :class:`SyncTimeout` names every engine not finished by then, in index order (in a collective
        transport one stuck member stalls the others, so all of them are named, the stuck one among them)."""
        seconds = self.deadline(nbytes)
        tasks = [asyncio.ensure_future(call(engine, index)) for index, engine in enumerate(engines)]
        try:
            done, pending = await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
            failed = next((task.exception() for task in tasks if task in done and task.exception() is not None), None)
            if failed is not None:
                raise failed
            if pending:
                late = [who(engine, index) for index, (engine, task) in enumerate(zip(engines, tasks, strict=True))
                        if task in pending]
                raise self._late(phase, " and ".join(late), seconds)
            return [task.result() for task in tasks]
        finally:
            for task in tasks:
                task.cancel()

    async def resume(self, engines: Sequence[Any]) -> None:
        """Every engine's ``flush_cache``, under the ``resume`` deadline."""
        await self.each_engine("resume", engines, lambda engine, _index: engine.flush_cache(), 0)

    async def check_loaded(self, engines: Sequence[Any], sample: Sequence[tuple[str, int, list[int]]]) -> int:
        """With ``--sync-checksums on``, ask every engine for the CRC32s of ``sample`` (:func:`loaded_sample`
        of a bucket they loaded) as it holds them, under the ``load`` deadline, and compare; returns how
        many (engine, tensor) pairs were checked (an engine that cannot report is skipped).

        :raises SyncMismatch: naming the tensor, the engine and the transport."""
        if not self.checksums or not sample:
            return 0
        requests = [(name, rows) for name, rows, _ in sample]
        reported = await self.each_engine("load", engines, lambda engine, _index: run_on(
            engine, report_loaded_checksums, requests), 4 * LOADED_BYTES_PER_TENSOR * len(requests))
        checked = 0
        for index, (engine, crcs) in enumerate(zip(engines, reported, strict=True)):
            if crcs is None:
                continue
            for name, rows, accepted in sample:
                got = crcs.get(name)
                if got not in accepted:
                    shown = "nothing" if got is None else f"CRC32 {got:08x}"
                    raise SyncMismatch(
                        f"weight sync '{self.transport}': tensor '{name}' loaded by {who(engine, index)} has {shown} "
                        f"(first {rows or 'all'} rows as float32), the trainer's is {accepted[0]:08x}; the engine "
                        f"did not load what was sent (--sync-checksums)")
                checked += 1
        return checked

    async def verify(self, trainer: Any, engines: Sequence[Any], bucket_bytes: int) -> dict[str, float]:
        """Count a finished sync; on every ``--verify-sync-every``-th, check every engine: read
        ``--verify-sync-tensors`` sampled tensors back and compare them bit for bit with the
        trainer's, or, for an engine that cannot read back (module docstring), score the probe.

        An engine may serve bfloat16 weights of a float32 trainer: its value then equals the
        trainer's rounded to bfloat16. Returns ``{"sync/verified_tensors": n}`` when it read back,
        and ``{"sync/probed_engines": n, "sync/probe_max_diff": d}`` when it probed.

        :raises SyncMismatch: naming the tensor (or the probe's bound), the engine and the transport.
        """
        self.syncs += 1
        every = self.options.verify_sync_every
        if every == 0 or self.syncs % every:
            return {}
        check = self.options.verify_sync_check
        expected: dict[str, Any] | None = None
        probe = _Probe(self, trainer)
        for index, engine in enumerate(engines):
            if check == "probe" or (check == "auto" and (index in self.probed or not await run_on(engine, reads_back))):
                await probe.check(engine, index)
                continue
            sampled: dict[str, Any] = expected if expected is not None else await self.phase(
                run_on(trainer, sampled_weights, bucket_bytes, self.options.verify_sync_tensors, self.syncs),
                "verify", trainer)
            expected = sampled
            try:
                served = await self.phase(engine.get_weights(list(sampled)), "verify", engine, index,
                                          sum(int(value.nbytes) for value in sampled.values()))
            except ReadBackUnsupported:
                if check == "read-back":
                    raise
                self.probed.add(index)
                await probe.check(engine, index)
                continue
            for name, want in sampled.items():
                difference = readback_difference(want, served.get(name))
                if difference is not None:
                    raise SyncMismatch(f"weight sync '{self.transport}': tensor '{name}' read back from "
                                       f"{who(engine, index)} differs from the trainer's ({difference}); the engine "
                                       f"did not load what was sent (--verify-sync-every)")
        metrics: dict[str, float] = {}
        if expected is not None:
            metrics["sync/verified_tensors"] = float(len(expected) * (len(engines) - probe.engines))
        if probe.engines:
            metrics.update({"sync/probed_engines": float(probe.engines), "sync/probe_max_diff": probe.worst})
        return metrics


def reads_back(engine: Any) -> bool:
    """(engine) Whether the engine can read its weights back: its ``reads_weights_back`` attribute,
    true when it has none."""
    return bool(getattr(engine, "reads_weights_back", True))


class _Probe:
    """The probe of one verifying sync: the trainer's scores computed once, each engine's compared."""

    def __init__(self, guard: SyncGuard, trainer: Any) -> None:
        self.guard, self.trainer = guard, trainer
        self.sequences: list[tuple[list[int], int]] = []
        self.expected: list[list[float]] | None = None
        self.engines, self.worst = 0, 0.0

    async def check(self, engine: Any, index: int) -> None:
        from plasmid_torch.scoring import engine_scores, max_difference, model_vocab, probe_sequences, trainer_scores

        guard = self.guard
        if self.expected is None:
            vocab = model_vocab(guard.model)
            if vocab is None:
                raise SyncError(f"weight sync '{guard.transport}': {who(engine, index)} cannot read its weights back, "
                                f"and the probe that checks it instead needs --model's config.json vocab_size "
                                f"(--model {guard.model}); set --verify-sync-every 0 to check nothing")
            self.sequences = probe_sequences(vocab, PROBE_SEED)
            self.expected = await guard.phase(trainer_scores(self.trainer, self.sequences, 1.0), "verify",
                                              self.trainer, None, 0)
        served = await guard.phase(engine_scores(engine, self.sequences, 1.0), "verify", engine, index, 0)
        try:
            worst, sequence, position = max_difference(served, self.expected)
        except ValueError as exc:
            raise SyncMismatch(f"weight sync '{guard.transport}': the probe scored by {who(engine, index)} does not "
                               f"match the trainer's: {exc}") from None
        if not worst <= guard.bound:
            raise SyncMismatch(f"weight sync '{guard.transport}': the probe's log-probs from {who(engine, index)} "
                               f"differ from the trainer's by up to {worst:.3g} (response token {position} of probe "
                               f"sequence {sequence}), beyond --verify-sync-bound {guard.bound:g}; the engine does not "
                               f"serve the weights the trainer sent (--verify-sync-every)")
        self.engines, self.worst = self.engines + 1, max(self.worst, worst)


def sampled_weights(trainer: Any, bucket_bytes: int, count: int, seed: int) -> dict[str, Any]:
    """In the trainer's process: ``count`` tensors (0: all) of the trainer's weights picked at
    random (reservoir sampling seeded by ``seed``), as numpy arrays copied out of the trainer
    (bfloat16 upcast to float32, exact), by name. A trainer that offers its live tensors
    (:class:`plasmid.protocols.SupportsSharedWeights`, in the order and names it exports) is
    sampled from those, and only the picked tensors are copied; any other is sampled from
    ``export_weights(bucket_bytes)``, which copies the whole model bucket by bucket."""
    from plasmid.protocols import SupportsSharedWeights
    from plasmid_torch.tensors import as_numpy

    live = trainer.shared_weights() if isinstance(trainer, SupportsSharedWeights) else None
    rng, seen = random.Random(seed), 0
    picked: dict[str, Any] = {}
    for bucket in [live] if live is not None else trainer.export_weights(bucket_bytes):
        for name, tensor in bucket:
            seen += 1
            if count and len(picked) >= count:
                slot = rng.randrange(seen)
                if slot >= count:
                    continue
                del picked[list(picked)[slot]]
            picked[name] = tensor
    return {name: _float_numpy(tensor, as_numpy) for name, tensor in picked.items()}


def _float_numpy(tensor: Any, as_numpy: Callable[[Any], Any]) -> Any:
    import torch

    if isinstance(tensor, torch.Tensor) and tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return as_numpy(tensor).copy()


def readback_difference(want: Any, got: Any) -> str | None:
    """Why an engine's read-back ``got`` is not the trainer's ``want`` (``None``: it is, bit for bit,
    or exactly the trainer's value rounded to bfloat16)."""
    import numpy as np
    import torch

    if got is None:
        return "the engine did not return it"
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, the trainer's {list(want.shape)}"
    if got.dtype == want.dtype and np.array_equal(np.ascontiguousarray(got).view(np.uint8),
                                                  np.ascontiguousarray(want).view(np.uint8)):
        return None
    if np.issubdtype(want.dtype, np.floating):
        rounded = torch.from_numpy(np.ascontiguousarray(want)).to(torch.bfloat16).float().numpy()
        if np.array_equal(got.astype(np.float32), rounded):
            return None
        delta = np.abs(got.astype(np.float64) - want.astype(np.float64))
        return f"{int((delta > 0).sum())} of {want.size} values differ, by up to {float(delta.max()):.3g}"
    return f"{int((got != want).sum())} of {want.size} values differ"
