"""Device check of the Megatron path: the megatron trainer (TP=1, megatron-core's local layer spec, bf16) on one GPU.

A bare GPU image holds PyTorch, transformers, safetensors, numpy and packaging, but no
megatron-core (and no TransformerEngine, SGLang or Ray). megatron-core's wheel is small
(``megatron_core-0.16.1-cp311-...whl``: 2.6 MB; it needs only torch, numpy and packaging), so it is
carried in: fetch it where there is an index (``pip download megatron-core==0.16.1 --no-deps -d
wheels/``) and give its path; the script unpacks it into a temporary directory and imports megatron
from there (nothing is installed). From the repository root, without an index::

    pip install --no-index --no-deps --no-build-isolation ./core ./libs/torch ./plugins/trainers/megatron
    python benchmarks/gpu_check_megatron.py --megatron-wheel wheels/megatron_core-0.16.1-*.whl \\
        --out gpu_check_megatron.json                                # < 10 min on one H100/H200

(where megatron-core is installed, leave ``--megatron-wheel`` out). For each model (Qwen2.5-0.5B-
and Qwen2.5-1.5B-shaped: the real configs' shapes, random bf16 weights built on the GPU, no
downloads; :mod:`gpu_check`'s builder) it builds the megatron trainer with
``--megatron-transformer-impl local --megatron-bf16`` and Adam, and runs ``--steps`` train steps on
random groups of ``--samples`` sequences of ``--prompt-tokens`` + ``--response-tokens`` tokens (0/1
rewards; the group-baseline policy gradient of
``plasmid_torch.testing.contracts.trainer.ContractLoss``), then one weight export
(``export_weights`` buckets of 512 MiB, the sync's trainer side).

Printed and written as JSON (``--out``), per model: trainer tokens/s (trained sequence tokens per
second of ``train_step``, the first step left out as warm-up), MFU (``8 N`` FLOPs per token, as in
:mod:`gpu_check`: the recipe's no-grad old-log-prob forward 2N plus forward and backward 6N; N =
parameters without the embedding; over the GPU's peak dense bf16 FLOP/s), peak GPU memory, export
seconds and bytes, and each step's loss (all finite, no refused step).

``--device cpu --tiny`` runs the same code on the CPU with the quickstart's tiny model (fp32; what
the test suite runs, megatron patched for the CPU by the tests' shim); MFU is then not reported.
Not run on a GPU in the session that wrote it (no GPU was lent): the CUDA path is the CPU path's
code on ``--device cuda``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import QWEN_SHAPES, build_model_dir, peak_flops, synchronize  # the sibling script's helpers

BUCKET_BYTES = 512 << 20


def use_wheel(wheel: Path, into: Path) -> Path:
    """Unpack megatron-core's ``wheel`` into ``into`` and import megatron from there (first on
    ``sys.path``); returns the directory. A clear error for a path that is not such a wheel."""
    if not wheel.is_file() or not zipfile.is_zipfile(wheel):
        raise SystemExit(f"gpu_check_megatron: --megatron-wheel {wheel}: not a wheel file")
    with zipfile.ZipFile(wheel) as archive:
        if not any(name.startswith("megatron/core/") for name in archive.namelist()):
            raise SystemExit(f"gpu_check_megatron: --megatron-wheel {wheel}: holds no megatron/core/")
        archive.extractall(into)
    sys.path.insert(0, str(into))
    return into


def make_batch(vocab: int, groups: int, samples: int, prompt_tokens: int, response_tokens: int, seed: int) -> Any:
    """Random groups of ``samples`` sequences (responses of ``response_tokens`` tokens give or take a
    quarter), rewards 0/1 alternating within each group."""
    from plasmid.types import Group, RolloutBatch, Sample, Status

    rng = random.Random(seed)
    built = []
    for group_index in range(groups):
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_tokens)]
        members = []
        for k in range(samples):
            length = max(1, response_tokens - rng.randrange(0, response_tokens // 4 + 1))
            response = [rng.randrange(3, vocab) for _ in range(length)]
            members.append(Sample(prompt="", tokens=prompt + response, response_length=length,
                                  rollout_logprobs=[-2.0] * length, reward=float(k % 2), status=Status.COMPLETED,
                                  index=group_index * samples + k, group_index=group_index, weight_version=0))
        built.append(Group(samples=members, index=group_index))
    return RolloutBatch(rollout_id=seed, groups=built)


def one_run(args: argparse.Namespace, model_dir: Path, run_dir: Path) -> dict[str, Any]:
    import plasmid_megatron.plugin as megatron_plugin
    from plasmid_megatron.model import unwrapped

    from plasmid import testing
    from plasmid_torch.testing.contracts.trainer import ContractLoss

    options: dict[str, Any] = {"trainer": "megatron", "model": str(model_dir), "run_dir": run_dir, "lr": 1e-5,
                               "megatron_optimizer": "adam", "micro_batch_size": args.micro_batch_size, "seed": 0,
                               "megatron_transformer_impl": "local"}
    if args.device == "cuda":
        options["megatron_bf16"] = True
        torch.cuda.reset_peak_memory_stats()
    config = testing.make_config(megatron_plugin, **options)
    trainer = testing.build("trainer", "megatron", megatron_plugin, config=config, args=(ContractLoss(),))
    vocab = trainer.spec.vocab_size
    steps = []
    for step in range(args.steps):
        batch = make_batch(vocab, args.groups, args.samples, args.prompt_tokens, args.response_tokens, step)
        synchronize(args.device)
        started = time.perf_counter()
        metrics = asyncio.run(trainer.train_step(batch))
        synchronize(args.device)
        seconds = time.perf_counter() - started
        steps.append({"trained_tokens": sum(len(sample.tokens) for sample in batch.samples), "seconds": seconds,
                      "loss": metrics.get("train/loss"), "grad_norm": metrics.get("train/grad_norm"),
                      "bad_steps": sorted(name for name in metrics if "bad_step" in name)})
    started = time.perf_counter()
    exported = buckets = 0
    for bucket in trainer.export_weights(BUCKET_BYTES):
        buckets += 1
        exported += sum(tensor.numel() * tensor.element_size() for _, tensor in bucket)
    synchronize(args.device)
    export_seconds = time.perf_counter() - started
    body = sum(param.numel() for name, param in unwrapped(trainer.model).named_parameters()
               if "word_embeddings" not in name)
    timed = steps[1:] if len(steps) > 1 else steps           # the first step warms kernels and allocators up
    rate = sum(s["trained_tokens"] for s in timed) / sum(s["seconds"] for s in timed)
    result: dict[str, Any] = {
        "non_embedding_parameters": body, "trainer_tokens_per_second": rate, "export_seconds": export_seconds,
        "export_bytes": exported, "export_buckets": buckets,
        "losses_finite": all(s["loss"] is not None and s["loss"] == s["loss"] and abs(s["loss"]) != float("inf")
                             for s in steps),
        "bad_steps": sorted({name for s in steps for name in s["bad_steps"]}), "steps": steps,
    }
    if args.device == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        peak = peak_flops(args.peak_tflops)
        if peak:
            result["mfu"] = 8 * body * rate / peak
    del trainer
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return result


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the quickstart's tiny model only (the CPU check)")
    parser.add_argument("--models", nargs="+", default=list(QWEN_SHAPES), choices=list(QWEN_SHAPES))
    parser.add_argument("--megatron-wheel", type=Path, default=None,
                        help="megatron-core's wheel, imported from an unpacked copy (a bare image has none)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8, help="sequences per group")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--response-tokens", type=int, default=768)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--peak-tflops", type=float, default=None, help="peak dense bf16 TFLOP/s of the GPU")
    parser.add_argument("--out", type=Path, default=Path("gpu_check_megatron.json"))
    args = parser.parse_args(argv)
    if args.steps < 1 or args.groups < 1 or args.samples < 2:
        parser.error("--steps and --groups must be >= 1 and --samples >= 2 (a group needs two rewards)")
    if args.tiny:
        args.models, args.steps, args.groups, args.samples = ["tiny"], 2, 2, 4
        args.prompt_tokens, args.response_tokens, args.micro_batch_size = 6, 8, 4
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check_megatron: --device cuda, but torch sees no GPU; use --device cpu --tiny", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-megatron-") as tmp:
        if args.megatron_wheel is not None:
            use_wheel(args.megatron_wheel, Path(tmp) / "megatron-core")
        import importlib.util

        if importlib.util.find_spec("megatron.core") is None:
            print("gpu_check_megatron: megatron-core is not importable; give its wheel with --megatron-wheel",
                  file=sys.stderr)
            return 2
        import megatron.core
        import transformers

        report: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "device": args.device,
            "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "CPU",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "megatron_core": getattr(megatron.core, "__version__", "unknown"),
            "precision": "bf16" if args.device == "cuda" else "fp32", "transformer_impl": "local",
            "tensor_model_parallel_size": 1, "runs": {}}
        for name in args.models:
            model_dir = build_model_dir(name, Path(tmp) / name, args.device)
            run = one_run(args, model_dir, Path(tmp) / f"run-{name}")
            report["runs"][name] = run
            line = f"{name}: trainer {run['trainer_tokens_per_second']:.0f} tok/s"
            if "mfu" in run:
                line += f", MFU {run['mfu']:.1%}, peak {run['peak_memory_gib']:.1f} GiB"
            print(line + f", export {run['export_bytes'] / 2**20:.0f} MiB in {run['export_seconds']:.2f} s",
                  flush=True)
    report["seconds"] = time.perf_counter() - started
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} ({report['seconds']:.0f} s)")
    failed = [name for name, run in report["runs"].items() if run["bad_steps"] or not run["losses_finite"]]
    if failed:
        print(f"gpu_check_megatron: refused steps or non-finite losses in {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
