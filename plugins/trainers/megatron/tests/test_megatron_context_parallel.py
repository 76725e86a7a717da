"""Context parallelism: the load-balanced chunk layout (pure), the refusal without an attention that can
split sequences, and a two-process ``--context-parallel-size 2`` run equal to a single process.

The two-process run uses ``tests/cp_attention_standin.py`` (installed by ``parallel_worker.py``), a CPU
stand-in for TransformerEngine's context-parallel attention; the rotary embedding, the chunking of the
inputs, the summing of log-probs/entropy over the context-parallel group and megatron's gradient
reduction over data x context-parallel ranks are the product's and megatron's own.
"""

from __future__ import annotations

import numpy as np
import plasmid_grpo.plugin
import plasmid_megatron.plugin
import pytest
import torch
from plasmid_megatron import batching
from test_megatron_parallel import COMPARED, checkpoint_weights, run_layout

from plasmid import testing
from plasmid.errors import UsageError
from plasmid.types import Sample
from plasmid_torch.testing.contracts.trainer import make_rollout_batch

# ------------------------------------------------------------------------------------------------
# the layout, without processes
# ------------------------------------------------------------------------------------------------


def test_each_rank_holds_chunk_r_and_its_mirror():
    # 12 tokens, cp 3: six chunks of 2; rank r holds chunks r and 5 - r
    assert batching.context_parallel_positions(12, 3, 0).tolist() == [0, 1, 10, 11]
    assert batching.context_parallel_positions(12, 3, 1).tolist() == [2, 3, 8, 9]
    assert batching.context_parallel_positions(12, 3, 2).tolist() == [4, 5, 6, 7]
    assert batching.context_parallel_positions(7, 1, 0).tolist() == list(range(7))
    with pytest.raises(ValueError, match="2 x 2 equal chunks"):
        batching.context_parallel_positions(10, 2, 0)


@pytest.mark.parametrize(("length", "cp_size"), [(8, 2), (24, 3), (16, 4), (5, 1)])
def test_positions_partition_the_sequence_and_locate_inverts_them(length, cp_size):
    held = [batching.context_parallel_positions(length, cp_size, rank) for rank in range(cp_size)]
    assert sorted(torch.cat(held).tolist()) == list(range(length))
    # round trip: every rank's local slice of a sequence, put back at its positions, is the sequence
    sequence = torch.randn(2, length)
    rebuilt = torch.zeros_like(sequence)
    for positions in held:
        rebuilt[:, positions] = sequence[:, positions].clone()
    assert torch.equal(rebuilt, sequence)
    rank, local = batching.locate_positions(torch.arange(length), length, cp_size)
    for position in range(length):
        assert held[rank[position]][local[position]] == position


def test_micro_batch_of_each_rank_holds_every_predicting_position_once():
    # lengths 7 and 5: neither is a multiple of 2 x cp = 4, both are padded to 8
    samples = [Sample(tokens=[1, 5, 6, 7, 8, 9, 4], response_length=4),
               Sample(tokens=[1, 8, 9, 3, 2], response_length=2)]
    width = 4
    whole = batching.make_micro_batch(samples, [0, 1], width=width, pad_id=0)
    ranks = [batching.make_micro_batch(samples, [0, 1], width=width, pad_id=0, cp_size=2, cp_rank=rank)
             for rank in range(2)]
    assert all(micro.length == 8 and micro.input_ids.shape == (2, 4) for micro in ranks)
    assert ranks[0].position_ids[0].tolist() == [0, 1, 6, 7] and ranks[1].position_ids[0].tolist() == [2, 3, 4, 5]
    assert ranks[0].input_ids.tolist() == [[1, 5, 4, 0], [1, 8, 0, 0]]
    assert ranks[1].input_ids.tolist() == [[6, 7, 8, 9], [9, 3, 2, 0]]
    held = torch.stack([micro.held for micro in ranks])
    assert torch.equal(held.sum(0), torch.ones_like(held[0], dtype=torch.long))
    for micro in ranks:
        assert torch.equal(micro.targets, whole.targets) and torch.equal(micro.in_response, whole.in_response)

    # what the trainer does with logits: each rank picks its predicting positions, zeros the rest, and the
    # sum over ranks is what one rank with the whole sequence picks (logits here: any function of position)
    full_logits = torch.randn(2, 8, 3)
    summed = torch.zeros(2, width, 3)
    for rank, micro in enumerate(ranks):
        local_logits = full_logits[:, batching.context_parallel_positions(8, 2, rank)]
        picked = local_logits.gather(1, micro.predicting.unsqueeze(-1).expand(-1, -1, 3))
        summed += torch.where(micro.held.unsqueeze(-1), picked, torch.zeros(()))
    expected = full_logits.gather(1, whole.predicting.unsqueeze(-1).expand(-1, -1, 3))
    assert torch.equal(summed, expected)


# ------------------------------------------------------------------------------------------------
# the trainer
# ------------------------------------------------------------------------------------------------


def test_without_an_attention_that_splits_sequences_the_trainer_refuses(model_dir, tmp_path):
    """This process has megatron's local attention (no stand-in): it asserts cp == 1, the trainer says why."""
    config = testing.make_config(plasmid_megatron.plugin, plasmid_grpo.plugin, trainer="megatron",
                                 model=str(model_dir), context_parallel_size=2, run_dir=tmp_path / "run")
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    with pytest.raises(UsageError, match="TransformerEngine") as refused:
        testing.build("trainer", "megatron", plasmid_megatron.plugin, config=config, args=(loss,))
    assert "--context-parallel-size 2" in str(refused.value)


def test_context_parallel_run_matches_a_single_process(model_dir, tmp_path):
    # the worker's batches (vocabulary 16, 3 groups, seeds 5 and 6, micro-batches of 3 rows) have micro-batches
    # whose longest sequence is not a multiple of 2 x cp = 4, so padding and uneven chunk contents are covered
    batches = [make_rollout_batch(16, groups=3, seed=seed).samples for seed in (5, 6)]
    longest = [max(len(sample.tokens) for sample in samples[start:start + 3])
               for samples in batches for start in range(0, len(samples), 3)]
    assert any(length % 4 for length in longest), longest

    expected = run_layout(model_dir, tmp_path / "single", 1)
    got = run_layout(model_dir, tmp_path / "cp2", 2, options={"context_parallel_size": 2})
    for values, reference in zip(got["logprobs"], expected["logprobs"], strict=True):
        assert np.allclose(values, reference, atol=1e-5, rtol=0)
    for step in ("first", "second"):
        for name in COMPARED:
            assert got[step][name] == pytest.approx(expected[step][name], rel=1e-4, abs=1e-6), (step, name)
    assert got["exported_names"] == expected["exported_names"]
    weights, expected_weights = checkpoint_weights(tmp_path / "cp2"), checkpoint_weights(tmp_path / "single")
    assert set(weights) == set(expected_weights)
    for name, value in expected_weights.items():
        assert np.allclose(weights[name], value, atol=1e-6, rtol=0), name
    # the updates moved the weights (equal weights are not just the initial ones)
    initial = checkpoint_weights_of(model_dir)
    assert any(not np.allclose(weights[name], initial[name]) for name in initial if name in weights)


def checkpoint_weights_of(model_dir) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(next(model_dir.glob("*.safetensors"))))
