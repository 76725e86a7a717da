"""Device check of the plain-PyTorch path: a few RL steps with torchgen + torchtrain on one GPU.

Needs only what a bare GPU image has (PyTorch, transformers, peft, safetensors, pluggy, numpy,
packaging). Install the project's packages without an index, from the repository root::

    pip install --no-index --no-deps --no-build-isolation ./core ./libs/torch \\
        ./plugins/generators/torchgen ./plugins/trainers/torchtrain ./plugins/commands/parity \\
        ./plugins/tokenizers/hf ./plugins/datasources/tasks ./plugins/rollouts/rollout ./plugins/losses/grpo \\
        ./plugins/syncs/sync
    python benchmarks/gpu_check.py --out gpu_check.json          # < 10 min on one H100/H200

For each model (Qwen2.5-0.5B-sized and Qwen2.5-1.5B-sized: the real configs' shapes, random
weights built on the GPU, no downloads) and LoRA off and on, it runs ``--steps`` RL steps in bf16
(``--precision bf16``; LoRA: ``--lora-rank 16``): the engine samples ``--prompts`` x ``--samples``
responses of up to ``--new-tokens`` tokens to random prompts of ``--prompt-tokens`` tokens, each
group gets 0/1 rewards, the trainer takes one step (the group-baseline policy gradient of
``plasmid_torch.testing.contracts.trainer.ContractLoss``), and the weights are synced into the
engine (``export_weights`` buckets of 512 MiB -> ``update_weights``). A last run trains the 0.5B
model with ``--gradient-checkpointing`` and ``--optimizer-offload`` (the CUDA-only paths).

Printed and written as JSON (``--out``, rewritten after every run, so a check cut short keeps what it
measured), per run: generated tokens/s, trainer tokens/s (trained
sequence tokens, prompt included, per second of ``train_step``), MFU (model FLOPs per second over
the GPU's peak dense bf16 FLOPs: ``8 N`` per token for full training, i.e. the no-grad old-log-prob
forward 2N plus forward and backward 6N, and ``6 N`` with LoRA, whose backward skips the weight
gradients; N = parameters without the embedding), peak GPU memory, weight-sync seconds and the
train/rollout log-prob mean absolute difference (``train/train_rollout_logprob_abs_diff``).

Then it times the torchgen engine against ``model.generate`` (``bench_torchgen.py``'s measurement,
the issue-19 target of 2x: batch 256 x 16 tokens on the quickstart's tiny model and on the 21M one,
distinct prompts and groups of 8, fp32 and bf16; the lean step eager and as CUDA graphs, and the
Hugging Face step) and records the ratios under ``torchgen_vs_generate`` (``--no-torchgen-bench``
skips it). The first model's loop also runs with ``--torchgen-cuda-graphs`` (``full+cuda-graphs``).

Then ``plasmid parity`` (plasmid-parity) checks torchgen against torchtrain on the first model at
``--precision`` with its default bound: ``--prompts`` sequences of random ids (``--prompt-tokens`` +
``--new-tokens``), exit status, maximum and mean log-prob difference and the report's lines under
``parity`` (``--no-parity`` skips it; a status other than 0 fails the check).

``--device cpu --tiny`` runs the same loop on the CPU with the quickstart's tiny model (what the
test suite runs, < 60 s; the engine-vs-generate part at a toy size); MFU is then not reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

#: Shapes of the Qwen2.5 configs (hidden, intermediate, layers, attention heads, KV heads, vocabulary).
QWEN_SHAPES = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
}
#: Peak dense bf16 FLOP/s by GPU name (substring of torch.cuda.get_device_name); --peak-tflops overrides.
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "A100": 312e12, "A800": 312e12, "L40S": 362e12,
             "L4": 121e12, "A10": 125e12, "RTX 4090": 165e12}
BUCKET_BYTES = 512 << 20


def build_model_dir(name: str, directory: Path, device: str) -> Path:
    """A random model of ``name``'s shapes saved in HF format under ``directory`` (bf16)."""
    if name == "tiny":
        from plasmid_torch.tiny import build_tiny_model

        return build_tiny_model(directory, seed=0)
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**QWEN_SHAPES[name], max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6,
                         bos_token_id=151643, eos_token_id=151643, pad_token_id=151643)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(directory)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return directory


