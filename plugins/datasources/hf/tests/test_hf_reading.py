"""What the hf source reads: every way ``--hf-path`` opens, splits, nested columns, the label
rule, the prompt-length filter, per-epoch shuffles, finite epochs, resume checks, and one-line
errors naming the path, split, row and key; and a short training run on it."""

import random

import pytest
from plasmid_hf_datasets import plugin

from plasmid.app.cli import main
from plasmid.errors import DataExhausted, UsageError
from plasmid.testing import build, make_config

PROMPTS = [f"{n}+{n}=" for n in range(10)]


@pytest.fixture
def hf_config(tmp_path, tiny_model):
    def factory(**options):
        options = {"datasource": "hf", "model": tiny_model, "n_samples_per_prompt": 2, **options}
        return make_config(plugin, run_dir=tmp_path / "run", **options)

    return factory


def hf_source(config):
    return build("datasource", "hf", plugin, config=config)


def prompts(groups):
    return [group.samples[0].prompt for group in groups]


@pytest.fixture
def ten(write_jsonl):
    return write_jsonl("ten.jsonl", [{"prompt": prompt, "label": str(n)} for n, prompt in enumerate(PROMPTS)])


def test_a_jsonl_file_a_builder_with_data_files_and_csv_read_alike(hf_config, ten, tmp_path):
    csv = tmp_path / "ten.csv"
    csv.write_text("prompt,label\n" + "".join(f"{prompt},{n}\n" for n, prompt in enumerate(PROMPTS)))
    for options in ({"hf_path": ten}, {"hf_path": "json", "hf_data_files": (ten,)}, {"hf_path": str(csv)}):
        groups = hf_source(hf_config(**options)).get_groups(10)
        assert prompts(groups) == PROMPTS, options
        assert [str(group.samples[0].label) for group in groups] == [str(n) for n in range(10)]


def test_nested_columns_of_a_saved_dataset_are_read_by_dotted_keys(hf_config, save_dataset, verl_rows):
    source = hf_source(hf_config(hf_path=save_dataset("verl", verl_rows), hf_label_key="reward_model.ground_truth",
                                 hf_metadata_key="extra"))
    sample = source.get_groups(1)[0].samples[0]
    assert (sample.prompt, sample.label, sample.metadata) == ("0+0=", "0", {"a": 0, "b": 0})
    assert sample.tokens == list(source.encode("0+0="))


def test_splits_of_a_saved_dataset_dict(hf_config, save_dataset, verl_rows):
    path = save_dataset("dd", {"train": verl_rows[:4], "validation": verl_rows[4:6]})
    source = hf_source(hf_config(hf_path=path, hf_split="validation", hf_eval_split="train",
                                 hf_label_key="reward_model.ground_truth"))
    assert prompts(source.get_groups(2)) == ["0+4=", "1+0="]
    assert prompts(source.eval_groups()) == ["0+0=", "0+1=", "0+2=", "0+3="]
    with pytest.raises(UsageError) as raised:
        hf_source(hf_config(hf_path=path, hf_split="test"))
    assert str(raised.value) == f"--hf-split test: --hf-path {path} has no such split; it has train, validation"


def test_a_saved_single_dataset_is_the_train_split(hf_config, save_dataset):
    path = save_dataset("single", [{"prompt": prompt} for prompt in PROMPTS])
    assert prompts(hf_source(hf_config(hf_path=path)).get_groups(3)) == PROMPTS[:3]
    with pytest.raises(UsageError, match="is a single dataset without splits"):
        hf_source(hf_config(hf_path=path, hf_eval_split="test"))


def test_prompts_over_the_token_limit_are_dropped(hf_config, write_jsonl):
    rows = [{"prompt": "1+1="}, {"prompt": "12+34="}, {"prompt": "5="}, {"prompt": "123+456="}]
    path = write_jsonl("mixed.jsonl", rows)
    unfiltered = hf_source(hf_config(hf_path=path))
    lengths = [len(unfiltered.encode(row["prompt"])) for row in rows]
    limit = lengths[0]
    assert lengths[1] > limit and lengths[2] <= limit and lengths[3] > limit
    source = hf_source(hf_config(hf_path=path, hf_max_prompt_tokens=limit, hf_num_epochs=1))
    assert prompts(source.get_groups(2)) == ["1+1=", "5="]
    assert source.dropped == {"train": 2}
    with pytest.raises(DataExhausted):
        source.get_groups(1)
    with pytest.raises(UsageError) as raised:
        hf_source(hf_config(hf_path=path, hf_max_prompt_tokens=1))
    assert str(raised.value) == (f"--hf-path {path} (train): every one of its 4 prompts has more than "
                                 f"--hf-max-prompt-tokens 1 tokens; raise it")


def test_the_runs_max_prompt_length_drops_rows_of_every_split_and_reports_them(hf_config, save_dataset):
    path = save_dataset("splits", {"train": [{"prompt": "1+1="}, {"prompt": "123+456="}, {"prompt": "5="}],
                                   "test": [{"prompt": "9+9="}, {"prompt": "111+222="}]})
    source = hf_source(hf_config(hf_path=path, hf_eval_split="test", max_new_tokens=8, max_prompt_length=5))
    assert [record.prompt for record in source.train] == ["1+1=", "5="]
    assert [record.prompt for record in source.eval] == ["9+9="]
    report = source.prompt_report
    assert (report.rows, report.dropped_overlong, report.data) == (5, 2, f"--hf-path {path} (split train)")
    assert report.chat_template_flag == "--hf-apply-chat-template", "the tiny tokenizer has a template, unused"
    with pytest.raises(UsageError, match=rf"^--hf-path {path} \(train\), row 2: the prompt has 9 tokens, more than "
                                         r"--max-prompt-length 5;"):
        hf_source(hf_config(hf_path=path, max_new_tokens=8, max_prompt_length=5, overlong_prompts="error"))


