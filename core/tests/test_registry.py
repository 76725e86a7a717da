"""Registration hooks, provider naming rules and the choice of one-provider families."""

import sys
import types

import pytest

from plasmid import hookimpl
from plasmid.errors import PluginError
from plasmid.registry import Registry
from plasmid.testing import make_manager, make_registry


def plugin(name, **hooks):
    module = types.ModuleType(name)
    for hook, function in hooks.items():
        setattr(module, hook, hookimpl(function))
    return module


def registers(family_hook, *entries):
    def implementation(register):
        for args, kwargs in entries:
            register(*args, **kwargs)

    implementation.__name__ = family_hook
    return implementation


EVERY_HOOK = plugin(
    "every_family",
    plasmid_datasources=registers("plasmid_datasources", (("d", "x:y"), {})),
    plasmid_generators=registers("plasmid_generators", (("e", "x:y"), {})),
    plasmid_generate_fns=registers("plasmid_generate_fns", (("g", "x:y"), {})),
    plasmid_tokenizers=registers("plasmid_tokenizers", (("tk", "x:y"), {})),
    plasmid_rollouts=registers("plasmid_rollouts", (("r", "x:y"), {})),
    plasmid_rewards=registers("plasmid_rewards", (("rw", "x:y"), {})),
    plasmid_filters=registers("plasmid_filters", (("f", "x:y"), {})),
    plasmid_tools=registers("plasmid_tools", (("tl", "x:y"), {})),
    plasmid_losses=registers("plasmid_losses", (("l", "x:y"), {})),
    plasmid_trainers=registers("plasmid_trainers", (("t", "x:y"), {})),
    plasmid_weight_syncs=registers("plasmid_weight_syncs", (("w", "x:y"), {})),
    plasmid_runtimes=registers("plasmid_runtimes", (("rt", "x:y"), {})),
)


def test_every_registration_hook_feeds_its_family():
    registry = make_registry(EVERY_HOOK)
    expected = {"datasource": "d", "engine": "e", "rollout": "r", "reward": "rw", "filter": "f", "tool": "tl",
                "loss": "l", "trainer": "t", "weight_sync": "w", "tokenizer": "tk"}
    for family, name in expected.items():
        assert registry.names(family) == [name], family
    assert registry.names("generate") == ["g", "single-turn"]
    assert registry.names("runtime") == ["local", "rt"]
    assert registry.get("reward", "rw").plugin.name == "every_family"


def test_generate_functions_registered_the_old_way_still_work_with_a_deprecation_warning():
    old = plugin("old_generate", plasmid_generators=registers("plasmid_generators",
                                                              (("multi", "x:y"), {"kind": "generate"})))
    with pytest.warns(DeprecationWarning, match="plasmid_generate_fns"):
        registry = make_registry(old)
    assert "multi" in registry.names("generate") and "multi" not in registry.names("engine")


def test_a_kind_outside_the_generators_hook_is_an_error():
    bad = plugin("bad_kind", plasmid_rewards=registers("plasmid_rewards", (("r", "x:y"), {"kind": "generate"})))
    with pytest.raises(PluginError, match="plasmid_rewards takes no kind"):
        make_registry(bad)


def test_every_family_in_the_table_has_its_hookspec_and_flag():
    from plasmid import hookspecs
    from plasmid.config import OptionParser
    from plasmid.families import FAMILIES
    from plasmid.testing import make_manager

    parser = OptionParser()
    make_manager().addoption(parser)
    flags = {action.option_strings[0] for action in parser._parser._actions if action.option_strings}
    for family in FAMILIES:
        assert hasattr(hookspecs, family.hook), family.name
        assert family.flag in flags, family.name


def test_a_registration_hook_may_take_fewer_arguments():
    calls = []

    def plasmid_losses():
        calls.append(True)

    make_registry(plugin("quiet", plasmid_losses=plasmid_losses))
    assert calls == [True]


def test_two_plugins_registering_one_name_is_an_error_naming_both():
    first = plugin("first_pkg", plasmid_rewards=registers("plasmid_rewards", (("same", "a:b"), {})))
    second = plugin("second_pkg", plasmid_rewards=registers("plasmid_rewards", (("same", "c:d"), {})))
    with pytest.raises(PluginError, match="reward 'same' is registered by two plugins.*first_pkg.*second_pkg"):
        make_registry(first, second)


