"""Throughput of ``--engine sglang`` against ``--engine torchgen`` on the same batch, in one run.

Builds the quickstart's tiny model (``plasmid_torch.tiny.build_tiny_model``) in a temporary directory,
starts one engine of each kind on it (the sglang engine launches one SGLang server), and times,
alternately, each answering ``--batch`` concurrent ``generate`` calls of exactly ``--new-tokens``
tokens (temperature 1, no stop tokens) on the same prompts. Prints the median over ``--repeats``
of samples/s and tokens/s for both, and their ratio (above 1: SGLang is faster).

Needs plasmid, plasmid-torchgen, plasmid-sglang and SGLang installed. On a machine without a GPU
SGLang's CPU engine also needs the CPU build of ``sgl_kernel``, which is not on PyPI; the tests'
stand-in (test support, not product) serves this tiny model:

    OMP_NUM_THREADS=1 python benchmarks/bench_sglang_vs_torchgen.py --batch 64 --new-tokens 64 \\
        --server-env PYTHONPATH=plugins/generators/sglang/tests/cpu_kernel_standin --server-env OMP_NUM_THREADS=1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import plasmid_sglang.plugin as sglang_plugin
import plasmid_torchgen.plugin as torchgen_plugin
import torch

from plasmid.testing import build, make_config
from plasmid.types import SamplingParams
from plasmid_torch.hf import load_tokenizer
from plasmid_torch.tiny import build_tiny_model


def addition_prompts(tokenizer, count: int, seed: int) -> list[list[int]]:
    """``count`` quickstart-like prompts (``<bos>a+b=``), of 4 to 6 tokens."""
    rng = random.Random(seed)
    return [tokenizer(f"{rng.randint(0, 99)}+{rng.randint(0, 99)}=")["input_ids"] for _ in range(count)]


async def time_engine(engine, prompts: list[list[int]], params: SamplingParams) -> tuple[float, int]:
    """Seconds to answer every prompt concurrently, and the tokens generated."""
    started = time.perf_counter()
    outputs = await asyncio.gather(*(engine.generate(prompt, params) for prompt in prompts))
    return time.perf_counter() - started, sum(len(o.token_ids) for o in outputs)


async def benchmark(args: argparse.Namespace, model_dir: Path, run_dir: Path) -> None:
    options = dict(model=str(model_dir), run_dir=run_dir, seed=args.seed)
    torchgen = build("engine", "torchgen", torchgen_plugin, config=make_config(torchgen_plugin, **options))
    launch = time.perf_counter()
    sglang = build("engine", "sglang", sglang_plugin,
                   config=make_config(sglang_plugin, sglang_server_env=args.server_env, **options))
    launch_seconds = time.perf_counter() - launch
    prompts = addition_prompts(load_tokenizer(str(model_dir)), args.batch, args.seed)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
    try:
        engines = {"sglang": sglang, "torchgen": torchgen}
        for engine in engines.values():
            await time_engine(engine, prompts, params)  # warm-up
        runs: dict[str, list[tuple[float, int]]] = {name: [] for name in engines}
        for _ in range(args.repeats):  # alternate, so drifting machine load hits both alike
            for name, engine in engines.items():
                runs[name].append(await time_engine(engine, prompts, params))
    finally:
        await sglang.shutdown()
        await torchgen.shutdown()

    print(f"tiny model, batch {args.batch}, {args.new_tokens} new tokens, median of {args.repeats}; "
          f"SGLang server on {sglang.servers[0].device}, started in {launch_seconds:.1f} s; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, torch threads {torch.get_num_threads()}")
    rates = {}
    for name, timed in runs.items():
        seconds = statistics.median(s for s, _ in timed)
        tokens = timed[0][1]
        rates[name] = tokens / seconds
        print(f"{name:>9}: {seconds * 1000:9.1f} ms  {args.batch / seconds:9.0f} samples/s  {tokens / seconds:9.0f} "
              f"tokens/s")
    print(f"{'ratio':>9}: {rates['sglang'] / rates['torchgen']:.2f} (sglang / torchgen, tokens/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64, help="concurrent requests")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per request")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions (the median is reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads of this process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment of the SGLang server (--sglang-server-env), repeatable")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-sglang-") as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", seed=args.seed, max_positions=256)
        asyncio.run(benchmark(args, model_dir, Path(tmp) / "run"))


if __name__ == "__main__":
    main()
