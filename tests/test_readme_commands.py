"""What README.md and docs/ tell a user to type works with what they tell the user to install: the
README's YAML config example loads through the config-file reader and selects only plugins the
README's install provides; every checkpoint directory the pages name is one a run with the options
shown (or the defaults) keeps; install lines pin what the tox envs test. In process, no training."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

from plasmid.app import configfile
from plasmid.app.show_config import train_options
from plasmid.app.start import start
from plasmid.kernel_options import CheckpointOptions, RolloutOptions
from plasmid.loop import every

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCED_YAML = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: A checkpoint directory named in prose or a command: ``RUN/checkpoints/step_NNNNNN`` or a bare
#: ``step_NNNNNN`` (saved rollouts, ``step_NNNNNN.jsonl``, are files of another kind).
CHECKPOINT = re.compile(r"(?:([\w./<>-]+)/checkpoints/)?step_(\d{6})(?![\d.]|\.jsonl)")


def readme_install_plugins() -> set[str]:
    """Entry-point names of the plugins that the README's install (requirements/embedded.txt) installs."""
    names: set[str] = set()
    for line in (ROOT / "requirements" / "embedded.txt").read_text().splitlines():
        match = re.match(r"-e\s+(\./\S+)", line)
        if match:
            project = tomllib.loads((ROOT / match.group(1) / "pyproject.toml").read_text())["project"]
            names |= set(project.get("entry-points", {}).get("plasmid", {}))
    return names


def yaml_examples() -> list[str]:
    return FENCED_YAML.findall(README.read_text())


def test_the_readme_has_a_yaml_example():
    assert yaml_examples()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("index", range(len(yaml_examples())))
def test_a_readme_yaml_example_loads_with_the_readmes_install(index, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml_examples()[index])
    data = configfile.read_file(path)
    selection = configfile.plugins_in([str(path)])
    named = {item.strip().removeprefix("no:") for item in (selection or "").split(",") if item.strip()}
    missing = named - readme_install_plugins()
    assert not missing, f"plugins: names {sorted(missing)}, which requirements/embedded.txt does not install"
    started = start(["--config", str(path), "--run-dir", str(tmp_path / "run")], add_options=train_options())
    option = started.config.option
    flat = {}
    for key, value in data.items():
        flat.update(value if isinstance(value, dict) else {key: value})
    flat.pop("plugins", None)
    for key, value in flat.items():
        got = getattr(option, key)
        assert got == (float(value) if isinstance(got, float) else value), key


def producing_command(text: str, run_dir: str) -> list[str]:
    """The arguments of the ``plasmid train`` command in ``text`` that writes ``run_dir`` (none: a
    run with the defaults), continuation lines joined and comments dropped."""
    joined = text.replace("\\\n", " ")
    for line in joined.splitlines():
        if "plasmid train" not in line or "--run-dir" not in line:
            continue
        try:
            argv = shlex.split(line[line.index("plasmid train") + len("plasmid train"):], comments=True)
        except ValueError:   # prose quoting a command, not a command line
            continue
        if "--run-dir" in argv and argv[argv.index("--run-dir") + 1] == run_dir:
            return argv
    return []


def kept_checkpoints(argv: list[str], where: Path) -> list[int]:
    """The steps whose checkpoints a finished run of ``plasmid train ARGV`` keeps, from its resolved
    options (defaults and recipes included; nothing runs): every ``--save-interval``-th step and
    the last, the newest ``--keep-checkpoints`` of them."""
    if "--run-dir" in argv:
        argv = argv[:argv.index("--run-dir")] + argv[argv.index("--run-dir") + 2:]
    config = start([*argv, "--run-dir", str(where)], add_options=train_options()).config
    checkpoints, steps = CheckpointOptions.of(config), RolloutOptions.of(config).num_rollouts
    saved = [step for step in range(steps) if every(checkpoints.save_interval, step, step == steps - 1)]
    return saved[-checkpoints.keep_checkpoints:]


def named_checkpoints() -> list[tuple[Path, str, int]]:
    return [(page, match.group(1) or "", int(match.group(2)))
            for page in PAGES for match in CHECKPOINT.finditer(page.read_text())]


def test_the_pages_name_checkpoints():
    assert {run for page, run, _ in named_checkpoints() if page == README} >= {"runs/my-run", "runs/sft"}


@pytest.mark.timeout(60)
def test_every_checkpoint_the_pages_name_is_one_a_run_keeps(tmp_path):
    wrong = []
    for page, run_dir, step in named_checkpoints():
        argv = producing_command(page.read_text(), run_dir) if run_dir else []
        kept = kept_checkpoints(argv, tmp_path / "run")
        if step not in kept:
            wrong.append(f"{page.name}: {run_dir or '(a default run)'}/checkpoints/step_{step:06d}: "
                         f"plasmid train {shlex.join(argv)} keeps {[f'step_{s:06d}' for s in kept]}")
    assert not wrong, "\n".join(wrong)


def test_install_lines_pin_what_the_tox_envs_test():
    pinned = dict(re.findall(r"^([\w-]+)==(\S+)", (ROOT / "requirements" / "sglang.txt").read_text(), re.MULTILINE))
    gpu = (ROOT / "docs" / "gpu.md").read_text()
    pages = [("docs/gpu.md", gpu), *((p.name, p.read_text()) for p in sorted((ROOT / "examples" / "gpu").glob("*")))]
    for page, text in pages:
        for line in text.splitlines():
            if "pip install" not in line:
                continue
            for token in line.split("pip install", 1)[1].replace("`", " ").split():
                name = re.split(r"[=<>!~\[]", token, maxsplit=1)[0]
                if name in ("sglang", "sglang-router"):
                    want = f"{name}=={pinned[name]}"
                    assert token == want, f"{page}: {token} (requirements/sglang.txt: {want})"
    assert "being written" not in gpu


def test_the_agent_example_says_how_to_install_its_client():
    readme = README.read_text()
    example = readme[readme.index("# my_agent.py"):]
    example = example[:example.index("```")]
    assert "from openai import" in example
    extra = re.search(r"pip install -e '\./plugins/generators/agent\[(\w+)\]'", example)
    assert extra, "the agent example does not say how to install openai"
    extras = tomllib.loads((ROOT / "plugins/generators/agent/pyproject.toml").read_text())["project"]
    assert any(dep.startswith("openai") for dep in extras["optional-dependencies"][extra.group(1)])


def test_the_hub_download_command_is_the_one_huggingface_hub_installs():
    readme = README.read_text()
    assert "huggingface-cli download" not in readme and "hf download" in readme
