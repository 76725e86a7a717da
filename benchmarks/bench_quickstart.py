"""Time to learn the quickstart: ``plasmid train`` against a raw PyTorch loop, same run.

Both start from chance on the mod10 task with the same model recipe and hyperparameters and
stop when greedy eval accuracy (all 100 prompts, every 10 steps) reaches 0.9. Both are timed the
same way: each process's wall-clock from spawn to exit (imports, model build, plasmid's final
model save and the process's exit included). Each seed runs both; medians are printed with
the ratio plasmid / raw.

    python benchmarks/bench_quickstart.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_plasmid(seed: int) -> dict:
    run_dir = Path(tempfile.mkdtemp()) / "run"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "plasmid.app.cli", "train", "--seed", str(seed), "--stop-at-eval-acc", "0.9",
                    "--eval-interval", "10", "--num-rollouts", "1000", "--save-interval", "0",
                    "--run-dir", str(run_dir)], check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [m["eval/accuracy"] for m in metrics if "eval/accuracy" in m]
    return {"seconds": seconds, "steps": len(metrics), "eval_accuracy": evals[-1]}


def run_raw(seed: int) -> dict:
    """The raw loop's steps and accuracy from its JSON line; its time, like plasmid's, is the
    process's wall-clock from spawn to exit (its own figure leaves out interpreter start and exit)."""
    started = time.perf_counter()
    out = subprocess.run([sys.executable, str(HERE / "raw_grpo_loop.py"), "--seed", str(seed)], check=True,
                         capture_output=True, text=True)
    seconds = time.perf_counter() - started
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = []
    for seed in args.seeds:
        plasmid_result, raw_result = run_plasmid(seed), run_raw(seed)
        rows.append((plasmid_result, raw_result))
        print(f"seed {seed}: plasmid {plasmid_result['seconds']:6.1f} s ({plasmid_result['steps']} steps, "
              f"acc {plasmid_result['eval_accuracy']:.2f})   raw {raw_result['seconds']:6.1f} s "
              f"({raw_result['steps']} steps, acc {raw_result['eval_accuracy']:.2f})", flush=True)
    plasmid_median = statistics.median(r[0]["seconds"] for r in rows)
    raw_median = statistics.median(r[1]["seconds"] for r in rows)
    step_ms_plasmid = statistics.median(1000 * r[0]["seconds"] / r[0]["steps"] for r in rows)
    step_ms_raw = statistics.median(1000 * r[1]["seconds"] / r[1]["steps"] for r in rows)
    print(f"median time to eval acc >= 0.9: plasmid {plasmid_median:.1f} s, raw loop {raw_median:.1f} s, "
          f"ratio {plasmid_median / raw_median:.2f}")
    print(f"median wall-clock per step (incl. start-up): plasmid {step_ms_plasmid:.0f} ms, raw {step_ms_raw:.0f} ms")


if __name__ == "__main__":
    main()
