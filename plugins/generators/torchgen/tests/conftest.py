"""Fixtures shared by torchgen's tests."""

import plasmid_torchgen.plugin
import pytest

from plasmid.testing import build, make_config, run


@pytest.fixture
def make_engine(tmp_path):
    """``make_engine(model_dir, **options)``: a torchgen engine built from the run's options;
    every engine made is shut down when the test ends."""
    engines = []

    def factory(model_dir, **options):
        config = make_config(plasmid_torchgen.plugin, run_dir=tmp_path / "run", model=str(model_dir), **options)
        engine = build("engine", "torchgen", plasmid_torchgen.plugin, config=config)
        engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        run(engine.shutdown())
