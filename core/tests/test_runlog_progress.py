"""The progress of ``RunLog``: a tqdm bar with ETA on a terminal, plain lines elsewhere; the
metrics written never depend on it."""

from __future__ import annotations

import io
import json

import pytest

from plasmid.app.runlog import RunLog


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(tmp_path, stream, steps=3):
    tmp_path.mkdir(exist_ok=True)
    log = RunLog(tmp_path, steps, stream=stream, plot_seconds=1e9)
    log.plot = lambda: None  # the curve is not what is tested here (core/tests/test_curve.py)
    for step in range(steps):
        log.write(step, {"rollout/reward_mean": 0.5 + step / 10})
    log.close()
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_a_terminal_gets_a_tqdm_bar_with_eta(tmp_path):
    pytest.importorskip("tqdm")
    stream = Terminal()
    rows = _run(tmp_path, stream)
    text = stream.getvalue()
    assert "3/3" in text and "<" in text and ("step/s" in text or "s/step" in text)  # tqdm: [elapsed<eta, rate]
    assert "reward 0.700" in text and "\r" in text
    assert [r["step"] for r in rows] == [0, 1, 2]


def test_no_terminal_no_bar_and_the_metrics_are_the_same(tmp_path):
    stream = io.StringIO()
    rows = _run(tmp_path / "a", stream)
    assert "\r" not in stream.getvalue() and stream.getvalue().startswith("step     0")
    assert _run(tmp_path / "b", Terminal()) == rows


def test_without_tqdm_a_terminal_gets_the_plain_bar(tmp_path, monkeypatch):
    import importlib

    real = importlib.import_module

    def no_tqdm(name, *args):
        if name == "tqdm":
            raise ImportError("no tqdm")
        return real(name, *args)

    monkeypatch.setattr("plasmid.app.runlog.importlib.import_module", no_tqdm)
    stream = Terminal()
    _run(tmp_path, stream)
    assert "[" in stream.getvalue() and "3/3" in stream.getvalue() and "#" in stream.getvalue()
