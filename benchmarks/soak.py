"""Soak test: the quickstart trained for a while with faults injected at random.

    python benchmarks/soak.py --minutes 30                 # the figures quoted in notes
    python benchmarks/soak.py --minutes 3 --steps 40       # a quick look

It runs ``plasmid train`` (the CPU quickstart, reward ``soak-exact`` from
``benchmarks/soak_reward.py``) again and again in fresh run directories until the time is up;
every ``--ray-every``-th run uses ``--runtime ray``. While a run trains, faults are injected:

- ``sigkill``: the driver is killed with SIGKILL at a random moment, then the run is resumed
  with ``--resume`` (when it had no checkpoint yet, nothing was kept and it starts again);
- ``engine-kill`` (Ray runs only): an engine actor's process (``ray::EngineHost``) is killed;
  the runtime must restart it, re-sync it and finish the step;
- ``reward-raise`` / ``reward-hang``: the reward raises, or blocks its event loop with
  ``time.sleep`` for ``--hang-seconds`` (far past ``--reward-timeout``), in a random fraction
  of calls (``--raise-p``, ``--hang-p``).

A fault is *survived* when the run it hit goes on: a killed driver resumes and writes further
steps; a killed engine's run writes a step after the kill; a reward fault's process writes a step
after it. Reward faults in a step that a SIGKILL then threw away are *superseded* (the step is
redone), neither survived nor failed. At the end of every run its ``metrics.jsonl`` must hold
each step once, in order, each trained on every sample the step asked for: anything short is
counted in *samples lost*, which must be 0. The last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLUGIN = HERE / "soak_reward.py"
PROMPTS, SAMPLES = 32, 8  # the quickstart's --prompts-per-step and --n-samples-per-prompt
#: the quickstart's plugins, and Ray's
PLUGINS = "tasks,hf,torchgen,rollout,grpo,torchtrain,sync,ray"


@dataclass
class Tally:
    injected: Counter[str] = field(default_factory=Counter)
    survived: Counter[str] = field(default_factory=Counter)
    superseded: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    steps: int = 0
    steps_redone: int = 0
    samples_lost: int = 0
    runs: list[dict[str, object]] = field(default_factory=list)


def plasmid_command() -> list[str]:
    found = shutil.which("plasmid", path=str(Path(sys.executable).parent)) or shutil.which("plasmid")
    if found is None:
        sys.exit("soak: the plasmid command is not installed in this environment")
    return [found]


def read_metrics(path: Path) -> list[dict[str, object]]:
    """The complete lines of ``metrics.jsonl`` (a torn last line is ignored)."""
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def checkpointed_steps(run_dir: Path) -> int:
    """How many steps the run's newest complete checkpoint holds (0: none)."""
    root = run_dir / "checkpoints"
    metas = [p / "meta.json" for p in root.iterdir() if not p.name.endswith(".partial")] if root.is_dir() else []
    return max((json.loads(m.read_text())["rollout_id"] + 1 for m in metas if m.is_file()), default=0)


def engine_pids() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(b"ray::EngineHost"):
                pids.append(int(entry))
    return pids


def reward_faults(log: Path, since: float) -> list[dict[str, object]]:
    if not log.is_file():
        return []
    return [fault for fault in map(json.loads, log.read_text().splitlines()) if fault["time"] >= since]


def last_step_written_at(metrics: Path) -> float:
    return metrics.stat().st_mtime if metrics.is_file() else 0.0


