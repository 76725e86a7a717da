"""The tasks source keeps the data-source contract, with and without the quickstart recipe."""

from plasmid_tasks import plugin

from plasmid.testing import DataSourceContract


class TestMod10WithTheQuickstartRecipe(DataSourceContract):
    """As the quickstart runs it: the recipe builds the tiny model and its tokenizer encodes."""

    plugin = plugin
    provider = "tasks"


class TestReverseWithoutAModel(DataSourceContract):
    """A held-out task encoded by the built-in char encoding (no model, no recipe): 100 prompts,
    20 held out, so the resume test crosses epochs."""

    plugin = plugin
    provider = "tasks"
    config_options = {"datasource": None, "task": "reverse", "task_length": 2, "task_eval_size": 20}
