"""Memory on a real model: two GRPO train steps of the torch trainer on SmolLM2-135M-Instruct (49,152-token
vocabulary), 32 samples of 40-60 prompt and up to 128 response tokens, full fine-tuning in float32 with AdamW, stay
under a bound on the peak resident memory of the process (``VmHWM``), measured in a fresh interpreter as the megatron
export test does. The weights, gradients and AdamW moments alone take 2.2 GB; before the LM head was applied in
chunks to the response positions only (``plasmid_torch.lm_head``), whole-batch float32 logits and their softmax took
this step past 10 GB.

Run as a script (``python test_smollm2_memory.py MODEL_DIR OPTIONS_JSON``) it is the measured process: it prints
``{"peak_gb": ..., "steps": [...]}``.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

#: the trainer's settings (plasmid's recipe for real models: packed micro-batches of at most 2,048 tokens, gradient
#: checkpointing, no step-guard copy of the weights and AdamW state)
OPTIONS = {"max_tokens_per_micro_batch": 2048, "gradient_checkpointing": True, "max_update_ratio": 0.0}
#: measured 3.8 GB on 2026-12-07 (2 cores; allocations of 4 MiB and more mapped on their own: torchtrain's default)
BOUND_GB = 4.2
#: LoRA (rank 16 on every linear layer, the same settings): measured 1.9 GB on 2026-12-07 with torchtrain's LoRA
#: default (allocations of 1 MiB and more mapped on their own); 3.2 GB at the full fine-tuning default of 4 MiB.
#: Issue 30's target is 2.5 GB.
LORA_BOUND_GB = 2.5


def measure(model_dir: str, options: dict) -> dict:
    """Two train steps; the process's peak RSS (GB) and each step's loss."""
    import plasmid_grpo.plugin
    import plasmid_torchtrain.plugin
    import torch

    from plasmid import testing
    from plasmid.types import Group, RolloutBatch, Sample, Status

    torch.set_num_threads(2)
    config = testing.make_config(plasmid_torchtrain.plugin, plasmid_grpo.plugin, model=model_dir, lr=1e-6,
                                 run_dir="unused", **options)
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    trainer = testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))
    rng = random.Random(0)
    groups = []
    for index in range(8):
        prompt = [1] + [rng.randrange(10, 49_000) for _ in range(rng.randint(40, 60))]
        samples = []
        for k in range(4):
            length = rng.randint(13, 128)
            samples.append(Sample(tokens=prompt + [rng.randrange(10, 49_000) for _ in range(length)],
                                  response_length=length, reward=float(k % 2), status=Status.COMPLETED,
                                  index=index * 4 + k, group_index=index, weight_version=0,
                                  rollout_logprobs=[-1.0] * length))
        groups.append(Group(samples=samples, index=index))
    batch = RolloutBatch(rollout_id=0, groups=groups)
    steps = [testing.run(trainer.train_step(batch))["train/loss"] for _ in range(2)]
    peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
    return {"peak_gb": peak / 1e6, "steps": steps}


def measured_in_a_fresh_process(model_dir, options: dict) -> dict:
    result = subprocess.run([sys.executable, __file__, str(model_dir), json.dumps(options)], capture_output=True,
                            text=True, timeout=850)
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert all(value == value for value in measured["steps"]), measured
    return measured


@pytest.mark.timeout(900)
def test_two_full_fine_tuning_steps_stay_under_the_memory_bound(smollm2_dir):
    measured = measured_in_a_fresh_process(smollm2_dir, OPTIONS)
    assert measured["peak_gb"] <= BOUND_GB, measured


@pytest.mark.timeout(900)
def test_two_lora_steps_stay_under_the_lora_memory_bound(smollm2_dir):
    measured = measured_in_a_fresh_process(smollm2_dir, {**OPTIONS, "lora_rank": 16})
    assert measured["peak_gb"] <= LORA_BOUND_GB, measured


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], json.loads(sys.argv[2]))))
