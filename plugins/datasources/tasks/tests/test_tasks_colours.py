"""--task colours: the images drawn in code match their labels, the prompts carry a JSON reference to
their image, and the recipe builds a warm-started tiny VLM that answers with colour words."""

import json

import numpy as np
import pytest
from plasmid_tasks import colours, plugin
from plasmid_tasks.source import TaskSource
from plasmid_tasks.tasks import make_task

from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions, RolloutOptions
from plasmid.testing import build, make_config
from plasmid_torch import vision
from plasmid_torch.trainer_options import TrainerOptions

pytest.importorskip("PIL")


class Trainer:
    """Declares the trainers' options (``--lr``), as the trainer plugin of a run does."""

    from plasmid import hookimpl

    @hookimpl
    def plasmid_addoption(self, parser):
        parser.add_options(TrainerOptions)


def test_each_image_shows_its_label_on_most_cells_and_is_the_same_every_time():
    task = make_task("colours")
    labels = []
    for item in range(300):
        messages, label = task.example(item)
        (image,) = vision.load_images(messages, f"item {item}")
        size = colours.SIDE // colours.CELLS
        pixels = np.asarray(image).reshape(colours.CELLS, size, colours.CELLS, size, 3)
        cells = [tuple(pixels[row, 4, column, 4]) for row in range(colours.CELLS) for column in range(colours.CELLS)]
        assert all((pixels[row, :, column, :] == pixels[row, 0, column, 0]).all()        # one colour a cell
                   for row in range(colours.CELLS) for column in range(colours.CELLS))
        counts = {name: cells.count(rgb) for name, rgb in colours.COLOURS.items()}
        assert sum(counts.values()) == colours.CELLS ** 2
        assert colours.MOST_CELLS[0] <= counts[label] <= colours.MOST_CELLS[1]
        assert all(count < counts[label] for name, count in counts.items() if name != label)
        assert task.example(item) == (messages, label)
        labels.append(label)
    assert {name: labels.count(name) for name in colours.COLOURS} == pytest.approx(
        dict.fromkeys(colours.COLOURS, 75), abs=25)                              # about as often each


@pytest.fixture(scope="module")
def colours_config(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("colours") / "run"
    config = make_config(plugin, Trainer(), run_dir=run_dir, datasource="tasks", task="colours",
                         colours_warmup_steps=3, n_samples_per_prompt=2, task_eval_size=8)
    TaskSource.prepare(config)
    return config


def test_the_recipe_builds_a_tiny_vlm_and_names_the_vision_path(colours_config):
    import transformers

    model_dir = GeneralOptions.of(colours_config).model
    model = transformers.AutoModelForImageTextToText.from_pretrained(model_dir)
    assert model.config.vision_config.patch_size == 8
    assert colours_config.option.generate == "vision"
    assert RolloutOptions.of(colours_config).max_new_tokens == len("yellow") + 1


def test_samples_carry_image_tokens_and_a_json_reference_to_their_image(colours_config):
    source = build("datasource", "tasks", plugin, config=colours_config)
    group = source.get_groups(1)[0]
    sample = group.samples[0]
    json.dumps(sample.metadata)                                           # checkpoints save it as JSON
    inputs = vision.ImageInputs(GeneralOptions.of(colours_config).model)(sample)
    assert inputs.image_grid_thw.tolist() == [[1, 4, 4]]                  # 32x32 pixels, 8-pixel patches
    assert sample.tokens.count(vision.VisionEncoder(GeneralOptions.of(colours_config).model).image_token_id) == 4
    assert sample.label in colours.COLOURS and sample.prompt[0]["content"][1]["text"] == colours.QUESTION
    assert len(source.eval_groups()) == 8


def test_a_text_model_is_refused_for_the_image_task(tmp_path):
    from plasmid_torch.tiny import build_tiny_model

    text_model = build_tiny_model(tmp_path / "text", seed=0)
    config = make_config(plugin, Trainer(), run_dir=tmp_path / "run", datasource="tasks", task="colours",
                         model=str(text_model))
    with pytest.raises(UsageError, match="not a vision-language model"):
        build("datasource", "tasks", plugin, config=config)