def test_single_candidate_is_chosen_without_a_flag():
    registry = make_registry(EVERY_HOOK)
    assert registry.choose("loss", None).name == "l"


def test_two_candidates_and_no_choice_lists_each_with_its_package():
    a = plugin("pkg_a", plasmid_losses=registers("plasmid_losses", (("alpha", "a:b"), {})))
    b = plugin("pkg_b", plasmid_losses=registers("plasmid_losses", (("beta", "a:b"), {})))
    registry = make_registry(a, b)
    with pytest.raises(PluginError) as error:
        registry.choose("loss", None)
    message = str(error.value)
    assert "'alpha' from 'pkg_a'" in message and "'beta' from 'pkg_b'" in message and "--loss NAME" in message


def test_the_one_default_wins_when_several_are_loaded():
    a = plugin("pkg_a", plasmid_losses=registers("plasmid_losses", (("alpha", "a:b"), {"default": True})))
    b = plugin("pkg_b", plasmid_losses=registers("plasmid_losses", (("beta", "a:b"), {})))
    assert make_registry(a, b).choose("loss", None).name == "alpha"


def test_two_defaults_are_ambiguous():
    a = plugin("pkg_a", plasmid_losses=registers("plasmid_losses", (("alpha", "a:b"), {"default": True})))
    b = plugin("pkg_b", plasmid_losses=registers("plasmid_losses", (("beta", "a:b"), {"default": True})))
    with pytest.raises(PluginError, match="none was chosen"):
        make_registry(a, b).choose("loss", None)


def test_unknown_name_suggests_the_closest():
    registry = make_registry(EVERY_HOOK)
    with pytest.raises(PluginError, match="unknown reward 'rx'.*did you mean 'rw'"):
        registry.get("reward", "rx")


def test_lazy_factory_is_imported_only_when_loaded(tmp_path, monkeypatch):
    (tmp_path / "lazy_target_mod.py").write_text("LOADED = True\nclass Factory:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    lazy = plugin("lazy_pkg", plasmid_rewards=registers("plasmid_rewards", (("lazy", "lazy_target_mod:Factory"), {})))
    registry = make_registry(lazy)
    assert "lazy_target_mod" not in sys.modules
    factory = registry.get("reward", "lazy").load()
    assert factory.__name__ == "Factory" and "lazy_target_mod" in sys.modules


def test_lazy_factory_that_fails_to_import_names_plugin_and_fix():
    broken = plugin("broken_pkg", plasmid_rewards=registers("plasmid_rewards", (("gone", "no_such_module_xyz:F"), {})))
    with pytest.raises(PluginError, match="reward 'gone' from plugin 'broken_pkg'.*ModuleNotFoundError"):
        make_registry(broken).get("reward", "gone").load()


def test_wrong_kind_is_an_error():
    bad = plugin("bad_kind", plasmid_generators=registers("plasmid_generators", (("x", "a:b"), {"kind": "engin"})))
    with pytest.raises(PluginError, match="kind='engin'"):
        make_registry(bad)


def test_hookimpl_with_unknown_argument_is_rejected_at_registration():
    def plasmid_rewards(register, extra):
        pass

    with pytest.raises(PluginError, match="invalid hook implementation"):
        make_manager(plugin("wrong_args", plasmid_rewards=plasmid_rewards))


def test_misspelled_hook_is_an_error_at_startup():
    def plasmid_reward(register):
        pass

    with pytest.raises(PluginError, match="does not define"):
        make_manager(plugin("typo_pkg", plasmid_reward=plasmid_reward))


def test_registry_collect_is_tolerant_when_asked():
    def plasmid_rewards(register):
        raise RuntimeError("boom")

    manager = make_manager(plugin("explodes", plasmid_rewards=plasmid_rewards))
    with pytest.raises(PluginError, match="explodes.*boom"):
        Registry.collect(manager)
    Registry.collect(manager, tolerant=True)
    assert manager.infos["explodes"].status == "skipped" and "boom" in manager.infos["explodes"].reason


def test_no_tokenizer_loaded_says_which_plugin_provides_the_default():
    with pytest.raises(PluginError, match="plugin 'hf' .*add hf to it"):
        make_registry().choose("tokenizer", None)
