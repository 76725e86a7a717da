"""The options of plasmid-mlflow."""

from __future__ import annotations

from plasmid.options import Options, option


class MlflowOptions(Options, group="mlflow", description="MLflow tracking of a run (a local file store by default)"):
    mlflow: bool = option(False, "log the run's options, every step's metrics, config.json and plugins.lock.json to "
                          "MLflow")
    mlflow_tracking_uri: str | None = option(
        None, "where MLflow stores the run: a server (http://host:5000) or a local store (file:/path/mlruns)",
        default_text="$MLFLOW_TRACKING_URI, else file:<run dir>/mlruns")
    mlflow_experiment: str = option("plasmid", "the MLflow experiment (created when missing)")
    mlflow_run_name: str | None = option(None, "the MLflow run name", default_text="the run directory's name")
