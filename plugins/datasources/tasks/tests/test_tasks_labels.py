"""Every task's prompts and exact-match labels, on hand-written examples."""

import pytest
from plasmid_tasks.tasks import make_task

from plasmid.errors import UsageError


def examples_of(task):
    """prompt -> label over the task's whole (small) domain."""
    return dict(task.example(item) for item in range(task.domain_size))


def test_mod10_labels_are_the_last_digit_of_the_sum():
    examples = examples_of(make_task("mod10"))
    assert len(examples) == 100
    assert examples["3+9="] == "2"
    assert examples["0+0="] == "0"
    assert examples["5+5="] == "0"
    assert examples["9+9="] == "8"
    assert examples["4+1="] == "5"


def test_reverse_labels_are_the_digits_backwards_and_keep_leading_zeros():
    examples = examples_of(make_task("reverse", length=3))
    assert len(examples) == 1000
    assert examples["123>"] == "321"
    assert examples["007>"] == "700"
    assert examples["450>"] == "054"
    assert examples["999>"] == "999"
    assert examples_of(make_task("reverse", length=1))["5>"] == "5"


def test_digitsum_labels_are_the_digit_sum_modulo_10():
    examples = examples_of(make_task("digitsum", length=3))
    assert examples["123="] == "6"
    assert examples["999="] == "7"
    assert examples["000="] == "0"
    assert examples["055="] == "0"
    assert examples_of(make_task("digitsum", length=4))["9181="] == "9"


def test_addition_labels_are_the_sum_zero_padded_to_one_more_digit():
    examples = examples_of(make_task("addition", digits=2))
    assert len(examples) == 10_000
    assert examples["07+95="] == "102"
    assert examples["01+02="] == "003"
    assert examples["99+99="] == "198"
    assert examples["50+50="] == "100"
    assert examples_of(make_task("addition", digits=1))["9+8="] == "17"


@pytest.mark.parametrize(("name", "length", "digits", "answer_length"), [
    ("mod10", 3, 2, 1), ("reverse", 5, 2, 5), ("digitsum", 5, 2, 1), ("addition", 3, 4, 5)])
def test_every_label_is_a_string_of_the_answer_length(name, length, digits, answer_length):
    task = make_task(name, length=length, digits=digits)
    assert task.answer_length == answer_length
    for item in (0, 1, task.domain_size // 3, task.domain_size - 1):
        prompt, label = task.example(item)
        assert isinstance(label, str) and len(label) == answer_length, (prompt, label)


def test_an_unknown_task_is_a_usage_error_naming_the_choices():
    with pytest.raises(UsageError, match="unknown --task 'mul'.*mod10, reverse, digitsum, addition"):
        make_task("mul")
