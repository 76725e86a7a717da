"""Scaling curves: step time and peak memory as the batch, the group and the response double, the
Ray runtime with 1 and 2 trainer workers, and every weight sync's MB/s on a >= 100M-parameter model.

Each step-time point is one ``plasmid train --profile`` run of the quickstart recipe in a fresh
process (``--eval-interval 0 --save-interval 0``): the median ``time/step_seconds`` of the steps
after ``--warmup`` (start-up excluded), with the median rollout, train, sync and overhead parts,
and the process's peak RSS (``ru_maxrss`` of the finished child, start-up included; with Ray, the
driver's only: the trainer and engine actors are not its children). On a GPU the torch allocator's
peak is not read: the RSS column is host memory.

- batch: ``--prompts-per-step`` B, 2B, 4B (group size G);
- group: ``--n-samples-per-prompt`` G, 2G, 4G (B prompts);
- response length: ``--task reverse --task-length`` L, 2L, 4L (the answer is L tokens, then <eos>);
- Ray: ``--runtime ray --trainer-workers 1`` and ``2`` (a local Ray cluster each; skipped without
  plasmid-ray; ``--no-ray`` skips it);
- weight sync: :mod:`bench_weight_sync` (beside this file) on a model built from a config
  (``--sync-hidden 1024 --sync-layers 6``: 101M float32 parameters), every sync it knows against an
  in-process copy.

Tables are printed; everything is written as JSON to ``--json`` (default ``runs/bench/bench_scaling.json``).

    OMP_NUM_THREADS=1 python benchmarks/bench_scaling.py --quick       # a few minutes on 2 idle cores
    OMP_NUM_THREADS=1 python benchmarks/bench_scaling.py               # the full curves
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MB = 1024 * 1024
#: settings of each mode: base prompts per step, samples per prompt, answer length, steps, warm-up steps
MODES = {"quick": {"batch": 8, "group": 4, "length": 3, "steps": 8, "warmup": 3},
         "full": {"batch": 16, "group": 8, "length": 4, "steps": 30, "warmup": 5}}
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
PARTS = {"rollout": "time/rollout_seconds", "train": "time/train_seconds", "sync": "time/sync_wall_seconds",
         "overhead": "time/overhead_seconds"}


def train_point(work: Path, name: str, options: list[str], steps: int, warmup: int,
                env: dict[str, str] | None = None, timeout: float = 1800) -> dict:
    """One ``plasmid train --profile`` run: its steady-state step time, parts and peak RSS."""
    run_dir = work / name
    argv = [sys.executable, "-m", "plasmid.app.cli", "train", "--seed", "0", "--num-rollouts", str(steps),
            "--eval-interval", "0", "--save-interval", "0", "--profile", "--run-dir", str(run_dir), *options]
    started = time.perf_counter()
    with open(work / f"{name}.log", "w") as log:
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                 env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                child.kill()
                pid, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.2)
        child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    if child.returncode != 0:
        tail = (work / f"{name}.log").read_text().splitlines()[-5:]
        return {"name": name, "options": options, "error": f"exit {child.returncode}: " + " | ".join(tail)}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    point = {"name": name, "options": options, "wall_seconds": wall, "peak_rss_mb": usage.ru_maxrss / 1024,
             **steady_state(rows, warmup)}   # ru_maxrss is in KiB on Linux
    shutil.rmtree(run_dir, ignore_errors=True)
    return point


def steady_state(rows: list[dict], warmup: int) -> dict:
    """The medians over the steps after ``warmup`` of a ``--profile`` run's ``metrics.jsonl`` rows:
    ``step_ms`` and each part's (``rollout_ms``, ...), samples per step and per second, and the mean
    response length."""
    steady = rows[warmup:] or rows
    point = {"steps": len(rows), "step_ms": 1000 * statistics.median(r["time/step_seconds"] for r in steady),
             "samples_per_step": statistics.median(r.get("train/samples", 0.0) for r in steady),
             "response_length_mean": statistics.median(r.get("rollout/response_length_mean", 0.0) for r in steady)}
    for part, key in PARTS.items():
        point[f"{part}_ms"] = 1000 * statistics.median(r.get(key, 0.0) for r in steady)
    point["samples_per_second"] = point["samples_per_step"] / (point["step_ms"] / 1000)
    return point


def curves(work: Path, mode: dict) -> dict[str, list[dict]]:
    batch, group, length, steps, warmup = (mode[k] for k in ("batch", "group", "length", "steps", "warmup"))
    found: dict[str, list[dict]] = {"batch": [], "group": [], "response_length": []}
    for factor in (1, 2, 4):
        found["batch"].append(train_point(work, f"batch{batch * factor}", [
            "--prompts-per-step", str(batch * factor), "--n-samples-per-prompt", str(group)], steps, warmup))
        print_point("batch", found["batch"][-1])
    for factor in (1, 2, 4):
        found["group"].append(train_point(work, f"group{group * factor}", [
            "--prompts-per-step", str(batch), "--n-samples-per-prompt", str(group * factor)], steps, warmup))
        print_point("group", found["group"][-1])
    for factor in (1, 2, 4):
        found["response_length"].append(train_point(work, f"length{length * factor}", [
            "--task", "reverse", "--task-length", str(length * factor), "--prompts-per-step", str(batch),
            "--n-samples-per-prompt", str(group)], steps, warmup))
        print_point("response_length", found["response_length"][-1])
    return found


def ray_points(work: Path, mode: dict) -> list[dict]:
    points = []
    for workers in (1, 2):
        points.append(train_point(work, f"ray{workers}", [
            "--runtime", "ray", "--trainer-workers", str(workers), "--prompts-per-step", str(mode["batch"]),
            "--n-samples-per-prompt", str(mode["group"])], mode["steps"], mode["warmup"], env=RAY_ENV))
        print_point("ray trainer workers", points[-1])
    return points


def sync_rows(work: Path, hidden: int, layers: int, engines: int, repeats: int, with_ray: bool) -> dict:
    """Every weight sync's MB/s on a model built from a config, against an in-process copy."""
    sys.path.insert(0, str(HERE))
    import bench_weight_sync as bws
    import torch

    from plasmid_torch.hf import load_causal_lm
    from plasmid_torch.tiny import build_tiny_model

    torch.set_num_threads(1)
    model_dir = build_tiny_model(work / "sync-model", hidden_size=hidden, num_layers=layers, num_heads=8,
                                 tie_word_embeddings=False)
    model = load_causal_lm(str(model_dir))
    parameters = sum(p.numel() for p in model.parameters())
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    vocab = model.config.vocab_size
    del model
    baseline = bws.baseline_copy(model_dir, repeats)
    rows = [("in-process copy (baseline)", baseline, {})]
    rows += bws.local_rows(model_dir, work, engines, repeats, vocab)
    if with_ray:
        for name, value in RAY_ENV.items():
            os.environ.setdefault(name, value)
        rows += bws.ray_rows(model_dir, work, engines, repeats, vocab)
    return {"parameters": parameters, "megabytes": size / MB, "engines": engines, "repeats": repeats,
            "rows": [{"sync": name.strip(), "mb_per_second": speed, "x_baseline": speed / baseline,
                      **{k: v for k, v in last.items() if isinstance(v, (int, float))}}
                     for name, speed, last in rows]}


