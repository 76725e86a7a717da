"""The math options are declared once: a bad value is a one-line error naming its flag, and the
typed read gives the declared defaults."""

from __future__ import annotations

import plasmid_math.plugin
import pytest
from plasmid_math.options import MathOptions
from plasmid_math.rewards import MathFormatReward, MathReward

from plasmid.config import OptionParser
from plasmid.errors import UsageError
from plasmid.testing import make_config, make_manager


def test_the_typed_read_gives_the_declared_defaults():
    config = make_config(plasmid_math.plugin)
    options = MathOptions.of(config)
    assert options == MathOptions.defaults()
    assert (options.math_format_penalty, options.math_tolerance, options.math_symbolic_timeout,
            options.math_symbolic_workers) == (1.0, 1e-6, 5.0, 1)
    assert MathOptions.of(config).math_think_tag is None


@pytest.mark.parametrize(("bad", "message"), [
    ({"math_symbolic_timeout": 0.0}, "--math-symbolic-timeout 0.0: must be > 0"),
    ({"math_symbolic_workers": 0}, "--math-symbolic-workers 0: must be >= 1"),
    ({"math_tolerance": -1e-3}, "--math-tolerance -0.001: must be >= 0"),
    ({"math_format_penalty": "high"}, "--math-format-penalty: expected float, got 'high'"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_its_flag(bad, message):
    with pytest.raises(UsageError) as raised:
        make_config(plasmid_math.plugin, **bad)
    assert str(raised.value) == message


def think_tag_given(*argv):
    parser = OptionParser()
    make_manager(plasmid_math.plugin).addoption(parser)
    return parser.parse(list(argv)).math_think_tag


def test_the_think_tag_flag_alone_means_close_think_and_a_value_names_another_tag():
    assert think_tag_given() is None
    assert think_tag_given("--math-think-tag") == "</think>"
    assert think_tag_given("--math-think-tag", "</reasoning>") == "</reasoning>"


def test_both_rewards_list_the_options_they_read():
    assert MathReward.option_classes == MathFormatReward.option_classes == (MathOptions,)
