"""plasmid-mlflow's options: off by default, a local store under the run directory unless configured."""

from plasmid_mlflow import plugin
from plasmid_mlflow.options import MlflowOptions

from plasmid.testing import make_config


def test_off_by_default_with_the_documented_defaults(tmp_path):
    options = MlflowOptions.of(make_config(plugin, run_dir=tmp_path))
    assert options.mlflow is False and options.mlflow_experiment == "plasmid"
    assert options.mlflow_tracking_uri is None and options.mlflow_run_name is None
    assert plugin.tracking_uri_of(options, str(tmp_path), {}) == (tmp_path / "mlruns").as_uri()
