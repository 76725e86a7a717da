"""Samples/s of torchgen's path for prompts with images: one request at a time against one batch.

Builds the tiny Qwen2-VL of ``--task colours`` (:func:`plasmid_torch.tiny_vision.build_tiny_vlm`, no warm
start) in a temporary directory and answers ``--prompts`` colours prompts x ``--group-size`` samples
(an RL step's rollout; temperature 1, ``max_new_tokens`` 7, ``<eos>`` as stop token, every request seeded)
three ways, alternately, ``--repeats`` times:

(a) ``hf-one``: transformers' ``generate`` one request at a time (:func:`plasmid_torch.vision.generate`,
    what torchgen's vision path did before it batched);
(b) ``one``: the ``torchgen`` engine's ``generate_with_images``, awaited one call at a time;
(c) ``batched``: the same engine with every call made at once (``asyncio.gather``: one batch).

Prints the median samples/s of each and the ratio of ``batched`` to the other two. Needs plasmid,
plasmid-torchgen, plasmid-tasks and Pillow.

    OMP_NUM_THREADS=1 python benchmarks/bench_vision_batching.py --prompts 16 --group-size 8
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import plasmid_torchgen.plugin as torchgen_plugin
import torch
from plasmid_tasks import colours

from plasmid.testing import build, make_config
from plasmid.types import Sample, SamplingParams
from plasmid_torch import vision
from plasmid_torch.tiny import EOS_ID
from plasmid_torch.tiny_vision import build_tiny_vlm


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16, help="distinct colours prompts (default 16)")
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt (default 8)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds of each way (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    for name in ("prompts", "group_size", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_vlm(Path(tmp) / "vlm", seed=0)
        encoder = vision.VisionEncoder(str(model_dir))
        requests = []
        for item in range(args.prompts):
            messages = colours.example(item)[0]
            ids, reference = encoder.encode(messages, f"item {item}")
            images = encoder.images(Sample(prompt=messages, tokens=ids, metadata={vision.VISION_KEY: reference}))
            requests += [(ids, images, SamplingParams(temperature=1.0, max_new_tokens=7, stop_token_ids=(EOS_ID,),
                                                      seed=item * args.group_size + k))
                         for k in range(args.group_size)]
        engine = build("engine", "torchgen", torchgen_plugin,
                       config=make_config(torchgen_plugin, model=str(model_dir), run_dir=Path(tmp) / "run"))

        def hf_one() -> None:
            for ids, images, params in requests:
                vision.generate(engine.model, ids, images, params)

        async def one() -> None:
            for ids, images, params in requests:
                await engine.generate_with_images(ids, images, params)

        async def batched() -> None:
            await asyncio.gather(*(engine.generate_with_images(ids, images, p) for ids, images, p in requests))

        ways = {"hf-one": hf_one, "one": lambda: asyncio.run(one()), "batched": lambda: asyncio.run(batched())}
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.repeats):
            for name, way in ways.items():
                start = time.perf_counter()
                way()
                seconds[name].append(time.perf_counter() - start)
        asyncio.run(engine.shutdown())
    rates = {name: len(requests) / statistics.median(values) for name, values in seconds.items()}
    print(f"{len(requests)} requests ({args.prompts} prompts x {args.group_size}), {args.threads} thread(s), "
          f"median of {args.repeats}:")
    for name, rate in rates.items():
        print(f"  {name:8s} {rate:8.1f} samples/s")
    print(f"  batched / one: {rates['batched'] / rates['one']:.1f}x, batched / hf-one: "
          f"{rates['batched'] / rates['hf-one']:.1f}x")


if __name__ == "__main__":
    main()
