"""The observer's MLflow run, in a local file store, holds the options as params, each step's finite
metrics and the run's header files, read back with MLflow's own client; a real ``plasmid train`` run too."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from plasmid_mlflow import plugin
from plasmid_mlflow.options import MlflowOptions

from plasmid.errors import UsageError
from plasmid.testing import make_config

mlflow = pytest.importorskip("mlflow")


def client_for(uri: str):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return mlflow.tracking.MlflowClient(tracking_uri=uri)


def only_run(uri: str, experiment: str = "plasmid"):
    client = client_for(uri)
    [run] = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return client, run


def history(client, run_id: str, name: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, name)]


def test_hooks_log_flat_params_finite_metrics_and_the_header_files(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = make_config(plugin, run_dir=tmp_path, mlflow=True, mlflow_run_name="probe", top_p=0.125)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    (tmp_path / "plugins.lock.json").write_text('{"plugins": []}')
    plugin.plasmid_run_start(config=config, run_dir=str(tmp_path))
    plugin.plasmid_metrics(step=0, metrics={"rollout/reward_mean": 0.25, "train/loss": float("nan"), "ok": True})
    plugin.plasmid_metrics(step=1, metrics={"rollout/reward_mean": 0.5, "train/loss": 1.5, "eval/acc@k": 0.75})
    plugin.plasmid_run_end(run_dir=str(tmp_path), metrics={}, error=None)
    assert plugin._active is None
    client, run = only_run((tmp_path / "mlruns").as_uri())
    assert run.info.run_name == "probe" and run.info.status == "FINISHED"
    assert run.data.tags["plasmid.run_dir"] == str(tmp_path.resolve())
    params = run.data.params
    assert set(params) == set(config.to_dict()["option"])
    assert params["top_p"] == "0.125" and params["mlflow"] == "true" and params["mlflow_run_name"] == "probe"
    assert params["mlflow_tracking_uri"] == "null"
    assert history(client, run.info.run_id, "rollout/reward_mean") == [(0, 0.25), (1, 0.5)]
    assert history(client, run.info.run_id, "train/loss") == [(1, 1.5)]
    assert history(client, run.info.run_id, "eval/acc_k") == [(1, 0.75)]
    assert "ok" not in run.data.metrics
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"config.json", "plugins.lock.json"}
    copy = client.download_artifacts(run.info.run_id, "plugins.lock.json", str(tmp_path / "down"))
    assert open(copy).read() == '{"plugins": []}'


def test_a_failed_run_is_failed_with_its_error_and_the_uri_option_wins(tmp_path, monkeypatch):
    store = (tmp_path / "elsewhere").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "from-env").as_uri())
    config = make_config(plugin, run_dir=tmp_path / "run", mlflow=True, mlflow_tracking_uri=store,
                         mlflow_experiment="exp")
    plugin.plasmid_run_start(config=config, run_dir=str(tmp_path / "run"))
    plugin.plasmid_run_end(run_dir=str(tmp_path / "run"), metrics={}, error="RuntimeError: boom")
    _, run = only_run(store, "exp")
    assert run.info.run_name == "run" and run.info.status == "FAILED"
    assert run.data.tags["plasmid.error"] == "RuntimeError: boom"
    assert not (tmp_path / "from-env").exists()


def test_where_the_run_goes_without_the_option():
    options = MlflowOptions(mlflow=True, mlflow_tracking_uri=None, mlflow_experiment="plasmid", mlflow_run_name=None)
    assert plugin.tracking_uri_of(options, "/r", {}) == "file:///r/mlruns"
    assert plugin.tracking_uri_of(options, "/r", {"MLFLOW_TRACKING_URI": "http://h:5000"}) == "http://h:5000"
    assert plugin.metric_name("eval/pass@4 (greedy)") == "eval/pass_4 _greedy_"


def test_disabled_logs_nothing(tmp_path):
    config = make_config(plugin, run_dir=tmp_path)
    plugin.plasmid_run_start(config=config, run_dir=str(tmp_path))
    plugin.plasmid_metrics(step=0, metrics={"train/loss": 1.0})
    plugin.plasmid_run_end(run_dir=str(tmp_path), metrics={}, error=None)
    assert plugin._active is None and not (tmp_path / "mlruns").exists()


def test_missing_mlflow_is_one_line_at_configure(tmp_path, monkeypatch):
    monkeypatch.setattr(plugin.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UsageError, match="pip install mlflow-skinny"):
        make_config(plugin, run_dir=tmp_path, mlflow=True)


@pytest.mark.timeout(600)
def test_a_run_logs_the_metrics_jsonl_values_and_its_header(tmp_path):
    run_dir = tmp_path / "run"
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-m", "plasmid.app.cli", "train", "--seed", "0", "--num-rollouts", "2",
                           "--prompts-per-step", "2", "--n-samples-per-prompt", "2", "--eval-interval", "0",
                           "--save-interval", "0", "--run-dir", str(run_dir), "--mlflow"],
                          capture_output=True, text=True, env=env, timeout=500)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    client, run = only_run((run_dir / "mlruns").as_uri())
    for name in ("rollout/reward_mean", "train/loss", "train/grad_norm"):
        assert history(client, run.info.run_id, name) == [(row["step"], pytest.approx(row[name], rel=1e-6))
                                                          for row in rows]
    assert run.data.params["num_rollouts"] == "2" and run.info.status == "FINISHED"
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id)}
    assert {"config.json", "plugins.lock.json", "reward_curve.svg"} <= artifacts
    lock = client.download_artifacts(run.info.run_id, "plugins.lock.json", str(tmp_path / "down"))
    assert open(lock).read() == (run_dir / "plugins.lock.json").read_text()
