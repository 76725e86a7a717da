"""plasmid, TRL's ``GRPOTrainer`` and a raw PyTorch loop on the same task, side by side, in one run.

Each system trains the quickstart's tiny model (built by :func:`plasmid_torch.tiny.build_tiny_model`
with the recipe's shape and ``--seed``, so all three start from the same weights) on the same
prompt stream (the ``tasks`` data source's training order, :class:`plasmid_tasks.split.TaskSplit`),
32 prompts x 8 samples per step, temperature 1 (no top-k/top-p), GRPO advantages, PPO-clip 0.2,
one optimizer update per step, AdamW lr 5e-4 betas (0.9, 0.99) no weight decay, grad clip 1.0, fp32,
no KL; responses stop at ``<eos>`` or the task's answer length. Every ``--eval-interval`` steps each
greedily decodes the task's eval split (mod10: all 100 prompts) and stops once exact-match accuracy
reaches ``--target``. Each runs as a subprocess: plasmid as ``plasmid train``, TRL in a Python of its
own (``--trl-python``; TRL 1.16 and the embedded plugins, see ``requirements/bench.txt``), the raw
loop as this script's ``--worker raw``. The workers print a line per step, plasmid its progress line
(every 10th step and every eval step; the curves come from its ``metrics.jsonl``); this script
timestamps the lines as they arrive, so every clock starts at the subprocess's spawn.

Reported per system and seed, with medians over seeds:

- ``first_step_seconds``: spawn to the end of the first step (start-up).
- ``seconds_to_bar``: wall-clock from spawn (imports, model build, start-up included) to the step
  whose eval reached the bar; ``steps_to_bar`` and ``samples_to_bar`` (rollout samples = steps x 256).
- ``steady_ms_per_step`` / ``steady_samples_per_s`` / ``steady_tokens_per_s``: the time of steps
  K..M (``--steady K M``, default 100..300, as ``(t_M - t_K) / (M - K)``) so start-up cancels; a run
  that stops before M uses its last step and K = a fifth of it.
- ratios of the medians: ``plasmid/raw`` and ``trl/plasmid`` (time to the bar and steady step time).

Then a multi-token task (default ``--multi-task reverse --multi-length 4``: 4-token responses), for
``--multi-steps`` steps with no bar: exact match on a 4-digit reversal is out of reach of a model
trained from chance by sparse reward in a benchmark's time (chance is about 16**-4 per sample), so
this part measures throughput (steady samples/s and tokens/s), where per-sample framework overhead
weighs less than in mod10's one-token responses; its reward curves stay near 0.

Writes ``<out>/vs_trl.json`` (every run's per-step curves and the summary) and ``<out>/vs_trl.png``
(rollout reward, eval accuracy and wall-clock of all three against the step, same axes, one row per
task).

What could not be matched with TRL 1.16 (``GRPOTrainer`` as of that version):

- group std: TRL divides by ``std + 1e-4``, plasmid and the raw loop by ``std + 1e-6`` (both unbiased).
- loss aggregation on multi-token responses: TRL's ``loss_type="dapo"`` (token sum over the whole
  batch / its token count) is used, which is plasmid's ``token-mean``; TRL's default ``grpo`` (per
  sequence, then mean) is not. On mod10 every response has one token and they coincide.
- response stop: TRL masks everything after the first ``<eos>``, as plasmid and the raw loop do, but
  its reward sees ``batch_decode(skip_special_tokens=True)``; plasmid's reward sees its own decode.
  Both strip ``<eos>``, so exact match is the same.
- sampling: TRL samples with ``model.generate`` inside the trainer (no vLLM on CPU); plasmid
  with its own engine (torchgen); the raw loop with ``model.generate``. The draws differ, so curves
  are comparable in distribution, not bit for bit.
- evaluation runs in a ``TrainerCallback`` (TRL's own ``eval_strategy`` computes a loss, not
  greedy accuracy); its time counts, as plasmid's eval time does.
- TRL's ``Trainer`` adds per-step work plasmid does not do (``log`` with its metrics gathering,
  the ``accelerate`` wrapper); that is part of what is measured.

Quick check (one seed, few steps; not a measurement):

    python benchmarks/bench_vs_trl.py --seeds 0 --max-steps 20 --eval-interval 10 --multi-steps 6 \\
        --steady 5 15 --trl-python /work/venv-trl/bin/python

The measurement (an idle machine): ``python benchmarks/bench_vs_trl.py --seeds 0 1 2``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SYSTEMS = ("plasmid", "trl", "raw")
PROMPTS_PER_STEP, GROUP_SIZE = 32, 8
LR, BETAS, CLIP_EPS, GRAD_CLIP, STD_EPS = 5e-4, (0.9, 0.99), 0.2, 1.0, 1e-6
#: A worker's per-step line: ``BENCH {"step": done, "reward": mean, "tokens": n[, "eval_accuracy": a]}``.
MARK = "BENCH "
PLASMID_STEP = re.compile(r"^step\s+(\d+)\s")


class BenchError(Exception):
    """A benchmark run that could not be done; its message is one line naming what and where."""


# ============================================================================ the task (all workers)
def task_parts(task_name: str, length: int, digits: int, seed: int) -> tuple[Any, Any, list[tuple[str, str]]]:
    """``(task, split, eval examples)`` exactly as the ``tasks`` data source builds them."""
    from plasmid_tasks.split import TaskSplit
    from plasmid_tasks.tasks import make_task

    task = make_task(task_name, length=length, digits=digits)
    split = TaskSplit(task, 200, seed)  # 200: --task-eval-size's default
    return task, split, [task.example(item) for item in split.eval_items]


def train_stream(task: Any, split: Any) -> Any:
    """The training examples in the ``tasks`` source's order (epochs of the split, eval items skipped)."""
    epoch = 0
    while True:
        for position in range(split.domain_size):
            item = split.item_at(epoch, position)
            if item is not None:
                yield task.example(item)
        epoch += 1


