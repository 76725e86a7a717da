"""What the tasks source checks of its prompts at start-up with a model: they encode, they fit the
context (a task's prompts are all about as long, so a prompt that does not fit is an error, never
a drop), and plain prompts to a model with a chat template are reported; ``--task-apply-chat-template``
encodes them as user messages."""

import pytest
from plasmid_tasks import plugin
from plasmid_tasks.source import TaskSource

from plasmid.errors import UsageError
from plasmid.testing import build, make_config
from plasmid_torch.tiny import build_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", hidden_size=16, num_layers=1,
                                num_heads=2))


@pytest.fixture(scope="module")
def no_plus_model(tmp_path_factory):
    """A tiny model whose char tokenizer has no ``+``: mod10's prompts (``a+b=``) cannot be encoded."""
    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "noplus", alphabet="0123456789=>",
                                hidden_size=16, num_layers=1, num_heads=2))


def source(tmp_path, **options):
    config = make_config(plugin, run_dir=tmp_path / "run", datasource="tasks", **options)
    return build("datasource", "tasks", plugin, config=config)


def test_the_eval_split_and_the_first_training_prompts_are_checked_and_reported(tmp_path, model):
    tasks = source(tmp_path, model=model, task="addition")
    report = tasks.prompt_report
    assert (report.data, report.dropped_overlong) == ("--task addition(digits=2)", 0)
    assert 200 < report.rows <= 200 + 256, "the eval split and the first 256 positions of epoch 0 (less held-out ones)"
    assert report.chat_template_flag == "--task-apply-chat-template"


def test_with_the_chat_template_a_prompt_is_a_user_message_and_nothing_is_reported(tmp_path, model):
    plain, chat = source(tmp_path, model=model), source(tmp_path, model=model, task_apply_chat_template=True)
    # the char tokenizer's template renders one user message as <bos> + its text: the same ids
    assert chat.get_groups(1)[0].samples[0].tokens == plain.get_groups(1)[0].samples[0].tokens
    assert chat.prompt_report.chat_template_flag == ""


def test_a_prompt_past_the_limit_is_an_error_whatever_overlong_prompts_says(tmp_path, model):
    with pytest.raises(UsageError) as raised:
        source(tmp_path, model=model, max_new_tokens=4, max_prompt_length=3, overlong_prompts="drop")
    assert str(raised.value) == ("--task mod10: the prompt '0+0=' has 5 tokens, more than --max-prompt-length 3; "
                                 "every prompt of the task is about as long, so none can be dropped: lower "
                                 "--max-new-tokens, or use a model with a longer context")


def test_a_prompt_the_tokenizer_cannot_encode_is_named(tmp_path, no_plus_model):
    with pytest.raises(UsageError, match=r"^--task mod10, prompt '0\+0=': the tokenizer cannot encode the "
                                         r"character '\+' \(U\+002B\)"):
        source(tmp_path, model=no_plus_model)


def test_the_chat_template_option_takes_a_boolean(tmp_path):
    with pytest.raises(UsageError) as raised:
        make_config(plugin, task_apply_chat_template="maybe")
    assert str(raised.value) == "--task-apply-chat-template: expected true or false, got 'maybe'"


def test_without_a_model_there_is_nothing_to_report_about_a_template(tmp_path):
    config = make_config(plugin, configure=False)
    config.option.datasource = "tasks"
    assert TaskSource(config).prompt_report.chat_template_flag == ""
