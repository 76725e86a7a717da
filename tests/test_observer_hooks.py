"""Bootstrap and observer hooks of a local plugin are called, in order, during a real run."""

from __future__ import annotations

import json

from plasmid_e2e import SHORT_RUN, run_plasmid

OBSERVER = '''
import json
from plasmid import hookimpl

EVENTS = []


def _log(config_or_path, event):
    with open(OUT, "a") as handle:
        handle.write(json.dumps(event) + "\\n")


@hookimpl
def plasmid_addoption(parser):
    parser.getgroup("observer").addoption("--observer-log", default=None)


@hookimpl
def plasmid_configure(config):
    global OUT
    OUT = config.option.observer_log
    _log(OUT, {"hook": "configure", "loss": config.option.loss, "datasource": config.option.datasource})


@hookimpl
def plasmid_metrics(step, metrics):
    _log(OUT, {"hook": "metrics", "step": step, "has_reward": "rollout/reward_mean" in metrics})


@hookimpl
def plasmid_weights_synced(step, report):
    _log(OUT, {"hook": "weights_synced", "step": step, "version": report.weight_version,
               "bytes": report.bytes + report.metrics.get("sync/shared_bytes", 0)})


@hookimpl
def plasmid_step_end(step, run_dir, metrics):
    _log(OUT, {"hook": "step_end", "step": step, "run_dir": run_dir})
'''


def test_hooks_are_called_with_resolved_choices_and_each_step(tmp_path):
    plugin = tmp_path / "observer.py"
    plugin.write_text(OBSERVER)
    log = tmp_path / "events.jsonl"
    proc = run_plasmid("train", "--plugins", str(plugin), "--observer-log", str(log), *SHORT_RUN,
                       "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    assert "plasmid plugins (" in proc.stderr and "observer" in proc.stderr, "the resolved plugin set was not printed"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events[0] == {"hook": "configure", "loss": "grpo", "datasource": "tasks"}
    assert [e["hook"] for e in events[1:]] == ["weights_synced", "metrics", "step_end"] * 2
    synced = [e for e in events if e["hook"] == "weights_synced"]
    # the report of the sync that ran: bytes copied, or (the default inprocess sync) tensors shared
    assert [e["version"] for e in synced] == [1, 2] and all(e["bytes"] > 0 for e in synced)
    assert all(e["has_reward"] for e in events if e["hook"] == "metrics")
    assert {e["run_dir"] for e in events if e["hook"] == "step_end"} == {str(tmp_path / "run")}