def build_model(seed: int, scratch: str) -> str:
    """The quickstart recipe's tiny model for ``seed``, in ``<scratch>/model``."""
    from plasmid_tasks.recipe import TINY_MODEL_SHAPE

    from plasmid_torch.tiny import build_tiny_model

    return str(build_tiny_model(Path(scratch) / "model", seed=seed,
                                **TINY_MODEL_SHAPE))


def emit(step: int, reward: float, tokens: int, accuracy: float | None) -> None:
    record: dict[str, Any] = {"step": step, "reward": reward, "tokens": tokens}
    if accuracy is not None:
        record["eval_accuracy"] = accuracy
    print(MARK + json.dumps(record), flush=True)


def greedy_accuracy(model: Any, tokenizer: Any, examples: list[tuple[str, str]], max_new_tokens: int) -> float:
    """Exact-match accuracy of greedy decoding on ``examples`` (all prompts of a task have one length)."""
    import torch

    was_training = model.training
    model.eval()
    with torch.no_grad():
        prompts = torch.tensor([tokenizer(prompt)["input_ids"] for prompt, _ in examples])
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                             max_new_tokens=max_new_tokens, pad_token_id=0)
    texts = tokenizer.batch_decode(out[:, prompts.shape[1]:], skip_special_tokens=True)
    model.train(was_training)
    return sum(text.strip() == label for text, (_, label) in zip(texts, examples, strict=True)) / len(examples)


