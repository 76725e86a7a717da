"""``--reward NAME:WEIGHT``: a weight that is not a finite number is refused when the command
line is parsed, in one line (it used to crash the first training step with a traceback)."""

import pytest

from plasmid.errors import UsageError
from plasmid.kernel_options import reward_spec


@pytest.mark.parametrize("weight", ["nan", "NaN", "inf", "-inf", "1e400"])
def test_a_non_finite_reward_weight_is_refused_at_parse(weight):
    with pytest.raises(UsageError, match=f"--reward 'exact:{weight}': the weight after ':' must be a finite number"):
        reward_spec(f"exact:{weight}")


def test_finite_reward_weights_parse():
    assert reward_spec("exact") == ("exact", 1.0)
    assert reward_spec("format:-0.5") == ("format", -0.5)
    assert reward_spec("format:-0") == ("format", 0.0)
