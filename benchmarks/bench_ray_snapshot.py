"""What Ray step snapshots cost: the Ray quickstart's steady step with ``--ray-step-snapshot`` set
each way, same run, against ``off``.

``plasmid train --runtime ray`` (2 engines, ``--trainer-workers`` N, the quickstart's task and
tiny model) runs a fixed number of steps with ``--profile`` for every setting, the settings
alternating seed by seed so that load on the machine falls on all alike. The figure is the median
``time/step_seconds`` after ``--warmup`` steps; each run also prints whether ``auto`` turned
snapshots off (its report line). Needs the Ray runtime (``pip install -e plugins/runtimes/ray``,
or the ``ray`` tox env's interpreter).

    python benchmarks/bench_ray_snapshot.py --trainer-workers 2 --settings auto on off --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_steady_step import steady_step


def run(setting: str, seed: int, args: argparse.Namespace) -> tuple[float, bool]:
    """Median steady ``time/step_seconds`` of one run, and whether ``auto`` turned snapshots off."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    env.setdefault("RAY_AUTH_MODE", "disabled")
    seconds, stderr = steady_step(["--runtime", "ray", "--engines", "2", "--trainer-workers", str(args.trainer_workers),
                                   "--seed", str(seed), "--num-rollouts", str(args.steps), "--eval-interval", "0",
                                   "--save-interval", "0", "--ray-step-snapshot", setting, *args.extra],
                                  args.warmup, env, name="bench_ray_snapshot")
    return seconds, "--ray-step-snapshot auto: off" in stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainer-workers", type=int, default=2)
    parser.add_argument("--settings", nargs="+", default=["auto", "on", "off"], choices=["auto", "on", "off"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more plasmid train arguments")
    args = parser.parse_args()
    medians: dict[str, list[float]] = {setting: [] for setting in args.settings}
    for seed in args.seeds:
        for setting in args.settings:
            seconds, turned_off = run(setting, seed, args)
            medians[setting].append(seconds)
            note = " (auto turned snapshots off)" if turned_off else ""
            print(f"seed {seed} --ray-step-snapshot {setting}: {1000 * seconds:.0f} ms/step{note}", flush=True)
    base = statistics.median(medians["off"]) if "off" in medians else None
    for setting, values in medians.items():
        ratio = f", ratio to off {statistics.median(values) / base:.2f}" if base else ""
        print(f"--trainer-workers {args.trainer_workers} --ray-step-snapshot {setting}: median step "
              f"{1000 * statistics.median(values):.0f} ms{ratio}")


if __name__ == "__main__":
    main()
