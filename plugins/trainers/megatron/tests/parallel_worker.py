"""TEST SUPPORT: one rank of a multi-process megatron trainer run on CPU (gloo), driven by
test_megatron_parallel.py. Usage: ``python parallel_worker.py '<json settings>'`` with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set (or none of them for a world of one).

Every rank builds the trainer with the given layout and runs the same calls on the same batches:
log-probs at temperature 0.7, two train steps, a checkpoint (and, when asked, a resume from it
into a fresh trainer). Rank 0 writes what it saw to ``<out>/result.json``.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import megatron_cpu_shim  # noqa: E402

megatron_cpu_shim.install()

import plasmid_grpo.plugin  # noqa: E402
import plasmid_megatron.plugin  # noqa: E402
import torch  # noqa: E402

from plasmid import testing  # noqa: E402
from plasmid.testing.contracts.trainer import exported, make_rollout_batch  # noqa: E402

VOCAB = 16


def main(settings: dict) -> None:
    torch.set_num_threads(1)
    out = Path(settings["out"])
    options = {"trainer": "megatron", "model": settings["model"], "lr": 0.05, "megatron_optimizer": "sgd",
               "micro_batch_size": 3, "run_dir": out / "run", **settings.get("options", {})}

    def make_trainer():
        config = testing.make_config(plasmid_megatron.plugin, plasmid_grpo.plugin, **options)
        loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
        return testing.build("trainer", "megatron", plasmid_megatron.plugin, config=config, args=(loss,))

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
        third = make_rollout_batch(VOCAB, groups=3, seed=7)
        result["third"] = testing.run(trainer.train_step(third))
        result["third_resumed"] = testing.run(resumed.train_step(third))
        after, resumed_after = exported(trainer), exported(resumed)
        result["resumed_weights_equal"] = all((after[name] == resumed_after[name]).all() for name in after)
    result["exported_names"] = sorted(weights)
    if int(os.environ.get("RANK", "0")) == 0:
        for timing in ("first", "second", "third", "third_resumed"):
            result.get(timing, {}).pop("train/seconds", None)
        (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
