"""The observer writes event files that TensorBoard reads back: through the hooks, and in a run; read by the
classic ``EventAccumulator`` (what scripts and notebooks use) and by a TensorBoard server's scalars dashboard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from plasmid_tensorboard import plugin

from plasmid.errors import UsageError
from plasmid.testing import make_config

pytest.importorskip("tensorboard")


def read_scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """Every scalar as TensorBoard's classic ``EventAccumulator`` reads it: ``{tag: [(step, value)]}``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(directory))
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def served_scalars(logdir) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Every scalar as a TensorBoard server started on ``logdir`` shows it in its scalars dashboard (its HTTP
    data API): ``{run: {tag: [(step, value)]}}``."""
    from tensorboard import default, program

    board = program.TensorBoard(plugins=default.get_plugins())
    board.configure(argv=[None, "--logdir", str(logdir), "--load_fast", "false", "--host", "127.0.0.1",
                          "--port", "0"])
    url = board.launch()

    def get(path):
        with urllib.request.urlopen(url + path, timeout=30) as answer:
            return json.load(answer)

    deadline = time.monotonic() + 60
    while not (tags := get("data/plugin/scalars/tags")) and time.monotonic() < deadline:
        time.sleep(0.2)
    return {run: {tag: [(step, value) for _, step, value in
                        get("data/plugin/scalars/scalars?" + urllib.parse.urlencode({"run": run, "tag": tag}))]
                  for tag in run_tags}
            for run, run_tags in tags.items()}


def test_hooks_write_finite_scalars_per_step_and_close(tmp_path):
    config = make_config(plugin, run_dir=tmp_path, tensorboard=True)
    plugin.plasmid_run_start(config=config, run_dir=str(tmp_path))
    plugin.plasmid_metrics(step=0, metrics={"rollout/reward_mean": 0.25, "train/loss": float("nan")})
    plugin.plasmid_metrics(step=1, metrics={"rollout/reward_mean": 0.5, "train/loss": 1.5})
    plugin.plasmid_run_end(run_dir=str(tmp_path), metrics={}, error=None)
    assert plugin._writer is None
    scalars = read_scalars(tmp_path / "tensorboard")
    assert scalars == {"rollout/reward_mean": [(0, 0.25), (1, 0.5)], "train/loss": [(1, 1.5)]}
    assert served_scalars(tmp_path) == {"tensorboard": scalars}


def test_a_step_without_a_finite_value_writes_no_event(tmp_path):
    assert plugin.scalar_event(3, {"train/loss": float("inf"), "flag": True}) is None
    event = plugin.scalar_event(3, {"b": 2, "a": 0.5})
    assert event.step == 3 and [(v.tag, v.simple_value) for v in event.summary.value] == [("a", 0.5), ("b", 2.0)]


def test_disabled_writes_nothing(tmp_path):
    config = make_config(plugin, run_dir=tmp_path)
    plugin.plasmid_run_start(config=config, run_dir=str(tmp_path))
    plugin.plasmid_metrics(step=0, metrics={"a": 1.0})
    plugin.plasmid_run_end(run_dir=str(tmp_path), metrics={}, error=None)
    assert not (tmp_path / "tensorboard").exists()


def test_missing_tensorboard_is_one_line_at_configure(tmp_path, monkeypatch):
    monkeypatch.setattr(plugin.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UsageError, match="pip install tensorboard"):
        make_config(plugin, run_dir=tmp_path, tensorboard=True)


@pytest.mark.timeout(600)
def test_a_run_writes_the_metrics_jsonl_values_as_event_files(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "plasmid.app.cli", "train", "--seed", "0", "--num-rollouts", "2",
                           "--prompts-per-step", "2", "--n-samples-per-prompt", "2", "--eval-interval", "0",
                           "--save-interval", "0", "--run-dir", str(run), "--tensorboard"],
                          capture_output=True, text=True, env=env, timeout=500)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    scalars = read_scalars(run / "tensorboard")
    for name in ("rollout/reward_mean", "train/loss", "train/grad_norm"):
        assert scalars[name] == [(row["step"], pytest.approx(row[name], rel=1e-6)) for row in rows]
    assert served_scalars(run)["tensorboard"]["train/loss"] == scalars["train/loss"]
