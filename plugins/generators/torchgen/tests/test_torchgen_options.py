"""torchgen's option is declared once, typed: a bad value fails at configuration time in one line
naming the flag, and a configuration that does not set it reads the declared default."""

import plasmid_torchgen.plugin
import pytest
from plasmid_torchgen.options import TorchgenOptions

from plasmid.errors import UsageError
from plasmid.testing import make_config


def test_a_batch_size_below_one_is_a_one_line_usage_error_naming_the_flag():
    with pytest.raises(UsageError) as failure:
        make_config(plasmid_torchgen.plugin, torchgen_max_batch_size=0)
    assert str(failure.value) == "--torchgen-max-batch-size 0: must be >= 1"


def test_a_batch_size_that_is_not_a_number_names_the_flag():
    with pytest.raises(UsageError, match=r"^--torchgen-max-batch-size: expected int, got 'many'$"):
        make_config(plasmid_torchgen.plugin, torchgen_max_batch_size="many")


def test_the_typed_read_gives_the_declared_default_and_a_given_value():
    assert TorchgenOptions.of(make_config(plasmid_torchgen.plugin)).torchgen_max_batch_size == 1024
    given = make_config(plasmid_torchgen.plugin, torchgen_max_batch_size=8)
    assert TorchgenOptions.of(given).torchgen_max_batch_size == 8
