"""``plasmid parity`` through the ``plasmid`` CLI on tiny models: torchgen and torchtrain agree, a
weight planted on the engine side is found and named, MoE routing is compared, bad input is one line
with exit 2."""

from __future__ import annotations

import json

import pytest
from plasmid_parity.report import LogprobDiff, bucket_label, bucket_of

from plasmid.app.cli import main

#: the plugins a run of torchgen and torchtrain resolves (every single-provider family has one)
PLUGINS = ["--plugins", "hf,tasks,torchgen,torchtrain,grpo,rollout,sync"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from plasmid_torch.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("parity") / "tiny", seed=3))


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    from plasmid_torch.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("parity") / "moe", seed=3, arch="qwen3_moe"))


def parity(capsys, *argv):
    status = main(["parity", "--engine", "torchgen", "--trainer", "torchtrain", *PLUGINS, "--max-new-tokens", "8",
                   *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def reported_max(out: str) -> float:
    line = next(line for line in out.splitlines() if line.startswith("log-prob |engine - trainer|"))
    return float(line.split(": max ")[1].split()[0])


def test_torchgen_and_torchtrain_agree_within_1e_5_and_exit_0(capsys, tiny):
    status, out, err = parity(capsys, "--model", tiny, "--bound", "1e-5")
    assert status == 0, out + err
    assert reported_max(out) <= 1e-5
    assert "within the bound 1e-05" in out
    assert "by response position" in out and "first divergence" not in out


def test_a_weight_perturbed_on_the_engine_only_exits_1_and_names_its_layer(capsys, tiny):
    status, out, err = parity(capsys, "--model", tiny, "--parity-perturb-engine", "model.layers.1.mlp.down_proj.weight")
    assert status == 1, out + err
    assert "EXCEEDS the bound 0.0001" in out       # the fp32 default
    first = next(line for line in out.splitlines() if line.startswith("first divergence:"))
    assert first.startswith("first divergence: layer 1, mlp (MLP)"), first
    assert "layer 0 output 0.000e+00" in " ".join(out.split())


def test_a_perturbed_norm_is_named_as_the_norm_of_its_layer(capsys, tiny):
    status, out, _ = parity(capsys, "--model", tiny, "--parity-perturb-engine",
                            "model.layers.0.post_attention_layernorm.weight")
    assert status == 1
    assert "first divergence: layer 0, post_attention_layernorm (norm)" in out


def test_moe_reports_routing_decisions_that_differ_and_that_torchtrain_does_not_replay_them(capsys, tiny_moe):
    status, out, _ = parity(capsys, "--model", tiny_moe)
    assert status == 0
    assert "MoE routing: 0 of " in out and "nothing to cover" in out
    status, out, _ = parity(capsys, "--model", tiny_moe, "--parity-perturb-engine",
                            "model.layers.0.self_attn.q_proj.weight")
    assert status == 1
    assert "first divergence: layer 0, self_attn (attention)" in out
    routing = next(line for line in out.splitlines() if line.startswith("MoE routing:"))
    differing, decisions = int(routing.split()[2]), int(routing.split()[4])
    assert 0 < differing < decisions
    assert "routing replay: not covered: trainer 'torchtrain' has no routing replay" in out


def test_given_sequences_are_scored(capsys, tiny, tmp_path):
    path = tmp_path / "seqs.jsonl"
    path.write_text(json.dumps({"token_ids": [1, 4, 5, 13, 6, 7, 8, 2], "prompt_length": 4}) + "\n\n"
                    + json.dumps({"token_ids": [1, 3, 3], "prompt_length": 1}) + "\n")
    status, out, _ = parity(capsys, "--model", tiny, "--sequences", str(path))
    assert status == 0
    assert f"2 sequences from {path}" in out
    assert "over 6 response tokens" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "/nonexistent/model"], "--model /nonexistent/model"),
    (["--engine", "warp"], "unknown engine 'warp' (--engine)"),
    ([], "plasmid parity: give --model DIR"),
    (["--parity-perturb-engine", "no.such.weight"], "--parity-perturb-engine no.such.weight: the trainer exports no"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tiny, argv, message):
    model = [] if "--model" in argv or not argv else ["--model", tiny]
    status = main(["parity", *PLUGINS, *model, *argv])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("plasmid: error: ") and message in err, err


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", "not valid JSON"),
    (json.dumps({"token_ids": [1, 2, 3], "prompt_length": 3}), "prompt_length must be an integer in [1, 2]"),
    (json.dumps({"token_ids": [1, 999], "prompt_length": 1}), "token id 999 is outside the model's vocabulary"),
    (json.dumps({"tokens": [1, 2]}), 'expected {"token_ids"'),
])
def test_a_bad_sequences_line_is_named_with_exit_2(capsys, tiny, tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"token_ids": [1, 4, 2], "prompt_length": 1}) + "\n" + line + "\n")
    status = main(["parity", *PLUGINS, "--model", tiny, "--sequences", str(path)])
    err = capsys.readouterr().err
    assert status == 2
    assert f"--sequences {path}:2: " in err and message in err and err.count("\n") == 1, err


def test_position_buckets_double_and_the_maximum_names_its_token():
    assert [bucket_of(p) for p in (0, 1, 2, 3, 4, 7, 8)] == [0, 1, 2, 2, 3, 3, 4]
    assert [bucket_label(b) for b in range(5)] == ["0", "1", "2-3", "4-7", "8-15"]
    diff = LogprobDiff.of([[-1.0, -2.0, -3.0], [-1.0]], [[-1.0, -2.5, -3.0], [-1.25]])
    assert diff.max == 0.5 and diff.worst == (0, 1) and diff.tokens == 4
    assert diff.mean == pytest.approx(0.75 / 4)
    assert [(b.label, b.tokens, b.max) for b in diff.buckets] == [("0", 2, 0.25), ("1", 1, 0.5), ("2-3", 1, 0.0)]
    assert not diff.within(0.4) and diff.within(0.5)
    assert LogprobDiff.of([[float("nan")]], [[-1.0]]).max == float("inf")
    with pytest.raises(ValueError, match="sequence 0: the engine scored 1 response tokens, the trainer 2"):
        LogprobDiff.of([[-1.0]], [[-1.0, -2.0]])


def test_an_engine_serving_elsewhere_gets_the_log_prob_report_and_says_the_layer_search_cannot_run():
    from types import SimpleNamespace

    from plasmid_parity.command import search_lines
    from plasmid_parity.layers import hf_module

    remote = SimpleNamespace(base_url="http://127.0.0.1:30000")          # an HTTP engine: no module here
    model, why = hf_module(remote, "engine", "sglang")
    assert model is None and "engine 'sglang' holds no Hugging Face module in this process" in why
    config = SimpleNamespace(option=SimpleNamespace(engine="sglang", trainer="torchtrain"))
    lines = search_lines(config, remote, SimpleNamespace(model=None), [], 1e-4, within=False)
    assert lines == [f"layer search unavailable: {why}"]
    assert search_lines(config, remote, SimpleNamespace(model=None), [], 1e-4, within=True) == []
