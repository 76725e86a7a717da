"""An observer plugin: with ``--mlflow``, an MLflow run holds the run's options as params (every option
under its own name, flat: ``lr``, ``top_p``; values as in ``config.json``, JSON for non-strings), every
step's metrics (the rollout id as MLflow's step; ``metrics.jsonl`` stays the record of the run), and the
run directory's ``config.json`` and ``plugins.lock.json`` as artifacts (``reward_curve.svg`` too at the end).

Where (``--mlflow-tracking-uri``): unset, ``$MLFLOW_TRACKING_URI`` if set, else a local file store
``file:<run dir>/mlruns`` that needs no server (``mlflow ui --backend-store-uri <run dir>/mlruns``
shows it). MLflow 3 refuses file stores unless ``MLFLOW_ALLOW_FILE_STORE`` is set; for a ``file:``
URI (or a plain path) the plugin sets it to ``true`` in its own process when unset. The MLflow run
is created at run start (:func:`~plasmid.hookspecs.plasmid_run_start`, experiment
``--mlflow-experiment`` created when missing, tags ``plasmid.run_dir``) and terminated at run end
(``FINISHED``, or ``FAILED`` with the error in the tag ``plasmid.error``). A resumed run is a new
MLflow run with the same ``plasmid.run_dir`` tag. ``--mlflow`` without the ``mlflow`` package is a
one-line error at start-up, before anything is written.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError
from plasmid_mlflow.options import MlflowOptions

#: MLflow's limits on one ``log_batch`` call (``mlflow.utils.validation``).
PARAMS_PER_BATCH, METRICS_PER_BATCH = 100, 1000
#: Characters MLflow refuses in a metric name (it allows word characters, ``/``, ``.``, ``-``, space, ``:``).
NOT_IN_A_NAME = re.compile(r"[^/\w.\- :]")
#: Run-directory files logged as artifacts: at run start, and at run end.
START_ARTIFACTS, END_ARTIFACTS = ("config.json", "plugins.lock.json"), ("reward_curve.svg",)

#: ``(client, run id)`` of the MLflow run in progress (one per process), or ``None``.
_active: tuple[Any, str] | None = None


def tracking_uri_of(options: MlflowOptions, run_dir: str, environ: dict[str, str] | None = None) -> str:
    """The tracking URI the run logs to (module docstring)."""
    environ = dict(os.environ) if environ is None else environ
    if options.mlflow_tracking_uri:
        return options.mlflow_tracking_uri
    if environ.get("MLFLOW_TRACKING_URI"):
        return environ["MLFLOW_TRACKING_URI"]
    return (Path(run_dir).resolve() / "mlruns").as_uri()


def params_of(config: Config) -> dict[str, str]:
    """The MLflow params: every option of the run (the keys of ``config.json``'s ``option``) to its value,
    a string as it is and anything else as JSON (``null``, ``true``, ``0.125``, ``["a", "b"]``)."""
    return {name: value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            for name, value in config.to_dict()["option"].items()}


def metric_name(name: str) -> str:
    """``name`` with each character MLflow refuses in a metric name replaced by ``_``."""
    return NOT_IN_A_NAME.sub("_", name)


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[start:start + size] for start in range(0, len(items), size)]


def _log_files(client: Any, run_id: str, run_dir: str, names: tuple[str, ...]) -> None:
    for name in names:
        path = Path(run_dir) / name
        if path.is_file():
            client.log_artifact(run_id, str(path))


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(MlflowOptions)


@hookimpl
def plasmid_configure(config: Config) -> None:
    if MlflowOptions.of(config).mlflow and importlib.util.find_spec("mlflow") is None:
        raise UsageError("--mlflow needs the mlflow package (pip install mlflow-skinny)")


@hookimpl
def plasmid_run_start(config: Config, run_dir: str) -> None:
    global _active
    options = MlflowOptions.of(config)
    if not options.mlflow:
        return
    uri = tracking_uri_of(options, run_dir)
    if uri.startswith("file:") or "://" not in uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(options.mlflow_experiment)
    experiment_id = (experiment.experiment_id if experiment is not None
                     else client.create_experiment(options.mlflow_experiment))
    run = client.create_run(experiment_id, run_name=options.mlflow_run_name or Path(run_dir).name,
                            tags={"plasmid.run_dir": str(Path(run_dir).resolve())})
    run_id = run.info.run_id
    _active = (client, run_id)
    params = [Param(name, value) for name, value in sorted(params_of(config).items())]
    for batch in _chunks(params, PARAMS_PER_BATCH):
        client.log_batch(run_id, params=batch)
    _log_files(client, run_id, run_dir, START_ARTIFACTS)


@hookimpl
def plasmid_metrics(step: int, metrics: dict[str, float]) -> None:
    if _active is None:
        return
    from mlflow.entities import Metric

    client, run_id = _active
    stamp = int(time.time() * 1000)
    values = [Metric(metric_name(name), float(value), stamp, step) for name, value in metrics.items()
              if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)]
    for batch in _chunks(values, METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=batch)


@hookimpl
def plasmid_run_end(run_dir: str, metrics: dict[str, float], error: str | None) -> None:
    global _active
    if _active is None:
        return
    (client, run_id), _active = _active, None
    _log_files(client, run_id, run_dir, END_ARTIFACTS)
    if error is not None:
        client.set_tag(run_id, "plasmid.error", error[:5000])
    client.set_terminated(run_id, "FINISHED" if error is None else "FAILED")
