"""plasmid-wandb's options: off by default; the mode never needs a network unless configured."""

from plasmid_wandb import plugin
from plasmid_wandb.options import WandbOptions

from plasmid.testing import make_config


def test_off_by_default_and_offline_unless_configured(tmp_path):
    options = WandbOptions.of(make_config(plugin, run_dir=tmp_path))
    assert options.wandb is False and options.wandb_project == "plasmid"
    assert plugin.mode_of(options, {}) == "offline"
    assert plugin.mode_of(options, {"WANDB_API_KEY": "k"}) == "online"
    assert plugin.mode_of(options, {"WANDB_API_KEY": "k", "WANDB_MODE": "offline"}) == "offline"
    online = WandbOptions.of(make_config(plugin, run_dir=tmp_path, wandb_mode="online"))
    assert plugin.mode_of(online, {"WANDB_MODE": "offline"}) == "online"