def soak(args: argparse.Namespace) -> Tally:
    rng = random.Random(args.seed)
    work = Path(args.work_dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    fault_log = work / "reward_faults.jsonl"
    env = {**os.environ, "SOAK_RAISE_P": str(args.raise_p), "SOAK_HANG_P": str(args.hang_p),
           "SOAK_HANG_SECONDS": str(args.hang_seconds), "SOAK_FAULT_LOG": str(fault_log),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg", "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    tally = Tally()
    deadline = time.monotonic() + args.minutes * 60
    run_index = 0
    while time.monotonic() < deadline:
        ray = args.ray_every > 0 and run_index % args.ray_every == args.ray_every - 1
        run_dir = work / f"run-{run_index:02d}"
        # a fixed plugin set: packages installed meanwhile must not change the run a --resume continues
        base = [*plasmid_command(), "train", "--plugins", f"{PLUGINS},{PLUGIN}", "--reward", "soak-exact",
                "--reward-timeout", str(args.reward_timeout), "--num-rollouts", str(args.steps),
                "--save-interval", str(args.save_interval), "--eval-interval", "10", "--run-dir", str(run_dir)]
        if ray:
            base += ["--runtime", "ray", "--engines", "2", "--placement", "disaggregate",
                     "--ray-num-cpus", "4", "--weight-sync", "objectstore",
                     "--ray-engine-restarts", "1000"]  # survival is measured here, not the restart budget
        finished = soak_one_run(base, run_dir, ray, rng, env, fault_log, deadline, args, tally)
        check_run(run_dir, args.steps if finished else None, tally, ray)
        run_index += 1
    return tally


def soak_one_run(base: list[str], run_dir: Path, ray: bool, rng: random.Random, env: dict[str, str],
                 fault_log: Path, deadline: float, args: argparse.Namespace, tally: Tally) -> bool:
    """Train one run to its end through faults; True when it completed ``--steps`` steps."""
    pending_kill: float | None = None  # time of a SIGKILL whose run has not resumed past it yet
    unexpected = 0
    while True:
        kept = checkpointed_steps(run_dir)
        resume = kept > 0
        if not resume and run_dir.exists():
            shutil.rmtree(run_dir)  # killed before the first checkpoint: nothing was kept
        written = len(read_metrics(run_dir / "metrics.jsonl"))
        tally.steps_redone += max(0, written - kept)
        before = min(written, kept)
        started = time.time()
        log_path = run_dir.with_suffix(".log")
        with log_path.open("a") as log:
            process = subprocess.Popen([*base, *(["--resume"] if resume else [])], stdout=log,
                                       stderr=subprocess.STDOUT, env=env, start_new_session=True)
            fault_at = time.monotonic() + rng.uniform(args.fault_min, args.fault_max)
            killed = False
            sigkilled_at: float | None = None
            engine_kills: list[float] = []
            while process.poll() is None:
                time.sleep(0.2)
                now = time.monotonic()
                if now >= deadline and not killed and (pending_kill is None or now >= deadline + 300):
                    process.send_signal(signal.SIGTERM)  # time is up: stop the way an operator would
                    killed = True
                    try:
                        process.wait(timeout=120)
                    except subprocess.TimeoutExpired:
                        os.killpg(process.pid, signal.SIGKILL)
                    break
                if now < fault_at or killed:
                    continue
                fault_at = now + rng.uniform(args.fault_min, args.fault_max)
                if ray and rng.random() < 0.5 and (pids := engine_pids()):
                    os.kill(rng.choice(pids), signal.SIGKILL)
                    tally.injected["engine-kill"] += 1
                    engine_kills.append(time.time())
                    continue
                if len(read_metrics(run_dir / "metrics.jsonl")) > before:  # only once this attempt trained
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    tally.injected["sigkill"] += 1
                    sigkilled_at = time.time()
                    killed = True
        code = process.wait()
        metrics = run_dir / "metrics.jsonl"
        wrote_at = last_step_written_at(metrics)
        entries = read_metrics(metrics)
        if pending_kill is not None and len(entries) > before and wrote_at > started:
            tally.survived["sigkill"] += 1  # resumed and trained on after the kill
            pending_kill = None
        if sigkilled_at is not None:
            pending_kill = sigkilled_at
        for when in engine_kills:
            survived = wrote_at > when + 0.5 or code == 0
            tally.survived["engine-kill"] += survived
            if not survived:
                tally.failures.append(f"{run_dir.name}: no step after an engine kill (exit {code})")
        for fault in reward_faults(fault_log, started):
            tally.injected[str(fault["kind"])] += 1
            if wrote_at > float(fault["time"]) + args.reward_timeout or code == 0:
                tally.survived[str(fault["kind"])] += 1
            elif killed:
                tally.superseded[str(fault["kind"])] += 1
            else:
                tally.failures.append(f"{run_dir.name}: a {fault['kind']} was not survived (exit {code})")
        if killed and time.monotonic() >= deadline:
            return code == 0 and len(entries) >= args.steps
        if killed:
            continue
        if code == 0:
            if pending_kill is not None:  # resumed and ran to the end
                tally.survived["sigkill"] += 1
            return True
        unexpected += 1
        tally.failures.append(f"{run_dir.name}: plasmid exited {code} unprompted; see {log_path}")
        if unexpected >= 3:
            return False


def check_run(run_dir: Path, expected_steps: int | None, tally: Tally, ray: bool) -> None:
    """Count the run's steps and every sample it should have trained on but did not."""
    entries = read_metrics(run_dir / "metrics.jsonl")
    steps = [int(entry["step"]) for entry in entries]  # type: ignore[call-overload]
    if steps != list(range(len(steps))):
        tally.failures.append(f"{run_dir.name}: metrics.jsonl steps are not 0..{len(steps) - 1} once each: {steps}")
    total = expected_steps if expected_steps is not None else len(steps)
    trained = {int(e["step"]): int(e.get("train/samples", 0)) for e in entries}  # type: ignore[call-overload]
    lost = sum(PROMPTS * SAMPLES - trained.get(step, 0) for step in range(total))
    tally.samples_lost += lost
    tally.steps += len(set(steps))
    evals = [float(e["eval/accuracy"]) for e in entries if e.get("eval/accuracy") is not None]  # type: ignore[arg-type]
    tally.runs.append({"run": run_dir.name, "runtime": "ray" if ray else "local", "steps": len(set(steps)),
                       "completed": expected_steps is not None, "final_eval_accuracy": evals[-1] if evals else None,
                       "samples_lost": lost})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--steps", type=int, default=200, help="steps per run")
    parser.add_argument("--save-interval", type=int, default=10)
    parser.add_argument("--ray-every", type=int, default=3, help="every Nth run uses --runtime ray (0: never)")
    parser.add_argument("--fault-min", type=float, default=15.0, help="seconds between driver/engine faults, at least")
    parser.add_argument("--fault-max", type=float, default=60.0)
    parser.add_argument("--raise-p", type=float, default=0.002, help="probability that a reward call raises")
    parser.add_argument("--hang-p", type=float, default=0.0005, help="probability that a reward call hangs")
    parser.add_argument("--hang-seconds", type=float, default=30.0, help="how long a hanging reward call blocks")
    parser.add_argument("--reward-timeout", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", default=str(HERE.parent / "runs" / "soak"))
    args = parser.parse_args()
    began = time.monotonic()
    tally = soak(args)
    for run in tally.runs:
        print(json.dumps(run))
    for failure in tally.failures:
        print("FAILURE:", failure)
    print(f"minutes {(time.monotonic() - began) / 60:.1f}  steps {tally.steps} (redone after kills: "
          f"{tally.steps_redone})  faults injected {sum(tally.injected.values())}  survived "
          f"{sum(tally.survived.values())}  superseded {sum(tally.superseded.values())}  samples lost "
          f"{tally.samples_lost}")
    completed = [run for run in tally.runs if run["final_eval_accuracy"] is not None]
    summary = {"minutes": round((time.monotonic() - began) / 60, 1), "steps": tally.steps,
               "steps_redone": tally.steps_redone, "injected": dict(tally.injected),
               "survived": dict(tally.survived), "superseded": dict(tally.superseded),
               "failures": len(tally.failures), "samples_lost": tally.samples_lost,
               "final_eval_accuracy": completed[-1]["final_eval_accuracy"] if completed else None}
    print(json.dumps(summary))
    sys.exit(1 if tally.failures or tally.samples_lost else 0)


if __name__ == "__main__":
    main()