# ============================================================================ raw loop worker
def worker_raw(args: argparse.Namespace) -> None:
    """The algorithm in plain PyTorch + ``model.generate``: no framework.

    benchmarks/raw_grpo_loop.py's loop (bench_quickstart.py's baseline), generalised so that the three
    systems see the same thing: any task of plasmid-tasks, the data source's prompt order (not iid
    draws), responses of up to the answer length that stop at ``<eos>`` (no ``min_new_tokens``; the
    ``<eos>`` is trained, what follows it is masked), group std ``+ 1e-6`` as plasmid's, the old
    log-probs taken from the same forward (one update per step, so they are the detached new ones),
    the token-mean loss, and one line per step."""
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    task, split, evals = task_parts(args.task, args.task_length, args.task_digits, args.seed)
    directory = build_model(args.seed, args.scratch)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=0.0)
    torch.manual_seed(args.seed)
    stream, length, eos = train_stream(task, split), task.answer_length, tokenizer.eos_token_id
    for step in range(1, args.steps + 1):
        batch = [next(stream) for _ in range(PROMPTS_PER_STEP)]
        prompts = torch.tensor([tokenizer(p)["input_ids"] for p, _ in batch]).repeat_interleave(GROUP_SIZE, 0)
        width = prompts.shape[1]
        model.eval()
        with torch.no_grad():
            full = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0,
                                  top_k=0, top_p=1.0, max_new_tokens=length, pad_token_id=0)
        response = full[:, width:]
        after_eos = (response == eos).long().cumsum(1) - (response == eos).long()  # eos itself is trained
        mask = (after_eos == 0).float()
        texts = tokenizer.batch_decode(response, skip_special_tokens=True)
        labels = [label for _, label in batch for _ in range(GROUP_SIZE)]
        scores = [float(text.strip() == label) for text, label in zip(texts, labels, strict=True)]
        rewards = torch.tensor(scores).view(-1, GROUP_SIZE)
        advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + STD_EPS)).view(-1, 1)
        model.train()
        logits = model(full).logits[:, width - 1:-1].float()
        new = torch.log_softmax(logits, -1).gather(-1, response.unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(new - new.detach())
        per_token = -torch.min(ratio * advantages, ratio.clamp(1 - CLIP_EPS, 1 + CLIP_EPS) * advantages)
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        accuracy = None
        if args.eval_interval and step % args.eval_interval == 0:
            accuracy = greedy_accuracy(model, tokenizer, evals, length)
        emit(step, float(rewards.mean()), int(mask.sum()), accuracy)
        if accuracy is not None and accuracy >= args.target:
            break


# ============================================================================ TRL worker
def worker_trl(args: argparse.Namespace) -> None:
    """TRL's ``GRPOTrainer`` with the shared settings (see the module docstring for what differs)."""
    os.environ.setdefault("WANDB_DISABLED", "true")
    import torch
    import transformers
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    task, split, evals = task_parts(args.task, args.task_length, args.task_digits, args.seed)
    directory = build_model(args.seed, args.scratch)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory)
    stream = train_stream(task, split)
    rows = [next(stream) for _ in range(args.steps * PROMPTS_PER_STEP)]
    dataset = Dataset.from_dict({"prompt": [p for p, _ in rows], "label": [lab for _, lab in rows]})
    step_rewards: list[float] = []
    step_tokens: list[int] = []

    def exact(prompts: list[str], completions: list[str], label: list[str], completion_ids: list[list[int]],
              **_: Any) -> list[float]:
        scores = [float(c.strip() == lab) for c, lab in zip(completions, label, strict=True)]
        step_rewards.append(sum(scores) / len(scores))
        step_tokens.append(sum(len(ids) for ids in completion_ids))
        return scores

    class Bench(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, _args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
            step, accuracy = state.global_step, None
            if args.eval_interval and step % args.eval_interval == 0:
                accuracy = greedy_accuracy(model, tokenizer, evals, task.answer_length)
            emit(step, step_rewards[-1], step_tokens[-1], accuracy)
            if accuracy is not None and accuracy >= args.target:
                control.should_training_stop = True

    config = GRPOConfig(
        output_dir=str(Path(args.scratch) / "trl-out"), seed=args.seed, use_cpu=True,
        bf16=False, fp16=False, gradient_checkpointing=False,
        per_device_train_batch_size=PROMPTS_PER_STEP * GROUP_SIZE, gradient_accumulation_steps=1,
        num_generations=GROUP_SIZE, max_completion_length=task.answer_length, shuffle_dataset=False,
        temperature=1.0, top_k=0, top_p=1.0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch",
        adam_beta1=BETAS[0], adam_beta2=BETAS[1], weight_decay=0.0, max_grad_norm=GRAD_CLIP,
        beta=0.0, epsilon=CLIP_EPS, num_iterations=1, loss_type="dapo", scale_rewards="group",
        max_steps=args.steps, logging_steps=1, save_strategy="no", eval_strategy="no", report_to="none",
        disable_tqdm=True, dataloader_num_workers=0, log_completions=False,
    )
    trainer = GRPOTrainer(model=directory, reward_funcs=exact, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Bench()])
    trainer.train()


# ============================================================================ the parent
def timed_lines(command: list[str], env: dict[str, str], what: str, merge_stderr: bool = False,
                ) -> tuple[list[tuple[float, str]], float]:
    """Run ``command``; every stdout line (and stderr's, with ``merge_stderr``) with its arrival time in
    seconds since spawn, and the total. A failure is a :class:`BenchError` with the last line of stderr."""
    started = time.perf_counter()
    lines: list[tuple[float, str]] = []
    with tempfile.TemporaryFile("w+") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                                   stderr=subprocess.STDOUT if merge_stderr else stderr)
        assert process.stdout is not None
        for line in process.stdout:
            lines.append((time.perf_counter() - started, line.rstrip("\n")))
        code = process.wait()
        total = time.perf_counter() - started
        if code != 0:
            stderr.seek(0)
            text = [line for _, line in lines] if merge_stderr else stderr.read().splitlines()
            tail = [line for line in text if line.strip()][-1:] or ["(no output)"]
            raise BenchError(f"{what} exited with status {code}: {tail[0]}")
    return lines, total


