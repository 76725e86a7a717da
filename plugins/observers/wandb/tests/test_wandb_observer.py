"""The observer's offline W&B run holds the config and each step's metrics (read back from the
``.wandb`` file), with no network."""

from __future__ import annotations

import json
import struct
import time

import pytest
from plasmid_wandb import plugin

from plasmid.errors import UsageError
from plasmid.testing import make_config

pytest.importorskip("wandb")


def read_records(path) -> list:
    """The protobuf records of a ``.wandb`` file (LevelDB log blocks after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    records, pos, chunk = [], 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


@pytest.mark.timeout(300)
def test_offline_run_holds_config_and_metrics_without_network(tmp_path, monkeypatch):
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens: any network use would fail
    config = make_config(plugin, run_dir=tmp_path, wandb=True, wandb_name="probe", top_p=0.125)
    plugin.plasmid_run_start(config=config, run_dir=str(tmp_path))
    plugin.plasmid_metrics(step=0, metrics={"rollout/reward_mean": 0.25, "train/loss": float("nan")})
    plugin.plasmid_metrics(step=1, metrics={"rollout/reward_mean": 0.5, "train/loss": 1.5})
    plugin.plasmid_run_end(run_dir=str(tmp_path), metrics={}, error=None)
    assert plugin._run is None
    [file] = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    records = read_records(file)
    deadline = time.monotonic() + 60
    while not any(r.WhichOneof("record_type") == "exit" for r in records) and time.monotonic() < deadline:
        time.sleep(0.5)  # the W&B service may still be writing the file when finish() returns
        records = read_records(file)
    history = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                     for item in record.history.item}
            history[items["_step"]] = {k: v for k, v in items.items() if not k.startswith("_")}
    assert history == {0: {"rollout/reward_mean": 0.25}, 1: {"rollout/reward_mean": 0.5, "train/loss": 1.5}}
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "probe"
    config_items = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert "option" not in config_items
    options = {key: value for key, value in config_items.items() if key != "_wandb"}
    assert options["top_p"] == 0.125 and options["wandb_name"] == "probe" and options["wandb"] is True
    assert options["run_dir"] == str(tmp_path)
    assert set(options) - {"plugin_lock"} == set(config.to_dict()["option"])
    assert options["plugin_lock"] == {entry["name"]: f"{entry['distribution']} {entry['version']}"
                                      for entry in config.plugin_lock}


def test_missing_wandb_is_one_line_at_configure(tmp_path, monkeypatch):
    monkeypatch.setattr(plugin.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UsageError, match="pip install wandb"):
        make_config(plugin, run_dir=tmp_path, wandb=True)