def make_batch(prompts: list[list[int]], outputs: list[Any], samples: int) -> Any:
    from plasmid.types import Group, RolloutBatch, Sample, Status

    groups = []
    for group_index, prompt in enumerate(prompts):
        members = []
        for k in range(samples):
            out = outputs[group_index * samples + k]
            members.append(Sample(prompt="", tokens=prompt + list(out.token_ids), response_length=len(out.token_ids),
                                  rollout_logprobs=list(out.logprobs), reward=float(k % 2), status=Status.COMPLETED,
                                  index=group_index * samples + k, group_index=group_index, weight_version=0))
        groups.append(Group(samples=members, index=group_index))
    return RolloutBatch(rollout_id=0, groups=groups)


def synchronize(device: str) -> None:
    """Wait for the device's queued work (timings on CUDA need it; nothing on the CPU)."""
    if device == "cuda":
        torch.cuda.synchronize()


def peak_flops(peak_tflops: float | None) -> float | None:
    """The GPU's peak dense bf16 FLOP/s: ``--peak-tflops`` when given, else :data:`PEAK_BF16`'s
    entry for the current CUDA device's name, else ``None`` (no MFU is reported)."""
    if peak_tflops:
        return peak_tflops * 1e12
    return next((flops for name, flops in PEAK_BF16.items() if name in torch.cuda.get_device_name()), None)


async def one_run(args: argparse.Namespace, model_dir: Path, run_dir: Path, *, lora: bool,
                  extra: dict[str, Any]) -> dict[str, Any]:
    import plasmid_torchgen.plugin as torchgen_plugin
    import plasmid_torchtrain.plugin as torchtrain_plugin

    from plasmid import testing
    from plasmid.types import SamplingParams
    from plasmid_torch.testing.contracts.trainer import ContractLoss

    options = {"model": str(model_dir), "run_dir": run_dir, "device": args.device, "precision": args.precision,
               "lr": 1e-5, "micro_batch_size": args.micro_batch_size, "seed": 0, **extra}
    if lora:
        options.update(lora_rank=16, lora_alpha=32.0)
    config = testing.make_config(torchtrain_plugin, torchgen_plugin, **options)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    engine = testing.build("engine", "torchgen", torchgen_plugin, config=config)
    trainer = testing.build("trainer", "torchtrain", torchtrain_plugin, config=config, args=(ContractLoss(),))
    vocab = engine.vocab_size
    rng = random.Random(0)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=None)
    steps = []
    try:
        for step in range(args.steps):
            prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt_tokens)] for _ in range(args.prompts)]
            started = time.perf_counter()
            outputs = await asyncio.gather(*(engine.generate(prompt, params) for prompt in prompts
                                             for _ in range(args.samples)))
            gen_seconds = time.perf_counter() - started
            generated = sum(len(out.token_ids) for out in outputs)
            batch = make_batch(prompts, outputs, args.samples)
            synchronize(args.device)
            started = time.perf_counter()
            metrics = await trainer.train_step(batch)
            synchronize(args.device)
            train_seconds = time.perf_counter() - started
            started = time.perf_counter()
            for bucket in trainer.export_weights(BUCKET_BYTES):
                await engine.update_weights(bucket, step + 1)
            synchronize(args.device)
            sync_seconds = time.perf_counter() - started
            bad = sorted(name for name in metrics if "bad_step" in name)
            steps.append({"generated_tokens": generated, "gen_seconds": gen_seconds,
                          "trained_tokens": sum(len(s.tokens) for s in batch.samples), "train_seconds": train_seconds,
                          "sync_seconds": sync_seconds, "loss": metrics.get("train/loss"), "bad_steps": bad,
                          "logprob_abs_diff": metrics.get("train/train_rollout_logprob_abs_diff")})
    finally:
        await engine.shutdown()
    graph_replays = engine.stats()["graph_replays"]
    body = sum(p.numel() for name, p in trainer.model.named_parameters()
               if "embed_tokens" not in name and "lora_" not in name)
    timed = steps[1:] if len(steps) > 1 else steps          # the first step warms kernels and allocators up
    gen_rate = sum(s["generated_tokens"] for s in timed) / sum(s["gen_seconds"] for s in timed)
    train_rate = sum(s["trained_tokens"] for s in timed) / sum(s["train_seconds"] for s in timed)
    result: dict[str, Any] = {
        "lora": lora, **{key: value for key, value in extra.items()}, "non_embedding_parameters": body,
        "gen_tokens_per_second": gen_rate, "trainer_tokens_per_second": train_rate,
        "sync_seconds": sum(s["sync_seconds"] for s in timed) / len(timed),
        # None when a step did not report it (the trainer computed no log-probs of its own)
        "train_rollout_logprob_abs_diff": (None if any(s["logprob_abs_diff"] is None for s in steps)
                                           else max(s["logprob_abs_diff"] for s in steps)),
        "bad_steps": sorted({name for s in steps for name in s["bad_steps"]}), "steps": steps,
        "engine_graph_replays": graph_replays,
    }
    if args.device == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        peak = peak_flops(args.peak_tflops)
        if peak:
            result["mfu"] = (6 if lora else 8) * body * train_rate / peak
    del trainer, engine
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return result