def run_system(system: str, seed: int, task: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Train ``system`` once; its per-step curve (arrival time, reward, tokens, eval accuracy)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": str(args.threads)}  # plasmid takes torch's default thread count from it
    what = f"{system} (seed {seed}, task {task['name']})"
    scratch = Path(args.scratch) / f"{task['name']}-{system}-seed{seed}"
    scratch.mkdir(parents=True)
    common = ["--task", task["name"], "--task-length", str(task["length"]), "--task-digits", str(task["digits"]),
              "--seed", str(seed), "--eval-interval", str(task["eval_interval"])]
    if system == "plasmid":
        run_dir = scratch / "run"
        command = [sys.executable, "-m", "plasmid.app.cli", "train", *common, "--num-rollouts", str(task["steps"]),
                   "--save-interval", "0", "--run-dir", str(run_dir)]
        if task["target"] is not None:
            command += ["--stop-at-eval-acc", str(task["target"])]
        lines, total = timed_lines(command, env, what, merge_stderr=True)
        # plasmid.app.runlog's progress line (stderr, no terminal): every 10th step and every eval step
        arrivals = {int(m.group(1)) + 1: t for t, line in lines if (m := PLASMID_STEP.match(line))}
        if not arrivals:
            raise BenchError(f"{what}: no 'step N t=...' progress line in its output; did plasmid.app.runlog's "
                             f"format change?")
        steps = []
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            metrics = json.loads(line)
            done = int(metrics["step"]) + 1
            record = {"step": done, "reward": metrics["rollout/reward_mean"],
                      "tokens": int(metrics.get("train/tokens", 0))}
            if done in arrivals:
                record["t"] = arrivals[done]
            if "eval/accuracy" in metrics:
                record["eval_accuracy"] = metrics["eval/accuracy"]
                if "t" not in record:
                    raise BenchError(f"{what}: no progress line for eval step {done - 1}")
            steps.append(record)
    else:
        python = sys.executable if system == "raw" else args.trl_python
        target = task["target"] if task["target"] is not None else 2.0
        command = [python, str(Path(__file__).resolve()), "--worker", system, *common, "--steps", str(task["steps"]),
                   "--target", str(target), "--threads", str(args.threads), "--scratch", str(scratch)]
        lines, total = timed_lines(command, env, what)
        steps = [{**json.loads(line[len(MARK):]), "t": t} for t, line in lines if line.startswith(MARK)]
    if not steps:
        raise BenchError(f"{what} ran no step")
    return {"system": system, "seed": seed, "task": task["name"], "process_seconds": total,
            **summarize(steps, task, args), "steps": steps}


def summarize(steps: list[dict[str, Any]], task: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Time/steps/samples to the bar and the steady-state rates of one run's curve.

    ``steps[i]["t"]`` (arrival since spawn) may be missing on some steps (plasmid shows progress every
    10th step and on eval steps): the steady window is then the known steps nearest inside K..M.
    """
    timed = {s["step"]: s["t"] for s in steps if "t" in s}
    last = steps[-1]["step"]
    first_k, last_m = task["steady"]
    m = min(last_m, last)
    k = first_k if first_k < m else max(1, m // 5)
    inside = sorted(step for step in timed if k <= step <= m)
    steady: dict[str, Any] = {"steady_window": None, "steady_ms_per_step": None, "steady_samples_per_s": None,
                              "steady_tokens_per_s": None}
    if len(inside) >= 2:
        k, m = inside[0], inside[-1]
        seconds = timed[m] - timed[k]
        tokens = sum(s["tokens"] for s in steps if k < s["step"] <= m)
        steady = {"steady_window": [k, m], "steady_ms_per_step": 1000 * seconds / (m - k),
                  "steady_samples_per_s": (m - k) * PROMPTS_PER_STEP * GROUP_SIZE / seconds,
                  "steady_tokens_per_s": tokens / seconds}
    hit = next((s for s in steps if task["target"] is not None and s.get("eval_accuracy", -1.0) >= task["target"]),
               None)
    evals = [s["eval_accuracy"] for s in steps if "eval_accuracy" in s]
    return {"reached_bar": hit is not None, "seconds_to_bar": hit["t"] if hit else None,
            "steps_to_bar": hit["step"] if hit else None,
            "samples_to_bar": hit["step"] * PROMPTS_PER_STEP * GROUP_SIZE if hit else None,
            "steps_run": last, "last_eval_accuracy": evals[-1] if evals else None,
            "first_step_seconds": timed[min(timed)] if timed else None, **steady}


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summary_table(runs: list[dict[str, Any]], systems: list[str]) -> dict[str, Any]:
    """Medians per system over seeds, and the ratios plasmid/raw and trl/plasmid."""
    keys = ("seconds_to_bar", "steps_to_bar", "samples_to_bar", "first_step_seconds", "steady_ms_per_step",
            "steady_samples_per_s", "steady_tokens_per_s")
    medians = {}
    for system in systems:
        mine = [r for r in runs if r["system"] == system]
        medians[system] = {key: median_of(mine, key) for key in keys}
        medians[system]["reached_bar"] = f"{sum(r['reached_bar'] for r in mine)}/{len(mine)}"
    ratios = {}
    for top, bottom in (("plasmid", "raw"), ("trl", "plasmid")):
        if top in medians and bottom in medians:
            for key in ("seconds_to_bar", "steady_ms_per_step"):
                ratios[f"{top}/{bottom} {key}"] = ratio(medians[top][key], medians[bottom][key])
    return {"medians": medians, "ratios": ratios}


def print_table(title: str, table: dict[str, Any]) -> None:
    def show(value: Any, digits: int = 1) -> str:
        return "-" if value is None else (f"{value:.{digits}f}" if isinstance(value, float) else str(value))

    print(f"\n{title}")
    print(f"{'system':8} {'bar':>5} {'s to bar':>9} {'steps':>6} {'samples':>8} {'1st step':>8} {'ms/step':>8} "
          f"{'samples/s':>10} {'tokens/s':>9}")
    for system, m in table["medians"].items():
        print(f"{system:8} {m['reached_bar']:>5} {show(m['seconds_to_bar']):>9} {show(m['steps_to_bar'], 0):>6} "
              f"{show(m['samples_to_bar'], 0):>8} {show(m['first_step_seconds']):>8} "
              f"{show(m['steady_ms_per_step']):>8} {show(m['steady_samples_per_s'], 0):>10} "
              f"{show(m['steady_tokens_per_s'], 0):>9}")
    for name, value in table["ratios"].items():
        print(f"  ratio {name}: {show(value, 2)}")


def plot(path: Path, parts: list[tuple[str, list[dict[str, Any]]]], target: float) -> None:
    """Per task (a row): rollout reward, eval accuracy (when the task is evaluated) and wall-clock since
    spawn against the step, every run of every system on shared axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"plasmid": "tab:blue", "trl": "tab:orange", "raw": "tab:green"}
    figure, axes = plt.subplots(len(parts), 3, figsize=(16, 4 * len(parts)), squeeze=False)
    for row, (title, runs) in enumerate(parts):
        reward, accuracy, clock = axes[row]
        for run in runs:
            steps, color = run["steps"], colors[run["system"]]
            label = f"{run['system']} seed {run['seed']}"
            reward.plot([s["step"] for s in steps], [s["reward"] for s in steps], color=color, alpha=0.6,
                        linewidth=0.8, label=label)
            evals = [s for s in steps if "eval_accuracy" in s]
            accuracy.plot([s["step"] for s in evals], [s["eval_accuracy"] for s in evals], color=color, alpha=0.8,
                          marker=".", label=label)
            timed = [s for s in steps if "t" in s]
            clock.plot([s["step"] for s in timed], [s["t"] for s in timed], color=color, alpha=0.8, marker=".",
                       markersize=3, label=label)
        reward.set(title=f"{title}: rollout reward", xlabel="step", ylabel="mean reward", ylim=(-0.02, 1.02))
        reward.legend(fontsize=7)
        if any("eval_accuracy" in s for run in runs for s in run["steps"]):
            accuracy.set(title=f"{title}: greedy eval accuracy", xlabel="step", ylabel="accuracy",
                         ylim=(-0.02, 1.02))
            accuracy.axhline(target, color="grey", linestyle="--", linewidth=0.8)
        else:
            accuracy.set_axis_off()
            accuracy.text(0.5, 0.5, f"{title}: not evaluated (throughput only)", ha="center", va="center",
                          transform=accuracy.transAxes)
        clock.set(title=f"{title}: wall-clock since spawn", xlabel="step", ylabel="seconds")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def default_trl_python() -> str | None:
    candidate = ROOT / ".tox" / "bench" / "bin" / "python"
    return str(candidate) if candidate.exists() else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--trl-python", default=default_trl_python(),
                        help="Python with TRL 1.16 and the embedded plugins (default: .tox/bench/bin/python if "
                             "present)")
    parser.add_argument("--task", default="mod10", choices=["mod10", "reverse", "digitsum", "addition"])
    parser.add_argument("--task-length", type=int, default=3)
    parser.add_argument("--task-digits", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.9, help="greedy eval accuracy that stops a run")
    parser.add_argument("--eval-interval", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=1000, help="steps before a run gives up on the bar")
    parser.add_argument("--steady", type=int, nargs=2, default=[100, 300], metavar=("K", "M"),
                        help="steady state: the time of steps K..M")
    parser.add_argument("--multi-task", default="reverse", choices=["reverse", "addition", "none"],
                        help="the multi-token throughput task ('none': skip it)")
    parser.add_argument("--multi-length", type=int, default=4, help="reverse: digits; addition: operand digits")
    parser.add_argument("--multi-steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads of every system (each subprocess's OMP_NUM_THREADS)")
    parser.add_argument("--out", default="runs/bench", help="directory for vs_trl.json and vs_trl.png")
    parser.add_argument("--worker", choices=["raw", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=1000, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)  # models and run directories, deleted at the end
    args = parser.parse_args(argv)
    if args.worker is not None and not args.scratch:
        parser.error("--worker needs --scratch DIR (this script passes both to its workers)")
    if args.worker is None:
        if "trl" in args.systems and not args.trl_python:
            parser.error("no TRL python: pass --trl-python PATH (a Python with trl==1.16.0 and the embedded plugins; "
                         "requirements/bench.txt) or leave trl out of --systems")
        if "trl" in args.systems and not Path(args.trl_python).exists():
            parser.error(f"--trl-python {args.trl_python}: no such file")
        if args.steady[0] >= args.steady[1] or args.steady[0] < 1:
            parser.error(f"--steady {args.steady[0]} {args.steady[1]}: need 1 <= K < M")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker == "raw":
        return worker_raw(args)
    if args.worker == "trl":
        return worker_trl(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = [{"name": args.task, "length": args.task_length, "digits": args.task_digits, "target": args.target,
              "eval_interval": args.eval_interval, "steps": args.max_steps, "steady": args.steady}]
    if args.multi_task != "none":
        length = {"length": args.multi_length, "digits": 2} if args.multi_task == "reverse" else \
            {"length": 3, "digits": args.multi_length}
        tasks.append({"name": args.multi_task, **length, "target": None, "eval_interval": 0,
                      "steps": args.multi_steps, "steady": [max(1, args.multi_steps // 5), args.multi_steps]})
    report: dict[str, Any] = {"command": sys.argv, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                              "cpus": os.cpu_count(), "settings": vars(args), "tasks": []}
    parts = []
    args.scratch = tempfile.mkdtemp(prefix="bench-vs-trl-")
    try:
        for task in tasks:
            title = f"{task['name']}" + (f" length {task['length']}" if task["name"] == "reverse" else "")
            runs = []
            for seed in args.seeds:
                for system in args.systems:
                    run = run_system(system, seed, task, args)
                    runs.append(run)
                    print(f"{title} seed {seed} {system:8} steps {run['steps_run']:5d}  to bar "
                          f"{run['seconds_to_bar'] or float('nan'):7.1f} s  steady "
                          f"{run['steady_ms_per_step'] or float('nan'):7.1f} ms/step  (process "
                          f"{run['process_seconds']:.1f} s)", flush=True)
            table = summary_table(runs, args.systems)
            print_table(title, table)
            report["tasks"].append({"task": task, "title": title, **table, "runs": runs})
            parts.append((title, runs))
    except BenchError as error:
        print(f"bench_vs_trl: error: {error}", file=sys.stderr)
        sys.exit(2)
    finally:
        shutil.rmtree(args.scratch, ignore_errors=True)
    (out / "vs_trl.json").write_text(json.dumps(report, indent=1))
    plot(out / "vs_trl.png", parts, args.target)
    print(f"\nwrote {out / 'vs_trl.json'} and {out / 'vs_trl.png'}")


if __name__ == "__main__":
    main()
