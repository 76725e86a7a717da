"""plasmid_torch.prompts.shared_prompts: which prompts of a batch are the same (torchgen's prefill
and torchtrain's forward pass run each distinct prompt once)."""

from plasmid_torch.prompts import shared_prompts


def test_equal_prompts_map_to_their_first_occurrence_in_order_of_appearance():
    prompts = [[1, 5], [1, 6, 7], [1, 5], [2], [1, 6, 7], [1, 5]]
    first, group = shared_prompts(prompts)
    assert first == [0, 1, 3] and group == [0, 1, 0, 2, 1, 0]
    assert all(prompts[first[group[i]]] == prompts[i] for i in range(len(prompts)))


def test_distinct_prompts_share_nothing():
    assert shared_prompts([[1, 5], [1, 5, 5], [5, 1]]) is None
    assert shared_prompts([]) is None
