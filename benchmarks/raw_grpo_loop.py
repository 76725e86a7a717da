"""Baseline for bench_quickstart.py: the quickstart's algorithm as one plain PyTorch loop.

No plasmid machinery: the same tiny Qwen2 model (built by the same recipe), the mod10 task,
32 prompts x 8 samples per step, temperature 1, HF ``generate`` with a KV cache, group-normalised
advantages, PPO-clip 0.2 (one update per step), AdamW lr 5e-4 betas (0.9, 0.99), grad clip 1.0;
greedy evaluation on all 100 prompts every ``--eval-interval`` steps; stops at ``--target``.

Prints one JSON line: {"seconds": wall-clock incl. model build, "steps": ..., "eval_accuracy": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

STARTED = time.perf_counter()

import torch  # noqa: E402
import transformers  # noqa: E402

from plasmid_torch.tiny import build_tiny_model  # noqa: E402  (the model recipe only)

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--eval-interval", type=int, default=10)
parser.add_argument("--target", type=float, default=0.9)
args = parser.parse_args()

# the thread count plasmid train gets: torch's default, which OMP_NUM_THREADS sets (2 when unset, as benchmarks/run.py
# runs it on 2 cores); a fixed 2 here made `OMP_NUM_THREADS=1 bench_quickstart.py` compare 1 thread against 2
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 2))
transformers.logging.set_verbosity_error()
directory = build_tiny_model(tempfile.mkdtemp() + "/model", seed=args.seed)
tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.99), weight_decay=0.0)
pairs = [(a, b) for a in range(10) for b in range(10)]
encode = {(a, b): tokenizer(f"{a}+{b}=")["input_ids"] for a, b in pairs}
answer_id = {d: tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)}
rng = random.Random(args.seed)
torch.manual_seed(args.seed)


def logprobs(full: torch.Tensor, prompt_len: int) -> torch.Tensor:
    logits = model(full).logits[:, prompt_len - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, full[:, prompt_len:].unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def greedy_accuracy() -> float:
    model.eval()
    prompts = torch.tensor([encode[p] for p in pairs])
    out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False, max_new_tokens=1,
                         pad_token_id=0)
    return sum(int(out[i, -1]) == answer_id[(a + b) % 10] for i, (a, b) in enumerate(pairs)) / len(pairs)


accuracy, step = 0.0, 0
for step in range(1, args.steps + 1):
    batch = [pairs[rng.randrange(100)] for _ in range(32)]
    prompts = torch.tensor([encode[p] for p in batch]).repeat_interleave(8, 0)
    with torch.no_grad():
        model.eval()
        full = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0,
                              top_k=0, top_p=1.0, max_new_tokens=1, min_new_tokens=1, pad_token_id=0)
    targets = torch.tensor([answer_id[(a + b) % 10] for a, b in batch]).repeat_interleave(8)
    rewards = (full[:, -1] == targets).float().view(32, 8)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).view(-1, 1)
    model.train()
    with torch.no_grad():
        old = logprobs(full, prompts.shape[1])
    new = logprobs(full, prompts.shape[1])
    ratio = torch.exp(new - old)
    loss = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    if step % args.eval_interval == 0:
        accuracy = greedy_accuracy()
        if accuracy >= args.target:
            break

print(json.dumps({"seconds": time.perf_counter() - STARTED, "steps": step, "eval_accuracy": accuracy}))
