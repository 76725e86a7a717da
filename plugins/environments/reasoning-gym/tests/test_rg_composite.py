"""reasoning-gym's ``composite`` dataset through ``--rg-config composite.datasets=...`` (inline JSON or
``@FILE`` YAML): the prompts come from its sub-datasets in their weights and configs, the reward scores
them with the sub-dataset's own scorer, and a bad spec is one line naming the flag."""

import asyncio
import collections
import json

import pytest
from plasmid_reasoning_gym import plugin

from plasmid.errors import UsageError
from plasmid.testing import build, make_config
from plasmid.testing.contracts.reward import make_sample

SPECS = [{"name": "chain_sum", "weight": 3, "config": {"min_terms": 2, "max_terms": 2}},
         {"name": "leg_counting", "weight": 1}]


def composite_config(tmp_path, value):
    return make_config(plugin, run_dir=tmp_path / "run", datasource="reasoning-gym", rg_dataset=("composite",),
                       rg_config=(f"composite.datasets={value}",), rg_size=40, rg_eval_size=4, n_samples_per_prompt=1)


def served(config):
    source = build("datasource", "reasoning-gym", plugin, config=config)
    return [group.samples[0] for group in source.get_groups(40)], build("reward", "reasoning-gym", plugin,
                                                                       config=config)


def test_inline_json_mixes_the_sub_datasets_with_their_weights_configs_and_scorers(tmp_path):
    samples, reward = served(composite_config(tmp_path, json.dumps(SPECS)))
    plain = [SPECS[0], {**SPECS[1], "config": {}}]
    sources = collections.Counter(sample.label["config"]["datasets"] == plain for sample in samples)
    assert sources == {True: 40}, "the label keeps the composite's specs, so the reward rebuilds the entry"
    from plasmid_reasoning_gym.mixture import entry_of_label

    entries = [entry_of_label(sample.label)[1] for sample in samples]
    names = collections.Counter(entry["metadata"]["source_dataset"] for entry in entries)
    assert set(names) == {"chain_sum", "leg_counting"} and names["chain_sum"] > names["leg_counting"]
    for entry in entries:
        if entry["metadata"]["source_dataset"] == "chain_sum":
            assert entry["metadata"]["num_terms"] == 2, "the sub-dataset's config (two terms) is applied"
    right = asyncio.run(reward(make_sample(f"<answer>{entries[0]['answer']}</answer>", samples[0].label)))
    wrong = asyncio.run(reward(make_sample("<answer>nonsense</answer>", samples[0].label)))
    assert (right, wrong) == (1.0, 0.0)


def test_a_yaml_file_gives_the_same_mixture_as_inline_json(tmp_path):
    path = tmp_path / "mix.yaml"
    path.write_text("datasets:\n  - name: chain_sum\n    weight: 3\n    config: {min_terms: 2, max_terms: 2}\n"
                    "  - name: leg_counting\n    weight: 1\n")
    from_file, _ = served(composite_config(tmp_path, f"@{path}"))
    inline, _ = served(composite_config(tmp_path, json.dumps(SPECS)))
    assert [s.prompt for s in from_file] == [s.prompt for s in inline]


@pytest.mark.parametrize(("value", "message"), [
    ('[{"name": "no_such_dataset", "weight": 1}]', "reasoning-gym rejects the config of composite: .*no_such_dataset"),
    ('[{"name": "chain_sum"}]', "each is {name, weight, config}"),
    ('[{"name": "chain_sum", "weight": -1}]', "reasoning-gym rejects the config of composite: Weight must be positive"),
    ("@/no/such/mix.yaml", "cannot read /no/such/mix.yaml as YAML or JSON"),
])
def test_a_bad_composite_spec_is_one_line_naming_the_flag(tmp_path, value, message):
    with pytest.raises(UsageError, match=message) as raised:
        composite_config(tmp_path, value)
    assert "--rg-config" in str(raised.value) and "\n" not in str(raised.value)
