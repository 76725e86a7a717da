"""plasmid-tensorboard's options: off by default, the directory defaults into the run directory."""

from pathlib import Path

from plasmid_tensorboard import plugin
from plasmid_tensorboard.options import TensorboardOptions

from plasmid.testing import make_config


def test_off_by_default_and_the_event_dir_is_in_the_run_dir(tmp_path):
    config = make_config(plugin, run_dir=tmp_path / "run")
    assert TensorboardOptions.of(config).tensorboard is False
    assert plugin.event_dir(config) == tmp_path / "run" / "tensorboard"
    config = make_config(plugin, run_dir=tmp_path / "run", tensorboard=True, tensorboard_dir=tmp_path / "tb")
    assert TensorboardOptions.of(config).tensorboard is True and plugin.event_dir(config) == Path(tmp_path / "tb")
