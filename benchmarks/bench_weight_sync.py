"""Throughput of every weight sync against an in-process copy of the same tensors, same run.

Builds a tiny-config model with a bigger hidden size (``--hidden 512 --layers 3``: 12.8 M
float32 parameters, 51 MB) and, in one process:

(a) the baseline: ``tensor.copy_`` of every exported tensor into a second model of the same
    config in this process (what ``inprocess`` does at best), in MB/s;
(b) ``--runtime local`` syncs (trainer and ``--engines`` engines in this process):
    ``inprocess`` copying (``--inprocess-share-weights off``), ``inprocess-shared`` (the engines
    serve the trainer's tensors: nothing is copied, the sync only hands them over and sets the
    version), ``disk``, ``delta``;
(c) with Ray installed, the same trainer and engines in Ray actors (a local cluster started
    here): ``inprocess`` (through the driver), ``objectstore``, ``broadcast``, ``disk``, ``delta``.

Before each timed sync the trainer takes one training step (lr 1e-6, as in RL fine-tuning), so
every sync moves new weights and ``delta`` sees realistic differences. MB/s is the model's tensor
bytes (``sync/raw_bytes`` for delta) over the sync's wall clock, counted once per sync although
every engine receives them, the median of ``--repeats``; the next column is that over the
baseline (above 1: faster than an in-process copy of one model).

``--checks`` adds, per local sync, the milliseconds of a sync with the load checks off, with
checksums (the default), with a read-back of 8 tensors per engine after every sync and with the
probe after every sync, and each over "off". The local syncs share one trainer (its step guard
off: its per-step snapshot is a training cost, and only syncs are timed); each setting has its
own sync and engines, and after each training step every setting syncs the same new weights
(:func:`time_local`), so a round costs one step, not one per setting.

    OMP_NUM_THREADS=1 python benchmarks/bench_weight_sync.py --repeats 3
    OMP_NUM_THREADS=1 python benchmarks/bench_weight_sync.py --checks --hidden 1024 --layers 8 --no-ray  # 134 M
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import plasmid_grpo.plugin as grpo_plugin
import plasmid_sync.plugin as sync_plugin
import plasmid_torchgen.plugin as torchgen_plugin
import plasmid_torchtrain.plugin as torchtrain_plugin
import torch

from plasmid.testing import build, make_config
from plasmid_torch.hf import load_causal_lm
from plasmid_torch.testing.batches import make_rollout_batch
from plasmid_torch.tiny import build_tiny_model

PLUGINS = (sync_plugin, grpo_plugin, torchtrain_plugin, torchgen_plugin)
MB = 1024 * 1024


def baseline_copy(model_dir: Path, repeats: int) -> float:
    """MB/s of ``copy_`` of every tensor of one model into another in this process (one copy each,
    no intermediate clone)."""
    source, target = load_causal_lm(str(model_dir)), load_causal_lm(str(model_dir))
    tensors = dict(target.state_dict())
    total = sum(t.numel() * t.element_size() for t in source.state_dict().values())
    speeds = []
    for _ in range(repeats):
        started = time.perf_counter()
        with torch.no_grad():
            for name, tensor in source.state_dict().items():
                tensors[name].copy_(tensor)
        speeds.append(total / MB / (time.perf_counter() - started))
    return statistics.median(speeds)


async def time_syncs(sync, trainer, engines, repeats: int, vocab: int, first_version: int) -> tuple[float, dict]:
    """Median MB/s of ``repeats`` syncs, each after a training step; the last report's metrics
    (with ``seconds``: the median seconds of a sync)."""
    speeds, seconds, report = [], [], None
    for repeat in range(repeats + 1):   # the first sync warms up (delta: writes a full snapshot)
        await trainer.train_step(make_rollout_batch(vocab, seed=repeat))
        report = await sync.sync(trainer, engines, first_version + repeat)
        raw = report.metrics.get("sync/raw_bytes", report.metrics.get("sync/shared_bytes", report.bytes))
        if repeat:
            speeds.append(raw / MB / report.seconds)
            seconds.append(report.seconds)
    return statistics.median(speeds), {"bytes": report.bytes, "seconds": statistics.median(seconds), **report.metrics}


#: What the load checks cost (plasmid_torch.sync_guard), one column each with ``--checks``: none;
#: the defaults (CRC32 of every tensor sent; the default read-back every 50 syncs is not reached
#: here); and after every sync, on top of the CRC32s, a read-back of 8 sampled tensors per engine,
#: or the probe (4 fixed sequences scored by every engine and the trainer).
CHECKS = {"off": {"sync_checksums": "off", "verify_sync_every": 0},
          "checksums": {},
          "read-back": {"verify_sync_every": 1, "verify_sync_check": "read-back"},
          "probe": {"verify_sync_every": 1, "verify_sync_check": "probe"}}
#: The local runtime's syncs: (label, --weight-sync, --inprocess-share-weights). ``inprocess``
#: copies; ``inprocess-shared`` hands the trainer's own tensors over (its MB/s is the model's bytes
#: over the sync's seconds: nothing is copied).
LOCAL = (("inprocess", "inprocess", "off"), ("inprocess-shared", "inprocess", "auto"),
         ("disk", "disk", "off"), ("delta", "delta", "off"))


async def time_settings(trainer, setups: dict[str, tuple], repeats: int, vocab: int) -> dict[str, dict]:
    """``setups``: per setting, ``(sync, engines)`` sharing ``trainer``. A first sync of each warms
    up (delta: its full snapshot); then ``repeats`` times one training step and one sync of each
    setting, in an order rotated by one per repeat. Per setting: the median ``seconds`` and
    ``mb_per_second`` of its timed syncs and its last report's ``bytes`` and metrics."""
    seconds: dict[str, list[float]] = {name: [] for name in setups}
    speeds: dict[str, list[float]] = {name: [] for name in setups}
    last: dict[str, Any] = {}
    for sync, engines in setups.values():
        await sync.sync(trainer, engines, 1)
    order = list(setups)
    for repeat in range(repeats):
        await trainer.train_step(make_rollout_batch(vocab, seed=repeat))
        for name in order[repeat % len(order):] + order[:repeat % len(order)]:
            sync, engines = setups[name]
            report = await sync.sync(trainer, engines, repeat + 2)
            raw = report.metrics.get("sync/raw_bytes", report.metrics.get("sync/shared_bytes", report.bytes))
            seconds[name].append(report.seconds)
            speeds[name].append(raw / MB / report.seconds)
            last[name] = report
    return {name: {"seconds": statistics.median(seconds[name]), "mb_per_second": statistics.median(speeds[name]),
                   "bytes": last[name].bytes, **last[name].metrics} for name in setups}