def test_a_character_the_tokenizer_cannot_encode_names_the_row(hf_config, write_jsonl):
    path = write_jsonl("odd.jsonl", [{"prompt": "1+1="}, {"prompt": "1+x="}])
    with pytest.raises(UsageError, match=rf"^--hf-path {path} \(train\), row 2: the tokenizer cannot encode the "
                                         r"character 'x' \(U\+0078\)"):
        hf_source(hf_config(hf_path=path))


def test_shuffle_gives_each_epoch_the_seeded_order(hf_config, ten):
    source = hf_source(hf_config(hf_path=ten, hf_shuffle=True, seed=3))
    first, second = prompts(source.get_groups(10)), prompts(source.get_groups(10))
    for epoch, got in enumerate((first, second)):
        order = list(range(10))
        random.Random(3 + epoch).shuffle(order)
        assert got == [PROMPTS[index] for index in order]
    assert first != second
    assert prompts(hf_source(hf_config(hf_path=ten)).get_groups(12)) == PROMPTS + PROMPTS[:2]


def test_finite_epochs_are_used_up_with_a_message_naming_the_flag(hf_config, ten):
    source = hf_source(hf_config(hf_path=ten, hf_num_epochs=2))
    source.get_groups(15)
    with pytest.raises(DataExhausted, match=r"\(split train\): the 2 epoch\(s\) of --hf-num-epochs are used up: "
                                            r"5 prompt\(s\) left, 6 needed; raise --hf-num-epochs"):
        source.get_groups(6)


def test_resuming_over_other_data_is_refused(hf_config, ten, write_jsonl):
    state = hf_source(hf_config(hf_path=ten)).state_dict()
    fewer = write_jsonl("three.jsonl", [{"prompt": prompt} for prompt in PROMPTS[:3]])
    with pytest.raises(UsageError, match="^the hf data source was saved over 10 prompts but --hf-path .*three.jsonl "
                                         r"\(split train\) now has 3; resume with the same data$"):
        hf_source(hf_config(hf_path=fewer)).load_state_dict(state)


@pytest.mark.parametrize(("rows", "options", "message"), [
    ([{"question": "1+1="}], {}, r", row 1: the row has no 'prompt' key \(--input-key\); its keys are 'question'"),
    ([{"prompt": "1+1=", "rm": {"x": 1}}], {"hf_label_key": "rm.truth"},
     r", row 1: the row has no 'rm.truth' key \(--label-key\); 'rm' has keys 'x'"),
    ([{"prompt": "1+1=", "label": "2"}, {"prompt": "2+2=", "label": None}], {},
     r", row 2: the row has no 'label' key \(--label-key; other rows have one\)"),
    ([{"prompt": ""}], {}, r", row 1: the prompt must be a non-empty string"),
])
def test_a_bad_row_is_one_line_naming_the_path_split_and_row(hf_config, write_jsonl, rows, options, message):
    path = write_jsonl("bad.jsonl", rows)
    with pytest.raises(UsageError, match=f"^--hf-path {path} \\(train\\){message}"):
        hf_source(hf_config(hf_path=path, **options))


def test_paths_that_datasets_cannot_open_are_one_line(hf_config, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "broken.parquet").write_text("not parquet")
    cases = [(str(tmp_path / "nope.jsonl"), "no such file or directory"),
             (str(tmp_path / "notes.txt"), "unsupported file type '.txt'"),
             (str(tmp_path / "broken.parquet"), "datasets cannot open it")]
    for path, message in cases:
        with pytest.raises(UsageError) as raised:
            hf_source(hf_config(hf_path=path))
        assert str(raised.value).startswith(f"--hf-path {path}: {message}"), raised.value
        assert "\n" not in str(raised.value)


@pytest.mark.timeout(300)
def test_plasmid_train_runs_on_the_hf_source_and_refuses_a_bad_path_before_writing(capsys, tmp_path, tiny_model,
                                                                                    save_dataset, verl_rows):
    path = save_dataset("verl", {"train": verl_rows})
    fast = ["--num-rollouts", "1", "--prompts-per-step", "2", "--n-samples-per-prompt", "2", "--eval-interval", "0",
            "--save-interval", "0", "--datasource", "hf", "--model", tiny_model]
    run_dir = tmp_path / "run"
    assert main(["train", *fast, "--hf-path", path, "--hf-label-key", "reward_model.ground_truth",
                 "--run-dir", str(run_dir)]) == 0
    assert (run_dir / "metrics.jsonl").is_file()
    bad_run = tmp_path / "bad-run"
    assert main(["train", *fast, "--hf-path", path, "--hf-split", "test", "--run-dir", str(bad_run)]) == 2
    err = capsys.readouterr().err
    assert f"plasmid: error: --hf-split test: --hf-path {path} has no such split; it has train" in err
    assert not bad_run.exists()
