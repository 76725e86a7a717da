"""Reading rows: the example file, parquet, the key options, and errors that point at the row."""

import pytest
from plasmid_jsonl import plugin
from plasmid_jsonl.options import JsonlOptions

from plasmid.errors import UsageError
from plasmid.testing import build
from plasmid_torch.hf import load_tokenizer

ROWS = [{"prompt": "1+2=", "label": "3", "metadata": {"a": 1, "b": 2}},
        {"prompt": "4+4=", "label": "8", "metadata": {"a": 4, "b": 4}},
        {"prompt": "9+5=", "label": "4", "metadata": {"a": 9, "b": 5}}]


def jsonl_source(config):
    return build("datasource", "jsonl", plugin, config=config)


def first_samples(groups):
    return [(g.samples[0].prompt, g.samples[0].label, g.samples[0].metadata) for g in groups]


def test_example_file_holds_the_100_mod10_prompts_with_labels(jsonl_config, example_file, tiny_model):
    source = jsonl_source(jsonl_config(prompt_data=example_file))
    groups = source.get_groups(100)
    assert [g.samples[0].prompt for g in groups] == [f"{a}+{b}=" for a in range(10) for b in range(10)]
    tokenizer = load_tokenizer(tiny_model)
    for group in groups:
        sample = group.samples[0]
        a, b = sample.metadata["a"], sample.metadata["b"]
        assert sample.label == str((a + b) % 10)
        assert sample.tokens == tokenizer(sample.prompt)["input_ids"]


def test_parquet_and_jsonl_give_the_same_groups(jsonl_config, write_jsonl, write_parquet):
    from_jsonl = jsonl_source(jsonl_config(prompt_data=write_jsonl("rows.jsonl", ROWS))).get_groups(3)
    from_parquet = jsonl_source(jsonl_config(prompt_data=write_parquet("rows.parquet", ROWS))).get_groups(3)
    assert first_samples(from_jsonl) == first_samples(from_parquet) == [
        (row["prompt"], row["label"], row["metadata"]) for row in ROWS]
    assert [g.samples[0].tokens for g in from_jsonl] == [g.samples[0].tokens for g in from_parquet]


def test_key_options_choose_the_fields_and_absent_metadata_is_empty(jsonl_config, write_jsonl):
    rows = [{"question": "2+2=", "answer": 4, "extra": {"source": "hand"}}, {"question": "3+3=", "answer": 6}]
    config = jsonl_config(prompt_data=write_jsonl("keys.jsonl", rows), input_key="question", label_key="answer",
                          metadata_key="extra")
    assert first_samples(jsonl_source(config).get_groups(2)) == [("2+2=", 4, {"source": "hand"}), ("3+3=", 6, {})]


#: verl's layout: the answer nested under reward_model, the prompt under extra_info.
VERL_ROWS = [{"extra_info": {"question": f"{a}+{a}="}, "reward_model": {"ground_truth": str(2 * a % 10),
                                                                          "style": "rule"}} for a in range(3)]


@pytest.mark.parametrize("writer", ["write_jsonl", "write_parquet"])
def test_dotted_keys_read_nested_fields(jsonl_config, request, writer):
    path = request.getfixturevalue(writer)(f"verl.{writer.removeprefix('write_')}", VERL_ROWS)
    config = jsonl_config(prompt_data=path, input_key="extra_info.question", label_key="reward_model.ground_truth")
    assert first_samples(jsonl_source(config).get_groups(3)) == [("0+0=", "0", {}), ("1+1=", "2", {}),
                                                                 ("2+2=", "4", {})]


def test_a_key_holding_a_dot_at_the_top_is_read_as_it_is(jsonl_config, write_jsonl):
    path = write_jsonl("flat.jsonl", [{"prompt": "1+1=", "answer.text": "2", "answer": {"text": "no"}}])
    config = jsonl_config(prompt_data=path, label_key="answer.text")
    assert first_samples(jsonl_source(config).get_groups(1)) == [("1+1=", "2", {})]


@pytest.mark.parametrize(("writer", "where"), [("write_jsonl", ":2"), ("write_parquet", ", row 2")])
def test_a_given_label_key_missing_in_a_row_names_the_file_the_row_and_the_key(jsonl_config, request, writer, where):
    rows = [{"prompt": "1+1=", "reward_model": {"ground_truth": "2", "style": "rule"}},
            {"prompt": "2+2=", "reward_model": {"ground_truth": None, "style": "rule"}}]
    path = request.getfixturevalue(writer)(f"partial.{writer.removeprefix('write_')}", rows)
    with pytest.raises(UsageError) as error:
        jsonl_source(jsonl_config(prompt_data=path, label_key="reward_model.ground_truth"))
    assert str(error.value) == (f"{path}{where}: the row has no 'reward_model.ground_truth' key (--label-key); "
                                f"'reward_model' has keys 'ground_truth', 'style'")


def test_a_misspelled_label_key_fails_at_the_first_row(jsonl_config, write_jsonl):
    path = write_jsonl("verl.jsonl", VERL_ROWS)
    with pytest.raises(UsageError, match=rf"^{path}:1: the row has no 'ground_truth' key \(--label-key\); its keys "
                                         r"are 'extra_info', 'reward_model'$"):
        jsonl_source(jsonl_config(prompt_data=path, input_key="extra_info.question", label_key="ground_truth"))


