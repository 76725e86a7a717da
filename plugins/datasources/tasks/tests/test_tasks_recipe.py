"""The quickstart recipe and the prompt encoding it implies."""

import json

import pytest
from plasmid_tasks import plugin
from plasmid_tasks.encoding import char_token_ids
from plasmid_tasks.source import TaskSource
from plasmid_tasks.tasks import IMAGE_TASKS, TASK_NAMES, make_task
from plasmid_tasks.toolcalc import TOOLCALC_ALPHABET, toolcalc_tokenizer

from plasmid import hookimpl
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions, RolloutOptions
from plasmid.testing import build, make_config
from plasmid_torch.hf import load_tokenizer
from plasmid_torch.tiny import DIGITS_ALPHABET, char_tokenizer
from plasmid_torch.trainer_options import TrainerOptions


class Trainer:
    """Stands for the trainer plugin of a run: it declares the trainers' options (``--lr``)."""

    @hookimpl
    def plasmid_addoption(self, parser):
        parser.add_options(TrainerOptions)


def quickstart_config(tmp_path, **options):
    """What ``plasmid train`` configures when it chose ``--datasource tasks`` (and a trainer),
    prepared as it is once the run directory is checked (the tiny model built)."""
    config = make_config(plugin, Trainer(), run_dir=tmp_path / "run", datasource="tasks", **options)
    TaskSource.prepare(config)
    return config


def lr_of(config):
    return TrainerOptions.of(config).lr


def model_of(config):
    return GeneralOptions.of(config).model


def max_new_tokens_of(config):
    return RolloutOptions.of(config).max_new_tokens


def test_the_recipe_only_names_the_model_and_prepare_builds_it(tmp_path):
    config = make_config(plugin, Trainer(), run_dir=tmp_path / "run", datasource="tasks")
    assert model_of(config) == str(tmp_path / "run" / "model")
    assert not (tmp_path / "run").exists(), "configuring a run writes nothing (the run dir is not checked yet)"
    TaskSource.prepare(config)
    assert (tmp_path / "run" / "model" / "config.json").is_file()


def test_recipe_builds_the_tiny_model_and_fills_lr_and_answer_length(tmp_path):
    config = quickstart_config(tmp_path, task="reverse", task_length=4)
    model_dir = tmp_path / "run" / "model"
    assert model_of(config) == str(model_dir)
    assert lr_of(config) == 5e-4
    assert max_new_tokens_of(config) == 4
    shape = json.loads((model_dir / "config.json").read_text())
    assert shape["model_type"] == "qwen2"
    assert (shape["hidden_size"], shape["num_hidden_layers"], shape["num_attention_heads"]) == (64, 2, 4)
    assert (shape["intermediate_size"], shape["max_position_embeddings"]) == (256, 64)
    assert shape["tie_word_embeddings"] is True


def test_recipe_builds_the_architecture_asked_for(tmp_path):
    config = quickstart_config(tmp_path, task_arch="llama")
    assert json.loads((tmp_path / "run" / "model" / "config.json").read_text())["model_type"] == "llama"
    assert max_new_tokens_of(config) == 1


def test_a_resumed_run_keeps_its_model(tmp_path):
    quickstart_config(tmp_path)
    weights = tmp_path / "run" / "model" / "model.safetensors"
    before = weights.read_bytes()
    config = quickstart_config(tmp_path, seed=7)  # a rebuild with another seed would change the weights
    assert model_of(config) == str(tmp_path / "run" / "model")
    assert weights.read_bytes() == before


def test_recipe_keeps_what_the_user_set(tmp_path):
    own_model = model_of(quickstart_config(tmp_path / "first"))
    config = quickstart_config(tmp_path, model=own_model, max_new_tokens=9)
    assert model_of(config) == own_model
    assert max_new_tokens_of(config) == 9
    assert lr_of(config) == TrainerOptions.defaults().lr, "an own model gets the trainers' lr, not the tiny model's"
    assert not (tmp_path / "run" / "model").exists()
    assert lr_of(quickstart_config(tmp_path / "lr", lr=1e-3)) == 1e-3


def test_recipe_does_nothing_when_another_source_is_chosen(tmp_path):
    config = make_config(plugin, run_dir=tmp_path / "run", datasource="jsonl")
    assert model_of(config) is None
    assert not (tmp_path / "run").exists()


def test_recipe_rejects_tasks_too_long_for_the_tiny_model(tmp_path):
    with pytest.raises(UsageError, match=r"reverse\(length=40\) needs 83 positions"):
        quickstart_config(tmp_path, task="reverse", task_length=40)
    with pytest.raises(UsageError, match="--task-eval-size"):
        quickstart_config(tmp_path, task="digitsum", task_length=1)


def test_recipe_samples_carry_the_tiny_models_token_ids(tmp_path):
    config = quickstart_config(tmp_path, n_samples_per_prompt=2)
    sample = build("datasource", "tasks", plugin, config=config).get_groups(1)[0].samples[0]
    tokenizer = load_tokenizer(model_of(config))
    assert sample.tokens == tokenizer(sample.prompt)["input_ids"]
    assert tokenizer.decode(char_token_ids(sample.label), skip_special_tokens=True) == sample.label


@pytest.mark.parametrize("name", [name for name in TASK_NAMES if name not in IMAGE_TASKS])
def test_direct_char_encoding_equals_the_char_tokenizer(name):
    toolcalc = name == "toolcalc"
    tokenizer = toolcalc_tokenizer() if toolcalc else char_tokenizer()
    alphabet = TOOLCALC_ALPHABET if toolcalc else DIGITS_ALPHABET
    task = make_task(name, length=4, digits=3)
    for item in (0, 7, task.domain_size // 2, task.domain_size - 1):
        prompt, label = task.example(item)
        assert char_token_ids(prompt, alphabet) == tokenizer(prompt)["input_ids"]
        assert char_token_ids(label, alphabet) == tokenizer(label)["input_ids"]
        if not toolcalc:
            assert char_token_ids(prompt) == tokenizer(prompt)["input_ids"]
