"""Typed options: one declaration gives the flag, the help with the real default, the checks and
the typed value; recipes fill only what the user left unset; configure hooks see final values."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from plasmid import hookimpl
from plasmid.config import OptionParser
from plasmid.errors import PluginError, UsageError
from plasmid.kernel_options import RolloutOptions, ScheduleOptions
from plasmid.options import Options, option
from plasmid.startup import start
from plasmid.testing import make_config


class CacheOptions(Options, group="cache", description="a test plugin's options"):
    cache_dir: Path | None = option(None, "where to cache")
    cache_size: int = option(8, "entries kept", min=1)
    cache_ratio: float = option(0.5, "fraction", gt=0, max=1)
    cache_policy: Literal["lru", "fifo"] = option("lru", "eviction")
    cache_warm: bool = option(False, "warm at start")
    cache_verify: bool = option(True, "verify entries")
    cache_tag: tuple[str, ...] = option((), "tags, repeatable")

    def check(self) -> None:
        if self.cache_policy == "fifo" and self.cache_warm:
            raise UsageError("--cache-warm needs --cache-policy lru")


class CachePlugin:
    """A plugin declaring :class:`CacheOptions`; records what configure saw."""

    def __init__(self) -> None:
        self.seen: dict = {}

    @hookimpl
    def plasmid_addoption(self, parser):
        parser.add_options(CacheOptions)

    @hookimpl
    def plasmid_configure(self, config):
        self.seen = {"options": CacheOptions.of(config), "max_new_tokens": RolloutOptions.of(config).max_new_tokens}


class Recipe:
    """A recipe: sets the response length unless the user gave one."""

    @hookimpl
    def plasmid_defaults(self, config):
        config.set_default("max_new_tokens", 3)


def parser_with(cls: type[Options]) -> OptionParser:
    parser = OptionParser()
    parser.add_options(cls)
    return parser


def test_declared_fields_become_typed_flags():
    parser = parser_with(CacheOptions)
    namespace = parser.parse(["--cache-dir", "/tmp/c", "--cache-size", "3", "--cache-policy", "fifo",
                              "--no-cache-verify", "--cache-tag", "a", "--cache-tag", "b"])
    typed = CacheOptions.from_values(vars(namespace))
    assert typed == CacheOptions(cache_dir=Path("/tmp/c"), cache_size=3, cache_ratio=0.5, cache_policy="fifo",
                                 cache_warm=False, cache_verify=False, cache_tag=("a", "b"))


def test_defaults_apply_when_nothing_is_given():
    typed = CacheOptions.from_values(vars(parser_with(CacheOptions).parse([])))
    assert typed == CacheOptions.defaults()
    assert typed.cache_tag == () and typed.cache_verify is True


def test_help_shows_the_real_default_of_each_option():
    text = parser_with(CacheOptions).format_help()
    assert "entries kept (default: 8)" in text
    assert "eviction (default: lru)" in text
    assert "--no-cache-verify" in text


@pytest.mark.parametrize(("values", "message"), [
    ({"cache_size": 0}, "--cache-size 0: must be >= 1"),
    ({"cache_ratio": 0.0}, "--cache-ratio 0.0: must be > 0"),
    ({"cache_ratio": 1.5}, "--cache-ratio 1.5: must be <= 1"),
    ({"cache_policy": "random"}, "--cache-policy 'random': choose one of lru, fifo"),
    ({"cache_size": "many"}, "--cache-size: expected int, got 'many'"),
    ({"cache_size": 2.5}, "--cache-size: expected int"),
    ({"cache_ratio": float("nan")}, "--cache-ratio: expected float, got nan"),
    ({"cache_ratio": "nan"}, "--cache-ratio: expected float, got 'nan'"),
    ({"cache_policy": "fifo", "cache_warm": True}, "--cache-warm needs --cache-policy lru"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_the_flag(values, message):
    with pytest.raises(UsageError) as caught:
        CacheOptions.from_values(values)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_typed_values_are_frozen():
    typed = CacheOptions.defaults()
    with pytest.raises(AttributeError):
        typed.cache_size = 3  # type: ignore[misc]


def test_the_same_class_declared_by_two_plugins_is_one_set_of_flags():
    parser = parser_with(CacheOptions)
    parser.add_options(CacheOptions)
    assert parser.option_classes == [CacheOptions]


def test_another_class_with_the_same_flag_is_an_error_naming_the_flag():
    class Clash(Options, group="clash"):
        cache_size: int = option(1, "the same flag again")

    parser = parser_with(CacheOptions)
    with pytest.raises(PluginError, match="--cache-size is declared twice"):
        parser.add_options(Clash)


def test_a_field_without_option_or_with_an_unknown_type_is_refused_when_declared():
    class Untyped(Options, group="x"):
        items: frozenset[str] = option(frozenset(), "no flag type for a set")

    with pytest.raises(TypeError, match="no option type"):
        parser_with(Untyped)


def test_given_tracks_what_the_command_line_set():
    parser = parser_with(CacheOptions)
    assert parser.given(["--cache-size", "8", "--cache-warm"]) == {"cache_size", "cache_warm"}
    assert parser.given([]) == frozenset()
    assert parser.parse([]).cache_size == 8        # the defaults are back after the second parse


def test_a_recipe_sets_what_the_user_left_unset_and_configure_sees_the_final_value():
    plugin = CachePlugin()
    make_config(plugin, Recipe())
    assert plugin.seen["max_new_tokens"] == 3
    make_config(plugin, Recipe(), max_new_tokens=7)
    assert plugin.seen["max_new_tokens"] == 7       # given by the user: the recipe leaves it


def test_options_are_checked_before_configure_hooks_run():
    plugin = CachePlugin()
    with pytest.raises(UsageError, match="--cache-size 0"):
        make_config(plugin, cache_size=0)
    assert plugin.seen == {}


def test_kernel_option_checks_name_the_flag():
    with pytest.raises(UsageError, match="--prompts-per-step 0: must be >= 1"):
        make_config(prompts_per_step=0)
    with pytest.raises(UsageError, match="--schedule async .* --placement disaggregate"):
        make_config(schedule="async", placement="colocate")
    assert ScheduleOptions.of(make_config(schedule="async", placement="disaggregate")).schedule == "async"


def test_the_command_line_path_checks_and_tracks_given_options(monkeypatch):
    monkeypatch.setenv("PLASMID_PLUGINS", "")
    monkeypatch.setattr("plasmid.startup.resolve_choices", lambda config, registry: None)  # no providers here
    startup = start(["--temperature", "0.5"])
    assert startup.config.is_given("temperature") and not startup.config.is_given("top_p")
    assert RolloutOptions.of(startup.config).temperature == 0.5
    with pytest.raises(UsageError, match="--top-p 0.0: must be > 0"):
        start(["--top-p", "0"])


def test_reading_options_of_an_undeclared_class_gives_its_defaults():
    assert CacheOptions.of(make_config()) == CacheOptions.defaults()


def test_a_misspelled_flag_is_one_line_with_did_you_mean():
    parser = parser_with(CacheOptions)
    with pytest.raises(UsageError) as caught:
        parser.parse(["--cache-sise", "3"])
    message = str(caught.value)
    assert "unknown option --cache-sise" in message and "did you mean '--cache-size'" in message
    assert "\n" not in message


def test_an_invalid_choice_on_the_command_line_is_one_line():
    with pytest.raises(UsageError, match="--cache-policy: invalid choice: 'random'") as caught:
        parser_with(CacheOptions).parse(["--cache-policy", "random"])
    assert "\n" not in str(caught.value)


def test_a_flag_with_a_const_takes_its_value_optionally():
    class Tagged(Options, group="tagged"):
        think_tag: str | None = option(None, "grade after the last TAG", const="</think>", metavar="TAG")

    parser = parser_with(Tagged)
    assert Tagged.from_values(vars(parser.parse([]))).think_tag is None
    assert Tagged.from_values(vars(parser.parse(["--think-tag"]))).think_tag == "</think>"
    assert Tagged.from_values(vars(parser.parse(["--think-tag", "</reason>"]))).think_tag == "</reason>"


class PercentOptions(Options, group="percent"):
    percent_share: float = option(0.5, "share of the batch (50% by default; ~20% slower when lower)")


@pytest.mark.parametrize("flag", ["--help", "--help-all"])
def test_a_percent_sign_in_an_options_help_is_printed_as_text(flag, capsys):
    from plasmid.app.helptext import short_help

    parser = OptionParser("prog", help_text=short_help)
    parser.add_options(PercentOptions)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse([flag])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "~20% slower" in out or "--percent-share" in out
    if flag == "--help-all":
        assert "(50% by default; ~20% slower" in " ".join(out.split())
