"""The teacher engine of --generate opd: any registered engine (--teacher-engine), serving
--teacher-model, never attached to the student's servers (--<engine>-external-addrs are not passed
on; --teacher-external-addrs are the teacher's own), and the bad combinations refused at start-up."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plasmid_opd.plugin
import pytest
from plasmid_opd.generate import build_teacher, teacher_options

from plasmid import hookimpl, testing
from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.options import Options, option
from plasmid.testing.scripted import ScriptedEngine

TEACHER_DIR = str(Path(__file__).parent)       # an existing directory: the scripted engine never reads it


class ScriptedServerOptions(Options, group="scripted-servers", description="a scripted engine that attaches to "
                                                                         "servers (test)"):
    scripted_external_addrs: str | None = option(None, "servers to attach to")


@dataclass
class ServedEngine(ScriptedEngine):
    """A scripted engine that remembers the model and the servers it was built for."""

    model: str = ""
    servers: str | None = None


def served_engine(config: Config) -> ServedEngine:
    return ServedEngine(script=[], model=config.option.model, servers=config.option.scripted_external_addrs)


class ScriptedEnginePlugin:
    """Registers engine ``scripted`` (a :class:`ServedEngine`) with its ``--scripted-external-addrs``."""

    @hookimpl
    def plasmid_addoption(self, parser: Any) -> None:
        parser.add_options(ScriptedServerOptions)

    @hookimpl
    def plasmid_generators(self, register: Any) -> None:
        register("scripted", served_engine)


def make_config(**options: Any) -> Config:
    torchgen = pytest.importorskip("plasmid_torchgen.plugin")
    return testing.make_config(plasmid_opd.plugin, torchgen, ScriptedEnginePlugin(), teacher_model=TEACHER_DIR,
                               **options)


def test_a_teacher_engine_of_another_kind_than_the_students_serves_the_teacher_model():
    torchgen = pytest.importorskip("plasmid_torchgen.plugin")
    config = make_config(engine="torchgen", model="student", teacher_engine="scripted")
    teacher = build_teacher(config, testing.make_registry(torchgen, ScriptedEnginePlugin()))
    assert isinstance(teacher, ServedEngine) and (teacher.model, teacher.servers) == (TEACHER_DIR, None)
    assert testing.run(teacher.score([1, 2, 3, 4], 2, 1.0)) == [-0.5, -0.5]
    assert config.option.model == "student"                      # the run's own options are left alone


def test_the_teacher_never_attaches_to_the_students_servers():
    config = make_config(engine="scripted", scripted_external_addrs="student:1,student:2")
    assert teacher_options(config).scripted_external_addrs is None     # it starts its own engine
    config = make_config(engine="scripted", scripted_external_addrs="student:1", teacher_external_addrs="teacher:1")
    options = teacher_options(config)
    assert (options.engine, options.model, options.scripted_external_addrs) == ("scripted", TEACHER_DIR, "teacher:1")


def test_teacher_addresses_that_are_the_students_or_that_the_engine_cannot_take_are_refused_at_configure_time():
    with pytest.raises(UsageError, match="--teacher-external-addrs student:2 is also in --scripted-external-addrs") \
            as raised:
        make_config(engine="scripted", scripted_external_addrs="student:1, student:2",
                    teacher_external_addrs="student:2")
    assert "\n" not in str(raised.value)
    with pytest.raises(UsageError, match="the teacher engine 'torchgen' has no --torchgen-external-addrs option"):
        make_config(engine="scripted", teacher_engine="torchgen", teacher_external_addrs="teacher:1")


def test_the_cli_refuses_teacher_addresses_its_engine_cannot_take_with_exit_status_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "plasmid.app.cli", "train", "--loss", "opd",
                           "--teacher-model", TEACHER_DIR, "--engine", "torchgen",
                           "--teacher-external-addrs", "localhost:30000", "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--teacher-external-addrs" in proc.stderr and "--torchgen-external-addrs" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_an_unknown_teacher_engine_is_one_line_at_start_up_and_nothing_is_written(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "plasmid.app.cli", "train", "--loss", "opd",
                           "--teacher-model", TEACHER_DIR, "--teacher-engine", "torchgn", "--num-rollouts", "1",
                           "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("plasmid: error:")]
    assert len(error) == 1 and "unknown engine 'torchgn' (--teacher-engine)" in error[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()