def print_point(axis: str, point: dict) -> None:
    if "error" in point:
        print(f"{axis:>20} {point['name']:<12} FAILED {point['error']}", flush=True)
        return
    print(f"{axis:>20} {point['name']:<12} step {point['step_ms']:8.1f} ms  (rollout {point['rollout_ms']:7.1f}  "
          f"train {point['train_ms']:7.1f}  sync {point['sync_ms']:5.1f}  overhead {point['overhead_ms']:5.1f})  "
          f"{point['samples_per_second']:7.0f} samples/s  resp {point['response_length_mean']:4.1f} tok  "
          f"peak RSS {point['peak_rss_mb']:7.0f} MB", flush=True)


def print_tables(result: dict) -> None:
    for axis, points in result.get("curves", {}).items():
        print(f"\n{axis}: {'point':<12} {'step ms':>9} {'samples/s':>10} {'resp tok':>9} {'peak RSS MB':>12}")
        for p in points:
            if "error" in p:
                print(f"{'':>{len(axis) + 2}}{p['name']:<12} FAILED")
                continue
            print(f"{'':>{len(axis) + 2}}{p['name']:<12} {p['step_ms']:9.1f} {p['samples_per_second']:10.0f} "
                  f"{p['response_length_mean']:9.1f} {p['peak_rss_mb']:12.0f}")
    if "sync" in result:
        sync = result["sync"]
        print(f"\nweight sync: {sync['parameters'] / 1e6:.1f}M parameters ({sync['megabytes']:.0f} MB float32), "
              f"{sync['engines']} engine(s), median of {sync['repeats']}")
        print(f"{'sync':<28} {'MB/s':>9} {'x baseline':>11}")
        for row in sync["rows"]:
            print(f"{row['sync']:<28} {row['mb_per_second']:9.1f} {row['x_baseline']:11.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small settings that finish in a few minutes")
    parser.add_argument("--json", type=Path, default=Path("runs/bench/bench_scaling.json"),
                        help="where the JSON results go")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray runtime (points and syncs)")
    parser.add_argument("--only", choices=["curves", "ray", "sync"], action="append",
                        help="run only these parts (repeatable; default: all)")
    parser.add_argument("--sync-hidden", type=int, default=1024, help="hidden size of the weight-sync model")
    parser.add_argument("--sync-layers", type=int, default=6, help="layers of the weight-sync model")
    parser.add_argument("--sync-engines", type=int, default=1)
    parser.add_argument("--sync-repeats", type=int, default=None, help="default: 1 with --quick, else 3")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: the mode's)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mode = dict(MODES["quick" if args.quick else "full"])
    if args.steps is not None:
        mode["steps"], mode["warmup"] = args.steps, min(mode["warmup"], max(0, args.steps - 1))
    parts = set(args.only or ["curves", "ray", "sync"])
    try:
        import plasmid_ray  # noqa: F401
        has_ray = not args.no_ray
    except ImportError:
        has_ray = False
    result: dict = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                "python": platform.python_version()},
                    "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "mode": mode, "quick": args.quick}
    work = Path(tempfile.mkdtemp(prefix="plasmid-bench-scaling-"))
    started = time.perf_counter()
    try:
        if "curves" in parts:
            result["curves"] = curves(work, mode)
        if "ray" in parts:
            if has_ray:
                result["curves"] = {**result.get("curves", {}), "ray_trainer_workers": ray_points(work, mode)}
            else:
                print("ray: skipped (plasmid-ray not installed, or --no-ray)")
        if "sync" in parts:
            repeats = args.sync_repeats or (1 if args.quick else 3)
            result["sync"] = sync_rows(work, args.sync_hidden, args.sync_layers, args.sync_engines, repeats,
                                       with_ray=has_ray)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["seconds"] = time.perf_counter() - started
    print_tables(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(f"\nwritten: {args.json} ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
