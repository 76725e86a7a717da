"""The learning curve of ``examples/real/smollm2-arithmetic.yaml`` over several seeds, as the README
shows it: greedy eval accuracy (and the mean sampled reward) of each seed's run against the step, the
model before training at step -1, drawn as an SVG with :mod:`plasmid.app.curve`'s renderer, and a
Markdown table of the eval points printed on stdout.

    plasmid eval --config examples/real/smollm2-arithmetic.yaml --output runs/recipe/base.json
    plasmid train --config examples/real/smollm2-arithmetic.yaml --seed S --run-dir runs/recipe/seedS  # S = 0, 1, 2
    python examples/real/recipe_curve.py runs/recipe/base.json runs/recipe/seed0 runs/recipe/seed1 \\
        runs/recipe/seed2 --out docs/smollm2-recipe.svg

The base file is ``plasmid eval``'s JSON (its first set's ``accuracy``); each run directory's
``metrics.jsonl`` gives ``eval/accuracy`` and ``rollout/reward_mean`` per step.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from plasmid.app.curve import COLORS, Line, Panel, render_svg


def read_run(run_dir: Path) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """``(eval accuracy points, sampled reward points)`` of a run directory, each ``(step, value)``."""
    entries = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [(float(entry["step"]), float(entry["eval/accuracy"])) for entry in entries if "eval/accuracy" in entry]
    rewards = [(float(entry["step"]), float(entry["rollout/reward_mean"])) for entry in entries
               if "rollout/reward_mean" in entry]
    return evals, rewards


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("base", type=Path, help="plasmid eval's JSON for the model before training")
    parser.add_argument("runs", type=Path, nargs="+", help="the seeds' run directories")
    parser.add_argument("--out", type=Path, required=True, help="the SVG file to write")
    args = parser.parse_args(argv)
    base = float(next(iter(json.loads(args.base.read_text())["sets"].values()))["accuracy"])
    accuracy, reward = [], []
    table: dict[float, list[float]] = {-1.0: [base] * len(args.runs)}
    for number, run_dir in enumerate(args.runs):
        evals, rewards = read_run(run_dir)
        color = COLORS[number % len(COLORS)]
        accuracy.append(Line(run_dir.name, color, [(-1.0, base), *evals], markers=True))
        reward.append(Line(run_dir.name, color, rewards))
        for step, value in evals:
            table.setdefault(step, [float("nan")] * len(args.runs))[number] = value
    args.out.write_text(render_svg("SmolLM2-135M-Instruct, GRPO on word problems (step -1: before training)",
                                   [Panel("eval accuracy (greedy)", accuracy, "unit"),
                                    Panel("sampled reward (mean)", reward, "unit")]), encoding="utf-8")
    print("| step | " + " | ".join(run.name for run in args.runs) + " | median |")
    print("|---|" + "---|" * (len(args.runs) + 1))
    for step in sorted(table):
        values = table[step]
        finite = sorted(value for value in values if value == value)
        median = finite[len(finite) // 2] if finite else float("nan")
        print(f"| {int(step)} | " + " | ".join(f"{value:.2f}" for value in values) + f" | {median:.2f} |")


if __name__ == "__main__":
    main()
