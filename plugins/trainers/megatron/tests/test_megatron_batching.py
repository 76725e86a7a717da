"""Planning micro-batches: data-parallel shards balanced by tokens, token budgets, padding."""

from __future__ import annotations

import torch
from plasmid_megatron import batching

from plasmid.types import Sample
from plasmid_torch.training import response_mask


def test_data_parallel_shards_balance_tokens_and_cover_every_row_once():
    lengths = [10, 2, 9, 3, 8, 4, 1, 7]
    shares = batching.shard_for_data_parallel(lengths, range(8), 3)
    assert sorted(row for share in shares for row in share) == list(range(8))
    loads = [sum(lengths[r] for r in share) for share in shares]
    assert max(loads) - min(loads) <= 2, loads
    assert all(share == sorted(share) for share in shares)


def test_a_rank_may_get_no_rows_when_there_are_fewer_samples_than_ranks():
    assert batching.shard_for_data_parallel([5], [0], 2) == [[0], []]


def test_micro_batches_by_count_keep_order():
    assert batching.plan_micro_batches([1] * 7, range(7), micro_batch_size=3) == [[0, 1, 2], [3, 4, 5], [6]]


def test_token_budget_bounds_padded_tokens_and_puts_long_samples_alone():
    lengths = [4, 12, 5, 3, 30, 6, 6]
    plans = batching.plan_micro_batches(lengths, range(7), micro_batch_size=100, max_tokens=16)
    assert sorted(row for plan in plans for row in plan) == list(range(7))
    for plan in plans:
        padded = len(plan) * max(lengths[r] for r in plan)
        assert padded <= 16 or len(plan) == 1, (plan, padded)
    assert [4] in plans and [1] in plans
    assert len(plans) < 7                         # short samples share


def test_micro_batch_tensors_right_pad_and_point_at_the_response():
    samples = [Sample(tokens=[1, 5, 6, 7], response_length=2), Sample(tokens=[1, 8, 9], response_length=1)]
    micro = batching.make_micro_batch(samples, [0, 1], width=3, pad_id=0, pad_to=4)
    assert micro.input_ids.tolist() == [[1, 5, 6, 7], [1, 8, 9, 0]]
    assert micro.predicting.tolist()[0][:2] == [1, 2] and micro.predicting.tolist()[1][0] == 1
    assert micro.targets.tolist() == [[6, 7, 0], [9, 0, 0]]
    assert micro.in_response.tolist() == [[True, True, False], [True, False, False]]
    assert micro.position_ids[1].tolist() == [0, 1, 2, 3]


def test_response_mask_uses_the_loss_mask():
    samples = [Sample(tokens=[1, 2, 3, 4], response_length=3, loss_mask=[1, 0, 1]),
               Sample(tokens=[1, 2], response_length=1)]
    assert torch.equal(response_mask(samples, 3), torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))