def time_local(model_dir: Path, work: Path, engines: int, repeats: int, vocab: int,
               checks: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """Every local sync of :data:`LOCAL` under every setting of ``checks`` (name -> options):
    ``{label: {setting: {"seconds", "mb_per_second", "bytes", **metrics}}}``.

    One trainer serves them all, built with its step guard off (``--max-update-ratio 0``): only
    syncs are timed, and the guard's per-step snapshot of the weights and optimizer state would
    make each untimed step cost as much again. Before each timed round the trainer takes one
    training step (lr 1e-6, as in RL fine-tuning), so every sync moves new weights and ``delta``
    sees realistic differences; every setting has its own sync and its own engines, so each
    setting's sync moves the same new weights (:func:`time_settings`)."""
    config = make_config(*PLUGINS, model=str(model_dir), run_dir=work / "trainer", lr=1e-6, max_update_ratio=0.0)
    trainer = build("trainer", "torchtrain", *PLUGINS, config=config, args=(build("loss", "grpo", *PLUGINS,
                                                                                     config=config),))
    results = {}
    for label, name, share in LOCAL:
        setups = {}
        for number, (setting, options) in enumerate(checks.items()):
            config = make_config(*PLUGINS, model=str(model_dir), run_dir=work / f"local-{label}-{number}", lr=1e-6,
                                 update_weight_buffer_size=16 * MB, inprocess_share_weights=share, **options)
            setups[setting] = (build("weight_sync", name, *PLUGINS, config=config),
                               [build("engine", "torchgen", *PLUGINS, config=config) for _ in range(engines)])
        results[label] = asyncio.run(time_settings(trainer, setups, repeats, vocab))
        del setups
        gc.collect()  # this sync's engines and copies go before the next sync's are built
        for number in range(len(checks)):
            shutil.rmtree(work / f"local-{label}-{number}", ignore_errors=True)
    return results


def local_rows(model_dir: Path, work: Path, engines: int, repeats: int, vocab: int,
               timed: dict[str, dict[str, dict]] | None = None) -> list[tuple[str, float, dict]]:
    """Each local sync's MB/s with the default checks: from ``timed`` (:func:`time_local` with a
    ``checksums`` setting) when given, else measured here."""
    timed = timed or time_local(model_dir, work, engines, repeats, vocab, {"checksums": CHECKS["checksums"]})
    return [(f"local  {label}", timed[label]["checksums"]["mb_per_second"], timed[label]["checksums"])
            for label, _name, _share in LOCAL]


def ray_rows(model_dir: Path, work: Path, engines: int, repeats: int, vocab: int) -> list[tuple[str, float, dict]]:
    import ray
    from plasmid_ray.cluster import ACTOR_ENV
    from plasmid_ray.engines import EnginePool
    from plasmid_ray.placement import Placement, Resources
    from plasmid_ray.trainer import start_trainers

    from plasmid.plugins import PluginManager, Selection

    for name, value in {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}.items():
        os.environ.setdefault(name, value)
    temp = tempfile.mkdtemp(prefix="plasmid-bench-", dir="/tmp")
    ray.init(num_cpus=1 + engines, include_dashboard=False, _temp_dir=temp, runtime_env={"env_vars": ACTOR_ENV},
             log_to_driver=False)
    manager = PluginManager()
    manager.load(Selection())
    rows = []
    try:
        config = make_config(*PLUGINS, model=str(model_dir), run_dir=work / "ray", lr=1e-6,
                             update_weight_buffer_size=16 * MB)
        config.plugin_lock = manager.lock()
        placement = Placement.unplaced(1, engines, Resources(1.0), Resources(1.0))

        async def start():
            return await start_trainers(config, placement), await EnginePool(config, placement).start()

        trainer, proxies = asyncio.run(start())
        for number, name in enumerate(("inprocess", "objectstore", "broadcast", "disk", "delta")):
            config.run_dir = work / f"ray-{name}"
            sync = build("weight_sync", name, *PLUGINS, config=config)
            speed, last = asyncio.run(time_syncs(sync, trainer, proxies, repeats, vocab, 100 * (number + 1)))
            rows.append((f"ray    {name}", speed, last))
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-ray", action="store_true", help="only the local runtime's syncs")
    parser.add_argument("--checks", action="store_true",
                        help="also time each local sync with its load checks off, with checksums (the default), and "
                             "with a read-back or the probe after every sync")
    args = parser.parse_args()
    torch.set_num_threads(1)
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="plasmid-bench-sync-"))
    model_dir = build_tiny_model(work / "model", hidden_size=args.hidden, num_layers=args.layers, num_heads=8,
                                 tie_word_embeddings=False)
    model = load_causal_lm(str(model_dir))
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    parameters = sum(p.numel() for p in model.parameters())
    vocab = model.config.vocab_size
    del model
    print(f"model: hidden {args.hidden}, {args.layers} layers, {parameters / 1e6:.1f} M parameters, "
          f"{size / MB:.1f} MB float32; {args.engines} engines; median of {args.repeats} syncs", flush=True)
    baseline = baseline_copy(model_dir, args.repeats)
    rows = [("in-process copy (baseline)", baseline, {})]
    timed = time_local(model_dir, work, args.engines, args.repeats, vocab, CHECKS) if args.checks else None
    rows += local_rows(model_dir, work, args.engines, args.repeats, vocab, timed)
    if not args.no_ray:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("ray is not installed: skipping the Ray runtime's syncs")
        else:
            rows += ray_rows(model_dir, work, args.engines, args.repeats, vocab)
    shutil.rmtree(work, ignore_errors=True)
    print(f"{'sync':<28} {'MB/s':>9} {'x baseline':>11}  notes")
    for name, speed, last in rows:
        notes = ""
        if "sync/compression_ratio" in last:
            notes = f"wrote {last['bytes'] / MB:.1f} MB, compression {last['sync/compression_ratio']:.2f}x"
        print(f"{name:<28} {speed:9.1f} {speed / baseline:11.3f}  {notes}", flush=True)
    if timed:
        checked = [label for label in CHECKS if label != "off"]
        print(f"\n{'ms per sync, checks:':<28}" + "".join(f" {label:>10}" for label in CHECKS)
              + "   x off:" + "".join(f" {label:>10}" for label in checked))
        for label, by_check in timed.items():
            off = by_check["off"]["seconds"]
            print(f"{'local  ' + label:<28}" + "".join(f" {by_check[c]['seconds'] * 1000:10.1f}" for c in CHECKS)
                  + "        " + "".join(f" {by_check[c]['seconds'] / off:10.2f}" for c in checked), flush=True)
    print(f"\nthe benchmark took {time.perf_counter() - began:.0f} s", flush=True)


if __name__ == "__main__":
    main()
