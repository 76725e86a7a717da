"""The --plugins / PLASMID_PLUGINS grammar."""

from plasmid.plugins import Selection

INSTALLED = ["grpo", "match", "tasks", "xyz"]


def test_unset_loads_everything():
    selection = Selection.parse(None, INSTALLED)
    assert selection.autoload and not selection.include and not selection.exclude


def test_names_load_exactly_those():
    selection = Selection.parse("grpo, match", INSTALLED)
    assert not selection.autoload
    assert selection.include == ["grpo", "match"]


def test_empty_value_loads_none():
    selection = Selection.parse("", INSTALLED)
    assert not selection.autoload and selection.include == []


def test_no_prefix_alone_keeps_autoload_and_excludes():
    selection = Selection.parse("no:xyz", INSTALLED)
    assert selection.autoload and selection.exclude == ["xyz"]


def test_paths_and_dotted_modules_are_local_plugins():
    selection = Selection.parse("./my_reward.py,my_pkg.rewards,grpo", INSTALLED)
    assert selection.local == ["./my_reward.py", "my_pkg.rewards"]
    assert selection.include == ["grpo"] and not selection.autoload


def test_local_module_alone_adds_to_everything_installed():
    selection = Selection.parse("./my_reward.py", INSTALLED)
    assert selection.autoload and selection.local == ["./my_reward.py"]


def test_unknown_plain_name_is_kept_for_the_loader_to_report():
    assert Selection.parse("grop", INSTALLED).include == ["grop"]


def test_flag_wins_over_environment():
    env = {"PLASMID_PLUGINS": "xyz"}
    assert Selection.from_env_or_flag("grpo", INSTALLED, env).include == ["grpo"]
    assert Selection.from_env_or_flag(None, INSTALLED, env).include == ["xyz"]
    assert Selection.from_env_or_flag(None, INSTALLED, {"PLASMID_PLUGINS": ""}).include == []


def test_an_entry_point_seen_twice_is_loaded_once(monkeypatch):
    import importlib.metadata as metadata

    from plasmid import plugins

    twin = metadata.EntryPoint("twin", "json", "plasmid")
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: [twin, twin])
    assert list(plugins.installed_entry_points()) == ["twin"]


class FakeDist:
    def __init__(self, name):
        self.name, self.version = name, "1.0"


def entry_point(name, value, distribution):
    import importlib.metadata as metadata

    return metadata.EntryPoint(name, value, "plasmid")._for(FakeDist(distribution))


def test_two_distributions_claiming_one_plugin_name_keep_the_first_party_one_and_say_so(monkeypatch):
    from plasmid import plugins

    third, first = entry_point("same", "json", "rl-plugin-same"), entry_point("same", "csv", "plasmid-match")
    for order in ([third, first], [first, third]):
        monkeypatch.setattr(plugins.metadata, "entry_points", lambda group, order=order: order)
        shadowed: list[str] = []
        assert plugins.installed_entry_points(shadowed)["same"].value == "csv"
        assert len(shadowed) == 1 and "of distribution rl-plugin-same 1.0 (json)" in shadowed[0]
        assert "plasmid-match 1.0 already provides" in shadowed[0]


def test_between_two_third_parties_the_first_found_keeps_the_name(monkeypatch):
    from plasmid import plugins

    one, two = entry_point("same", "json", "rl-one"), entry_point("same", "csv", "rl-two")
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: [one, two])
    shadowed: list[str] = []
    assert plugins.installed_entry_points(shadowed)["same"].value == "json"
    assert "skipping plugin 'same' of distribution rl-two" in shadowed[0]
