"""``plasmid plugins show`` describes each loss provider and lists the options the losses read."""

from __future__ import annotations

import json

from plasmid_e2e import run_plasmid


def show(plugin: str) -> dict:
    proc = run_plasmid("plugins", "show", plugin, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_show_lists_every_loss_provider_with_a_summary_and_the_options_they_read():
    grpo = show("grpo")
    summaries = {p["name"]: p["summary"] for p in grpo["provider_details"]}
    assert set(summaries) == {"grpo", "dr-grpo", "dapo", "gspo", "cispo", "rloo"}
    assert all(summaries.values())
    flags = {option["flag"] for option in grpo["options"]}
    assert {"--eps-clip", "--eps-clip-high", "--kl-loss-coef", "--loss-agg", "--tis", "--icepop", "--tis-clip",
            "--overlong-buffer-len", "--advantage-whiten", "--disable-std-normalization"} <= flags

    ppo = show("ppo")
    assert [p["name"] for p in ppo["provider_details"]] == ["ppo"]
    flags = [option["flag"] for option in ppo["options"]]
    assert flags[0] == "--value-clip"                     # its own option first
    assert {"--gamma", "--lambd", "--eps-clip"} <= set(flags)

    reinforce = show("reinforce-pp")
    assert {p["name"] for p in reinforce["provider_details"]} == {"reinforce++", "reinforce++-baseline"}
    assert "--gamma" in {option["flag"] for option in reinforce["options"]}


def test_show_prints_one_line_per_provider():
    proc = run_plasmid("plugins", "show", "grpo")
    assert proc.returncode == 0, proc.stderr
    assert "loss: grpo, dr-grpo, dapo, gspo, cispo, rloo" in proc.stdout
    assert "loss dapo: " in proc.stdout and "--overlong-buffer-len" in proc.stdout
