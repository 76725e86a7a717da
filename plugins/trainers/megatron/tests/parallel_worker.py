"""TEST SUPPORT: one rank of a multi-process megatron trainer run on CPU (gloo), driven by
test_megatron_parallel.py. Usage: ``python parallel_worker.py '<json settings>'`` with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set (or none of them for a world of one).

Every rank builds the trainer with the given layout and runs the same calls on the same batches:
log-probs at temperature 0.7, two train steps, a checkpoint at ``<out>/ckpt`` (and, with
``"resume": true``, a third step on the trainer that wrote it and on a fresh trainer that loads it;
the continuing trainer's weights after it go to ``<out>/third.safetensors``; ``"continue": true``:
the third step on the writing trainer alone).

With ``"resume_from": "<checkpoint>"`` instead, a fresh trainer with the given options loads that
checkpoint (written in any layout) and makes only the third step (``third``; its weights after it
in ``<out>/third.safetensors``); ``"fresh_optimizer": true`` adds the same step from the
checkpoint's Hugging Face weights alone (``--model <checkpoint>/model``: new optimizer and LR
schedule; ``third_fresh``, ``<out>/third_fresh.safetensors``).

Rank 0 writes what it saw to ``<out>/result.json``. Settings: ``model``, ``out``, ``options``
(trainer options over the defaults below), ``resume``, ``continue``, ``resume_from``,
``fresh_optimizer``.
"""

import json
import os
import sys
from pathlib import Path

VOCAB = 16


def _prepare() -> None:
    """Patch megatron for the CPU. Only in the worker itself, not at import: megatron's checkpoint
    saver starts a helper process (multiprocessing's spawn), which imports this file again."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import megatron_cpu_shim

    megatron_cpu_shim.install()
    __import__("cp_attention_standin").install()   # CPU stand-in for TransformerEngine's context-parallel attention


def main(settings: dict) -> None:
    _prepare()
    import plasmid_grpo.plugin
    import plasmid_megatron.plugin
    import torch
    from safetensors.numpy import save_file

    from plasmid import testing
    from plasmid_torch.testing.contracts.trainer import exported, make_rollout_batch

    torch.set_num_threads(1)
    out = Path(settings["out"])
    rank0 = int(os.environ.get("RANK", "0")) == 0
    options = {"trainer": "megatron", "model": settings["model"], "lr": 0.05, "megatron_optimizer": "sgd",
               "micro_batch_size": 3, "run_dir": out / "run", **settings.get("options", {})}

    def make_trainer(**overrides):
        config = testing.make_config(plasmid_megatron.plugin, plasmid_grpo.plugin, **{**options, **overrides})
        loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
        return testing.build("trainer", "megatron", plasmid_megatron.plugin, config=config, args=(loss,))

    def save_weights(trainer, name):
        weights = exported(trainer)         # collective: every rank
        if rank0:
            save_file(weights, str(out / name))

    third = make_rollout_batch(VOCAB, groups=3, seed=7)
    result = {}
    if settings.get("resume_from"):
        checkpoint = settings["resume_from"]
        resumed = make_trainer()
        testing.run(resumed.load(checkpoint))
        result["counters"] = [resumed.steps, resumed.updates]
        result["third"] = testing.run(resumed.train_step(third))
        save_weights(resumed, "third.safetensors")
        if settings.get("fresh_optimizer"):
            fresh = make_trainer(model=str(Path(checkpoint) / "model"))
            result["third_fresh"] = testing.run(fresh.train_step(third))
            save_weights(fresh, "third_fresh.safetensors")
    else:
        trainer = make_trainer()
        batch = make_rollout_batch(VOCAB, groups=3, seed=5)
        result = {"logprobs": testing.run(trainer.logprobs(batch.samples, 0.7)),
                  "first": testing.run(trainer.train_step(batch)),
                  "second": testing.run(trainer.train_step(make_rollout_batch(VOCAB, groups=3, seed=6)))}
        testing.run(trainer.save(str(out / "ckpt")))
        weights = exported(trainer)
        if settings.get("resume"):
            resumed = make_trainer()
            testing.run(resumed.load(str(out / "ckpt")))
            result["third"] = testing.run(trainer.train_step(third))
            result["third_resumed"] = testing.run(resumed.train_step(third))
            after, resumed_after = exported(trainer), exported(resumed)
            result["resumed_weights_equal"] = all((after[name] == resumed_after[name]).all() for name in after)
            if rank0:
                save_file(after, str(out / "third.safetensors"))
        elif settings.get("continue"):
            result["third"] = testing.run(trainer.train_step(third))
            save_weights(trainer, "third.safetensors")
        result["exported_names"] = sorted(weights)
    if rank0:
        for timing in ("first", "second", "third", "third_resumed", "third_fresh"):
            result.get(timing, {}).pop("train/seconds", None)
        (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
    __import__("multiprocess").leave_world()
