"""TEST SUPPORT: one rank of a multi-process megatron run with ``--routing-replay`` on CPU (gloo),
driven by test_megatron_routing_replay.py. Usage: ``python routing_worker.py '<json settings>'``
with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set (or none for a world of one).

Every rank builds the trainer (SGD, lr 0.05: the routers move between updates) and trains one step
on :func:`make_rollout_batch`'s 12 samples. With ``"mode": "r3"`` each sample carries a made-up
engine routing (two distinct experts of four per token and layer, seeded by the sample's index, the
last token left out). Hooks on the routers record, per micro-batch this rank ran (stand-ins left
out), the experts each sample's tokens went to, in the old-log-prob pass and in the updates. Each
rank writes ``<out>/rank<r>.json``: ``{"old": {row: routes}, "updates": [{row: routes}, ...],
"engine": {row: routes}, "replayed": n, "free": n}`` (routes: ``[tokens][layers][top_k]`` sorted);
rank 0 also writes ``result.json`` (``multiprocess.run_ranks`` reads it).
Settings: ``model``, ``out``, ``mode``, ``options`` (trainer options over the defaults below).
"""

import dataclasses
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

VOCAB = 16


def main(settings: dict) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import megatron_cpu_shim

    megatron_cpu_shim.install()
    import plasmid_grpo.plugin
    import plasmid_megatron.plugin
    import torch
    from megatron.core.transformer.moe.router import TopKRouter
    from plasmid_megatron.routing_replay import split_by_sample

    from plasmid import testing
    from plasmid.types import ROUTED_EXPERTS_KEY
    from plasmid_torch.testing.contracts.trainer import make_rollout_batch

    torch.set_num_threads(1)
    out = Path(settings["out"])
    rank = int(os.environ.get("RANK", "0"))
    options = {"trainer": "megatron", "model": settings["model"], "lr": 0.05, "megatron_optimizer": "sgd",
               "micro_batch_size": 2, "global_batch_size": 6, "routing_replay": settings["mode"],
               "run_dir": out / "run", **settings.get("options", {})}
    config = testing.make_config(plasmid_megatron.plugin, plasmid_grpo.plugin, **options)
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    trainer = testing.build("trainer", "megatron", plasmid_megatron.plugin, config=config, args=(loss,))
    batch = make_rollout_batch(VOCAB, groups=3, seed=5)
    samples = batch.samples
    lengths = [len(sample.tokens) for sample in samples]
    engine = {}
    if settings["mode"] == "r3":
        for row, sample in enumerate(samples):
            generator = torch.Generator().manual_seed(sample.index)
            routes = [[torch.randperm(4, generator=generator)[:2].tolist() for _ in range(2)]
                      for _ in range(len(sample.tokens) - 1)]
            sample.metadata[ROUTED_EXPERTS_KEY] = routes
            engine[row] = torch.tensor(routes).sort(-1).values.tolist()

    seen = []

    def hook(router, inputs, output):
        _, routing_map = output
        seen.append(routing_map.nonzero()[:, 1].view(routing_map.shape[0], router.topk).cpu())

    for module in trainer.model.modules():
        if isinstance(module, TopKRouter):
            module.register_forward_hook(hook)
    result = {"old": {}, "updates": [], "engine": engine}
    routing = trainer.step_routing
    depth = [0]

    def watched(method, phase):
        @contextmanager
        def context(micro, *args):
            depth[0] += 1
            if depth[0] == 1:
                seen.clear()
            try:
                with method(micro, *args):
                    yield
            finally:
                depth[0] -= 1
            if depth[0] == 0 and micro.counts:
                rows = micro.rows.tolist()
                split = split_by_sample(seen, micro.input_ids.cpu(), rows, [lengths[row] for row in rows])
                target = result["old"] if phase == "old" else result["updates"][-1]
                target.update({row: routes.tolist() for row, routes in split.items()})
        return context

    routing.old_pass = watched(routing.old_pass, "old")
    routing.replay = watched(routing.replay, "update")
    update = trainer.recipe.parts.policy_update

    def counted_update(*args):
        result["updates"].append({})
        return update(*args)

    trainer.recipe.parts = dataclasses.replace(trainer.recipe.parts, policy_update=counted_update)
    testing.run(trainer.train_step(batch))
    result.update(replayed=routing.replayed, free=routing.free)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    if rank == 0:
        (out / "result.json").write_text(json.dumps({"ranks": int(os.environ.get("WORLD_SIZE", "1"))}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
    __import__("multiprocess").leave_world()
