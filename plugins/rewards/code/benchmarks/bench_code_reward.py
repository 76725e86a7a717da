"""Samples per second of the ``code`` reward on the labelled set ``examples/data/tiny-programs.jsonl``.

Each row is scored twice: with a correct program (``x = A + B``) and with a wrong one
(``x = A - B``), as a policy's responses would be, at the reward's default concurrency (2).
Run with ``OMP_NUM_THREADS=1 python plugins/rewards/code/benchmarks/bench_code_reward.py [--repeats N]``;
prints one line per repeat and the median. ``PYTHONPATH=<another src>`` measures another version.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import plasmid_code
import plasmid_code.plugin

from plasmid.testing import build, make_config
from plasmid.types import Sample

DATA = Path(__file__).resolve().parents[4] / "examples" / "data" / "tiny-programs.jsonl"


def samples() -> list[Sample]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    out = []
    for row in rows:
        a, b = row["prompt"].rstrip("=").split("+")
        for program in (f"x = {a} + {b}", f"x = {a} - {b}"):
            out.append(Sample(prompt=row["prompt"], response=f"```python\n{program}\n```", label=row["label"],
                              index=len(out)))
    return out


async def score_all(reward, batch: list[Sample]) -> list[float]:
    return await asyncio.gather(*(reward(sample) for sample in batch))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    reward = build("reward", "code", plasmid_code.plugin, config=make_config(plasmid_code.plugin))
    batch = samples()
    loop = asyncio.new_event_loop()
    scores = loop.run_until_complete(score_all(reward, batch[:2]))  # the probe, outside the timing
    rates = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        scores = loop.run_until_complete(score_all(reward, batch))
        rates.append(len(batch) / (time.perf_counter() - started))
        print(f"{rates[-1]:.2f} samples/s (mean score {sum(scores) / len(scores):.3f})", flush=True)
    print(f"median {statistics.median(rates):.2f} samples/s ({plasmid_code.__file__})")


if __name__ == "__main__":
    main()
