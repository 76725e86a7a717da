"""Steady-state step time of the quickstart: this checkout against an earlier revision, same run.

``plasmid train`` with the quickstart's defaults (mod10, embedded engine and trainer) runs a fixed
number of steps with ``--profile``; the figure is the median of ``time/step_seconds`` over the
steps after the first ``--warmup`` (model build, first compilation and allocator growth excluded).
The earlier revision is exported with ``git archive`` into a temporary directory and put first on
``PYTHONPATH`` (every ``src`` directory of the kernel, the libraries and the plugins), so the
same interpreter and installed packages run both; revisions alternate, seed by seed, so load on
the machine falls on both alike. Prints each run, the medians and the ratio now / before.

    python benchmarks/bench_steady_step.py --before 6e780da --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def export_revision(revision: str, into: Path) -> list[str]:
    """Extract ``revision`` of this repository under ``into``; return its ``src`` directories. Exits 2
    with one line when the revision is not a commit of this clone (a shallow clone, a typo)."""
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{revision}^{{commit}}"], capture_output=True)
    if known.returncode != 0:
        print(f"bench_steady_step: --before {revision} is not a commit of this clone", file=sys.stderr)
        raise SystemExit(2)
    archive = into / "revision.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), revision], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return sorted(str(src) for src in (into / "tree").glob("**/src") if src.is_dir())


def steady_step(argv: list[str], warmup: int, env: dict[str, str] | None = None, name: str = "bench_steady_step",
                ) -> tuple[float, str]:
    """Run ``plasmid train ARGV --profile --run-dir <temp>`` (in ``env``); the median
    ``time/step_seconds`` after ``warmup`` steps and the run's stderr. A failed run exits with one
    line naming the file its stderr was written to."""
    run_dir = Path(tempfile.mkdtemp()) / "run"
    done = subprocess.run([sys.executable, "-m", "plasmid.app.cli", "train", *argv, "--profile",
                           "--run-dir", str(run_dir)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        log = run_dir.parent / "stderr.log"
        log.write_text(done.stderr)
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"{name}: plasmid train {' '.join(argv)} failed (its output: {log}): {tail}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    times = [row["time/step_seconds"] for row in rows if "time/step_seconds" in row][warmup:]
    if not times:
        raise SystemExit(f"{name}: the run logged no time/step_seconds after {warmup} steps")
    return statistics.median(times), done.stderr


def step_seconds(seed: int, steps: int, warmup: int, pythonpath: list[str] | None) -> float:
    """Median ``time/step_seconds`` after ``warmup`` steps of one quickstart run."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(pythonpath + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return steady_step(["--seed", str(seed), "--num-rollouts", str(steps), "--eval-interval", "0",
                        "--save-interval", "0"], warmup, env)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision to compare against")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        before_path = export_revision(args.before, Path(scratch))
        now, before = [], []
        for seed in args.seeds:
            before.append(step_seconds(seed, args.steps, args.warmup, before_path))
            now.append(step_seconds(seed, args.steps, args.warmup, None))
            print(f"seed {seed}: before ({args.before}) {1000 * before[-1]:.1f} ms/step, "
                  f"now {1000 * now[-1]:.1f} ms/step", flush=True)
    print(f"median steady step: before {1000 * statistics.median(before):.1f} ms, "
          f"now {1000 * statistics.median(now):.1f} ms, ratio now/before "
          f"{statistics.median(now) / statistics.median(before):.2f}")


if __name__ == "__main__":
    main()
