"""``--megatron-<field>`` options: generated from the installed megatron-core's config dataclasses,
without importing megatron or torch, and routed to the classes that have each field."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
import typing

import plasmid_megatron.plugin
import pytest
from plasmid_megatron import native_options

from plasmid import testing
from plasmid.errors import UsageError

SCALARS = (bool, int, float, str)


def scalar_fields(cls):
    """What the dataclass itself says are its plain scalar fields with a default."""
    import torch

    hints = typing.get_type_hints(cls)
    names = set()
    for field in dataclasses.fields(cls):
        if field.default is dataclasses.MISSING:
            continue
        kind = hints[field.name]
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if typing.get_origin(kind) is typing.Union and len(args) == 1:
            kind = args[0]
        elif typing.get_origin(kind) is typing.Union and len(args) == 2 and typing.get_origin(args[1]) is list \
                and typing.get_args(args[1]) == (args[0],):
            kind = args[0]          # one value or a list of them: the option gives one
        literal = typing.get_origin(kind) is typing.Literal and all(isinstance(a, str) for a in typing.get_args(kind))
        if kind in SCALARS or kind is torch.dtype or literal:
            names.add(field.name)
    return names


def test_generated_fields_are_exactly_the_scalar_fields_of_the_imported_dataclasses():
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    generated = {field.name: set(field.owners) for field in native_options.native_fields()}
    for cls in (TransformerConfig, OptimizerConfig, DistributedDataParallelConfig):
        expected = scalar_fields(cls) - set(native_options.NOT_NATIVE)
        have = {name for name, owners in generated.items() if cls.__name__ in owners}
        assert have == expected, (cls.__name__, sorted(have ^ expected))
    assert len(generated) > 200


def heavy_modules_after(command: list[str]) -> tuple[str, list[str]]:
    probe = ("import contextlib, io, sys\nfrom plasmid.app.cli import main\n"
             f"with contextlib.redirect_stdout(io.StringIO()) as out: main({command!r})\n"
             "sys.stderr.write(out.getvalue())\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'megatron', 'transformers'}))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return result.stderr, ast.literal_eval(result.stdout.strip().splitlines()[-1])


def test_listing_plugins_imports_neither_torch_nor_megatron():
    output, heavy = heavy_modules_after(["plugins"])
    assert "megatron" in output and heavy == []


def test_showing_the_plugin_lists_native_options_without_importing_megatron():
    """``plugins show`` imports the provider module (torch), never megatron-core itself."""
    output, heavy = heavy_modules_after(["plugins", "show", "megatron"])
    assert "--megatron-sequence-parallel" in output and "--tensor-model-parallel-size" in output
    assert "megatron" not in heavy


def test_options_parse_to_typed_values_and_reach_every_class_that_has_the_field():
    config = testing.make_config(plasmid_megatron.plugin, configure=False, megatron_use_distributed_optimizer=True,
                                 megatron_sequence_parallel=False, megatron_bucket_size=1000,
                                 megatron_adam_eps=1e-6)
    given = native_options.native_values(config.option)
    assert given["OptimizerConfig"]["use_distributed_optimizer"] is True
    assert given["DistributedDataParallelConfig"]["use_distributed_optimizer"] is True
    assert given["TransformerConfig"] == {"sequence_parallel": False}
    assert given["DistributedDataParallelConfig"]["bucket_size"] == 1000
    assert given["OptimizerConfig"]["adam_eps"] == 1e-6


def test_command_line_forms_of_booleans_choices_and_numbers():
    from plasmid.config import OptionParser

    parser = OptionParser()
    plasmid_megatron.plugin.plasmid_addoption(parser)
    option = parser.parse(["--megatron-sequence-parallel", "--megatron-masked-softmax-fusion", "false",
                           "--megatron-recompute-granularity", "selective", "--megatron-adam-eps", "1e-5"])
    assert option.megatron_sequence_parallel is True and option.megatron_masked_softmax_fusion is False
    assert option.megatron_recompute_granularity == "selective" and option.megatron_adam_eps == 1e-5
    assert option.megatron_bf16 is None                       # not given: megatron's default
    with pytest.raises(UsageError, match="--megatron-recompute-granularity: invalid choice: 'most'"):
        parser.parse(["--megatron-recompute-granularity", "most"])


def test_fields_that_come_from_elsewhere_are_not_options():
    flags = {field.flag for field in native_options.native_fields()}
    for taken in ("--megatron-lr", "--megatron-num-layers", "--megatron-tensor-model-parallel-size",
                  "--megatron-calculate-per-token-loss"):
        assert taken not in flags


def test_a_value_the_imported_dataclass_does_not_know_is_refused_with_the_flag():
    from megatron.core.optimizer import OptimizerConfig

    with pytest.raises(ValueError, match="--megatron-no-such-field"):
        native_options.check_against(OptimizerConfig, {"no_such_field": 1})


def test_fields_are_read_from_a_given_source_tree(tmp_path):
    (tmp_path / "core" / "transformer").mkdir(parents=True)
    (tmp_path / "core" / "base_config.py").write_text(
        "from dataclasses import dataclass\n@dataclass\nclass Base:\n    shared_knob: int = 3\n"
        "    \"\"\"A knob. More text.\"\"\"\n")
    (tmp_path / "core" / "transformer" / "transformer_config.py").write_text(
        "from dataclasses import dataclass, field\nfrom typing import Callable, Literal, Optional\n"
        "import torch\nfrom ..base_config import Base\n"
        "@dataclass\nclass TransformerConfig(Base):\n"
        "    mode: Optional[Literal['a', 'b']] = None\n    ratio: float | None = 0.5\n"
        "    fn: Callable = None\n    dtype_knob: torch.dtype = torch.float32\n"
        "    listed: list = field(default_factory=list)\n    lr: float = 1.0\n")
    fields = {f.name: f for f in native_options.native_fields(tmp_path)}
    assert set(fields) == {"shared_knob", "mode", "ratio", "dtype_knob"}
    assert fields["shared_knob"].doc == "A knob." and fields["shared_knob"].owners == ("TransformerConfig",)
    assert fields["mode"].choices == ("a", "b") and fields["ratio"].kind == "float"
    assert fields["dtype_knob"].choices == native_options.DTYPE_CHOICES
