"""TEST SUPPORT: one rank of a megatron trainer with PPO's critic, driven by test_megatron_critic.py.
Usage: ``python critic_worker.py '<json settings>'`` with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` set; rank 0 writes :func:`run`'s result to ``<out>/result.json``. The test calls
:func:`run` in its own process for the single-process reference.

Every rank builds the trainer with the layout's options, gives the value head the same non-zero
weights (so that the body gets gradients in the first update), and records the critic's values, one
train step's metrics and the values after it (which depend on every critic weight).
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import megatron_cpu_shim

megatron_cpu_shim.install()

import plasmid_megatron.plugin  # noqa: E402
import plasmid_ppo.plugin  # noqa: E402
import torch  # noqa: E402

from plasmid import testing  # noqa: E402
from plasmid_torch.testing.contracts.trainer import make_rollout_batch  # noqa: E402

VOCAB = 16


def head_weights(hidden_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed non-zero value head: ``(weight [1, hidden], bias [1])``."""
    generator = torch.Generator().manual_seed(1234)
    return torch.randn(1, hidden_size, generator=generator) * 0.5, torch.tensor([0.3])


def set_value_head(trainer, weight: torch.Tensor, bias: torch.Tensor) -> None:
    """Overwrite the critic's value head (on the last pipeline stage) and its optimizer's copies."""
    head = trainer.critic.value_head
    if head is not None:
        with torch.no_grad():
            head.weight.copy_(weight)
            head.bias.copy_(bias)
    trainer.critic.optimizer.reload_model_params()


def make_trainer(model: str, out: Path, options: dict):
    merged = {"trainer": "megatron", "model": model, "lr": 0.05, "critic_lr": 0.1, "megatron_optimizer": "sgd",
              "micro_batch_size": 3, "run_dir": out / "run", **options}
    config = testing.make_config(plasmid_megatron.plugin, plasmid_ppo.plugin, **merged)
    loss = testing.build("loss", "ppo", plasmid_ppo.plugin, config=config)
    return testing.build("trainer", "megatron", plasmid_megatron.plugin, config=config, args=(loss,))


def run(settings: dict) -> dict:
    """Build, set the head, then: values of a batch, one train step, values of another batch."""
    torch.set_num_threads(1)
    trainer = make_trainer(settings["model"], Path(settings["out"]), settings.get("options", {}))
    set_value_head(trainer, *head_weights(trainer.spec.hidden_size))
    batch = make_rollout_batch(VOCAB, groups=3, seed=5)
    result = {"values": testing.run(trainer.values(batch.samples)),
              "step": testing.run(trainer.train_step(batch)),
              "values_after": testing.run(trainer.values(make_rollout_batch(VOCAB, groups=3, seed=6).samples))}
    result["step"].pop("train/seconds")
    return result


if __name__ == "__main__":
    # CPU stand-in for TransformerEngine's context-parallel attention: in worker processes only (the
    # test process imports this module and must keep megatron's own attention, which refuses CP)
    __import__("cp_attention_standin").install()
    settings = json.loads(sys.argv[1])
    result = run(settings)
    if int(os.environ.get("RANK", "0")) == 0:
        (Path(settings["out"]) / "result.json").write_text(json.dumps(result))
    __import__("multiprocess").leave_world()