def test_with_the_default_label_key_a_file_without_labels_has_none_but_a_partial_one_fails(jsonl_config,
                                                                                          write_jsonl):
    unlabelled = write_jsonl("free.jsonl", [{"prompt": "1+1="}, {"prompt": "2+2="}])
    assert [s[1] for s in first_samples(jsonl_source(jsonl_config(prompt_data=unlabelled)).get_groups(2))] == [
        None, None]
    partial = write_jsonl("partial.jsonl", [{"prompt": "1+1="}, {"prompt": "2+2=", "label": "4"}])
    with pytest.raises(UsageError, match=rf"^{partial}:1: the row has no 'label' key \(--label-key; other rows have "
                                         r"one\)"):
        jsonl_source(jsonl_config(prompt_data=partial))


def test_blank_lines_are_skipped(jsonl_config, tmp_path):
    path = tmp_path / "blank.jsonl"
    path.write_text('{"prompt": "1+1="}\n\n   \n{"prompt": "2+2="}\n')
    source = jsonl_source(jsonl_config(prompt_data=str(path)))
    assert [g.samples[0].prompt for g in source.get_groups(2)] == ["1+1=", "2+2="]


def test_malformed_json_names_the_file_and_line(jsonl_config, tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "1+1="}\n{"prompt": "2+2="}\n{"prompt": "3+3=",\n')
    with pytest.raises(UsageError, match=rf"^{path}:3: malformed JSON"):
        jsonl_source(jsonl_config(prompt_data=str(path)))


def test_row_without_the_input_key_names_the_key_the_line_and_the_keys_present(jsonl_config, write_jsonl):
    path = write_jsonl("nokey.jsonl", [{"prompt": "1+1="}, {"question": "2+2=", "label": "4"}])
    with pytest.raises(UsageError) as error:
        jsonl_source(jsonl_config(prompt_data=path))
    assert str(error.value) == f"{path}:2: the row has no 'prompt' key (--input-key); its keys are 'question', 'label'"


def test_parquet_row_without_the_input_key_names_the_row(jsonl_config, write_parquet):
    path = write_parquet("nokey.parquet", [{"text": "1+1="}])
    with pytest.raises(UsageError, match=rf"{path}, row 1: the row has no 'prompt' key .* its keys are 'text'"):
        jsonl_source(jsonl_config(prompt_data=path))


@pytest.mark.parametrize(("row", "problem"), [
    ([1, 2], "expected an object with a 'prompt' field, got list"),
    ({"prompt": ""}, "the prompt must be a non-empty string"),
    ({"prompt": 12}, "the prompt must be a non-empty string, got 12"),
    ({"prompt": [{"role": "user", "content": "1+1="}]}, "the prompt is a list .* add --apply-chat-template"),
    ({"prompt": "1+1=", "metadata": "x"}, "'metadata' \\(--metadata-key\\) must be an object, got str"),
])
def test_a_bad_row_is_reported_with_its_line(jsonl_config, write_jsonl, row, problem):
    path = write_jsonl("bad.jsonl", [{"prompt": "0+0="}, row])
    with pytest.raises(UsageError, match=rf"{path}:2: {problem}"):
        jsonl_source(jsonl_config(prompt_data=path))


def test_missing_unreadable_and_empty_files_name_the_path(jsonl_config, tmp_path, write_jsonl):
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(UsageError, match=rf"--prompt-data {missing}: no such file"):
        jsonl_config(prompt_data=str(missing))  # checked when the run is configured
    with pytest.raises(UsageError, match=rf"--eval-prompt-data {missing}: no such file"):
        jsonl_source(jsonl_config(prompt_data=write_jsonl("ok.jsonl", ROWS), eval_prompt_data=str(missing),
                                  datasource=None))
    not_parquet = tmp_path / "garbage.parquet"
    not_parquet.write_bytes(b"not a parquet file")
    with pytest.raises(UsageError, match=rf"--prompt-data {not_parquet}: cannot read it as parquet"):
        jsonl_source(jsonl_config(prompt_data=str(not_parquet)))
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes('{"prompt": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(UsageError, match=rf"--prompt-data {latin1}: not UTF-8 text"):
        jsonl_source(jsonl_config(prompt_data=str(latin1)))
    empty = write_jsonl("empty.jsonl", [])
    with pytest.raises(UsageError, match=rf"--prompt-data {empty}: the file has no rows"):
        jsonl_source(jsonl_config(prompt_data=empty))
    csv = tmp_path / "rows.csv"
    csv.write_text("prompt,label\n1+1=,2\n")
    with pytest.raises(UsageError, match=r"unsupported file type '\.csv'; use one of \.jsonl, \.parquet"):
        jsonl_source(jsonl_config(prompt_data=str(csv), datasource=None))


def test_choosing_jsonl_without_prompt_data_is_a_usage_error(jsonl_config):
    with pytest.raises(UsageError, match="--datasource jsonl needs --prompt-data PATH"):
        jsonl_config()


def test_files_are_not_checked_when_another_source_is_chosen(jsonl_config, tmp_path):
    config = jsonl_config(datasource="tasks", prompt_data=str(tmp_path / "missing.jsonl"))
    assert JsonlOptions.of(config).prompt_data == tmp_path / "missing.jsonl"


def test_values_are_checked_whichever_source_is_chosen(jsonl_config):
    with pytest.raises(UsageError, match="^--num-epochs 0: must be >= 1$"):
        jsonl_config(datasource="tasks", num_epochs=0)


def test_choosing_jsonl_without_a_model_says_to_pass_one(jsonl_config, example_file):
    with pytest.raises(UsageError, match="^--datasource jsonl needs --model DIR, a local Hugging Face model "):
        jsonl_config(prompt_data=example_file, model=None)  # checked when the run is configured


def test_without_eval_data_the_eval_split_is_empty(jsonl_config, example_file):
    assert jsonl_source(jsonl_config(prompt_data=example_file)).eval_groups() == []