def torchgen_vs_generate(args: argparse.Namespace) -> dict[str, Any]:
    """``bench_torchgen.measure`` on each shape of the issue-19 target (a toy one with ``--tiny``):
    ``{"<size> x<group> <precision>": {"lean": ratio, "hf": ratio, "generate_tokens_per_second": ...}}``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_torchgen

    if args.tiny:
        shapes = [("tiny", 1, "fp32", 16, 4, 1)]
    else:
        shapes = [(size, group, precision, 256, 16, 5) for size in ("tiny", "20m") for group in (1, 8)
                  for precision in ("fp32", "bf16")]
    figures: dict[str, Any] = {}
    for size, group, precision, batch, new_tokens, repeats in shapes:
        options = bench_torchgen.parse(
            ["--model-size", size, "--group-size", str(group), "--precision", precision, "--batch", str(batch),
             "--new-tokens", str(new_tokens), "--repeats", str(repeats), "--device", args.device,
             "--threads", str(torch.get_num_threads()),
             "--decoders", *(["lean", "hf"] if args.device == "cpu" else ["lean", "graphs", "hf"])])
        shape = f"{size} x{group} {precision}"
        try:
            result = bench_torchgen.measure(options)
        except Exception as error:  # noqa: BLE001 - reported; the other shapes still measure
            figures[shape] = {"error": f"{type(error).__name__}: {error}"}
            print(f"torchgen vs generate, {shape}: FAILED {type(error).__name__}: {error}", flush=True)
            continue
        runs = result["runs"]
        figures[shape] = {
            "batch": batch, "new_tokens": new_tokens,
            "generate_tokens_per_second": runs["HF generate"]["tokens_per_second"],
            **{name.removeprefix("torchgen "): run["ratio"] for name, run in runs.items() if "ratio" in run}}
    return figures


def parity_check(args: argparse.Namespace, model_dir: Path, work: Path) -> dict[str, Any]:
    """``plasmid parity --engine torchgen --trainer torchtrain`` on ``model_dir`` at ``--precision`` and
    ``--device``, in this process, over ``--prompts`` sequences of random ids: ``{"status", "max", "mean",
    "report"}`` (``report``: its output lines; ``error`` instead of the figures when it exits 2). A model
    directory without a tokenizer (the random Qwen shapes) gets the tiny models' character tokenizer,
    which ``plasmid parity`` never uses on given sequences but its start-up checks for."""
    import contextlib
    import io

    from plasmid.app.cli import main as plasmid_main
    from plasmid_torch.tiny import char_tokenizer

    if not any((model_dir / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        char_tokenizer().save_pretrained(model_dir)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    sequences = work / "parity_sequences.jsonl"
    length = args.prompt_tokens + args.new_tokens
    sequences.write_text("".join(json.dumps({"token_ids": [rng.randrange(3, vocab) for _ in range(length)],
                                             "prompt_length": args.prompt_tokens}) + "\n" for _ in range(args.prompts)))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = plasmid_main(["parity", "--engine", "torchgen", "--trainer", "torchtrain", "--model", str(model_dir),
                               "--plugins", "hf,tasks,torchgen,torchtrain,grpo,rollout,sync", "--sequences",
                               str(sequences), "--device", args.device, "--precision", args.precision])
    lines = out.getvalue().splitlines()
    summary = next((line for line in lines if line.startswith("log-prob |engine - trainer|")), None)
    if status == 2 or summary is None:
        return {"status": status, "error": " ".join(lines[-1:]), "report": lines}
    return {"status": status, "max": float(summary.split(": max ")[1].split()[0]),
            "mean": float(summary.split(", mean ")[1].split(":")[0]), "report": lines}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--precision", choices=["bf16", "bf16-autocast", "fp32"], default="bf16")
    parser.add_argument("--tiny", action="store_true", help="the quickstart's tiny model only (the CPU check)")
    parser.add_argument("--models", nargs="+", default=list(QWEN_SHAPES), choices=list(QWEN_SHAPES))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4, help="responses per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--peak-tflops", type=float, default=None, help="peak dense bf16 TFLOP/s of the GPU")
    parser.add_argument("--no-torchgen-bench", dest="torchgen_bench", action="store_false",
                        help="skip timing torchgen against model.generate")
    parser.add_argument("--no-parity", dest="parity", action="store_false",
                        help="skip plasmid parity (torchgen against torchtrain)")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    args = parser.parse_args(argv)
    if args.tiny:
        args.models, args.steps, args.prompts, args.samples = ["tiny"], 2, 4, 2
        args.prompt_tokens, args.new_tokens = 6, 8
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda, but torch sees no GPU; use --device cpu --tiny", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "device": args.device,
                              "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "CPU",
                              "torch": torch.__version__, "precision": args.precision, "runs": {}}
    import transformers

    report["transformers"] = transformers.__version__
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for name in args.models:
            model_dir = build_model_dir(name, Path(tmp) / name, args.device)
            plans: list[tuple[str, bool, dict[str, Any]]] = [("full", False, {}), ("lora", True, {})]
            if args.device == "cuda" and name == args.models[0]:
                plans.append(("full+checkpointing+offload", False,
                              {"gradient_checkpointing": True, "optimizer_offload": True}))
                plans.append(("full+cuda-graphs", False, {"torchgen_cuda_graphs": True}))
            for label, lora, extra in plans:
                key = f"{name}/{label}"
                try:
                    result = asyncio.run(one_run(args, model_dir, Path(tmp) / "runs" / key, lora=lora, extra=extra))
                except Exception as error:  # noqa: BLE001 - reported; the other runs still measure
                    result = {"error": f"{type(error).__name__}: {error}", "bad_steps": []}
                report["runs"][key] = result
                args.out.write_text(json.dumps(report, indent=2))    # so far: a check cut short keeps these
                if "error" in result:
                    print(f"{key}: FAILED {result['error']}", flush=True)
                    continue
                figures = ", ".join(f"{field} {result[field]:.4g}" for field in
                                    ("gen_tokens_per_second", "trainer_tokens_per_second", "mfu", "peak_memory_gib",
                                     "sync_seconds", "train_rollout_logprob_abs_diff") if result.get(field) is not None)
                print(f"{key}: {figures}" + (f"; BAD STEPS {result['bad_steps']}" if result["bad_steps"] else ""),
                      flush=True)
            if args.parity and name == args.models[0]:
                try:
                    report["parity"] = parity_check(args, model_dir, Path(tmp))
                except Exception as error:  # noqa: BLE001 - reported; the other checks still run
                    report["parity"] = {"error": f"{type(error).__name__}: {error}"}
                args.out.write_text(json.dumps(report, indent=2))
                parity = report["parity"]
                print(f"{name}/parity: " + (f"FAILED {parity['error']}" if "error" in parity else
                                            f"status {parity['status']}, max {parity['max']:.3g}, mean "
                                            f"{parity['mean']:.3g}"), flush=True)
    if args.torchgen_bench:
        report["torchgen_vs_generate"] = torchgen_vs_generate(args)
    report["seconds"] = time.perf_counter() - started
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out} ({report['seconds']:.0f} s)")
    failed = [run for run in (*report["runs"].values(), *report.get("torchgen_vs_generate", {}).values())
              if run.get("error") or run.get("bad_steps")]
    parity_failed = "parity" in report and report["parity"].get("status") != 0
    return 1 if failed or parity_failed else 0


if __name__ == "__main__":
    sys.exit(main())
