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

    OMP_NUM_THREADS=1 python benchmarks/bench_weight_sync.py --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

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


#: What the load checks cost (plasmid_torch.sync_guard): none, the defaults (CRC32 of every tensor
#: sent; the read-back every 50 syncs is not reached here) and a sampled read-back after every sync.
CHECKS = {"off": {"sync_checksums": "off", "verify_sync_every": 0},
          "default": {},
          "read-back 1": {"verify_sync_every": 1}}


def check_rows(model_dir: Path, work: Path, engines: int, repeats: int, vocab: int) -> list[tuple[str, list[float]]]:
    """Per local sync, the median milliseconds of a sync under each of :data:`CHECKS`."""
    rows = []
    for label, name, share in (("inprocess", "inprocess", "off"), ("inprocess-shared", "inprocess", "auto"),
                               ("disk", "disk", "off"), ("delta", "delta", "off")):
        times = []
        for number, checks in enumerate(CHECKS.values()):
            config = make_config(*PLUGINS, model=str(model_dir), run_dir=work / f"checks-{label}-{number}", lr=1e-6,
                                 update_weight_buffer_size=16 * MB, inprocess_share_weights=share, **checks)
            loss = build("loss", "grpo", *PLUGINS, config=config)
            trainer = build("trainer", "torchtrain", *PLUGINS, config=config, args=(loss,))
            served = [build("engine", "torchgen", *PLUGINS, config=config) for _ in range(engines)]
            sync = build("weight_sync", name, *PLUGINS, config=config)
            _speed, last = asyncio.run(time_syncs(sync, trainer, served, repeats, vocab, 1))
            times.append(last["seconds"] * 1000)
        rows.append((label, times))
    return rows


def local_rows(model_dir: Path, work: Path, engines: int, repeats: int, vocab: int) -> list[tuple[str, float, dict]]:
    rows = []
    # inprocess copies (--inprocess-share-weights off); inprocess-shared hands the trainer's own tensors over:
    # its MB/s is the model's bytes over the sync's seconds (nothing is copied)
    for label, name, share in (("inprocess", "inprocess", "off"), ("inprocess-shared", "inprocess", "auto"),
                               ("disk", "disk", "off"), ("delta", "delta", "off")):
        config = make_config(*PLUGINS, model=str(model_dir), run_dir=work / f"local-{label}", lr=1e-6,
                             update_weight_buffer_size=16 * MB, inprocess_share_weights=share)
        loss = build("loss", "grpo", *PLUGINS, config=config)
        trainer = build("trainer", "torchtrain", *PLUGINS, config=config, args=(loss,))
        served = [build("engine", "torchgen", *PLUGINS, config=config) for _ in range(engines)]
        sync = build("weight_sync", name, *PLUGINS, config=config)
        speed, last = asyncio.run(time_syncs(sync, trainer, served, repeats, vocab, 1))
        rows.append((f"local  {label}", speed, last))
    return rows


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
                        help="also time each local sync with its load checks off, at their defaults, and with a "
                             "read-back after every sync")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="plasmid-bench-sync-"))
    model_dir = build_tiny_model(work / "model", hidden_size=args.hidden, num_layers=args.layers, num_heads=8,
                                 tie_word_embeddings=False)
    model = load_causal_lm(str(model_dir))
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    vocab = model.config.vocab_size
    del model
    print(f"model: hidden {args.hidden}, {args.layers} layers, {size / MB:.1f} MB float32; {args.engines} engines; "
          f"median of {args.repeats} syncs", flush=True)
    baseline = baseline_copy(model_dir, args.repeats)
    rows = [("in-process copy (baseline)", baseline, {})]
    rows += local_rows(model_dir, work, args.engines, args.repeats, vocab)
    if not args.no_ray:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("ray is not installed: skipping the Ray runtime's syncs")
        else:
            rows += ray_rows(model_dir, work, args.engines, args.repeats, vocab)
    checks = check_rows(model_dir, work, args.engines, args.repeats, vocab) if args.checks else []
    shutil.rmtree(work, ignore_errors=True)
    print(f"{'sync':<28} {'MB/s':>9} {'x baseline':>11}  notes")
    for name, speed, last in rows:
        notes = ""
        if "sync/compression_ratio" in last:
            notes = f"wrote {last['bytes'] / MB:.1f} MB, compression {last['sync/compression_ratio']:.2f}x"
        print(f"{name:<28} {speed:9.1f} {speed / baseline:11.3f}  {notes}", flush=True)
    if checks:
        print(f"\n{'ms per sync, checks:':<28}" + "".join(f" {label:>12}" for label in CHECKS))
        for label, times in checks:
            print(f"{'local  ' + label:<28}" + "".join(f" {ms:12.1f}" for ms in times), flush=True)


if __name__ == "__main__":
    main()
