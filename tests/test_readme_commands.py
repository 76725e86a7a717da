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


# ---------------------------------------------------------------------------------------------------------------
# Every shell command the pages show: executed (CPU, made small) or parse-checked; nothing unclassified.

SHELL_FENCES = ("bash", "sh", "shell", "console")
#: A bare fence (no language) holds commands when its first line starts like one.
COMMAND_START = re.compile(r"^(\$ )?(\.venv/bin/)?(plasmid|python|pip|cd|hf|tox)\b")
#: Extra flags that make an executed command small (they override the page's own values).
SMALL = ["--num-rollouts", "2", "--prompts-per-step", "2", "--n-samples-per-prompt", "2", "--eval-interval", "0",
         "--save-interval", "0"]
#: The commands the test runs, as the pages write them (after ``.venv/bin/`` and comments are dropped), with
#: the flags appended to keep them short on a CPU; every other ``plasmid`` line is parse-checked.
EXECUTED = {
    "plasmid train --stop-at-eval-acc 0.9": SMALL,
    "plasmid rollout --num-rollouts 4 --save-rollouts rollouts/": SMALL,
    "plasmid config show --config examples/quickstart-grpo.yaml": [],
    "plasmid train --help": [],
    "plasmid plugins": [],
}
#: Commands of other tools the pages show, by their first word(s): not run here (network, servers, other
#: packages), and why that is fine.
OTHER_TOOLS = {
    "python -m venv": "the standard library's venv",
    "python -m pip": "pip itself",
    "python -m tox": "the test runner (tox.ini is tested by running it)",
    "python -m pytest": "the test runner",
    "cd": "a directory change",
    "hf": "huggingface_hub's CLI (network)",
    "wandb": "wandb's CLI (network)",
    "mlflow": "mlflow's UI server",
    "tensorboard": "TensorBoard's server",
}


def _commands_of(text: str) -> list[str]:
    """Command lines of a shell block: continuations joined, comments and a ``$ `` prompt dropped,
    ``a && b`` split."""
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            words = line.split("#", 1)[0].split()
        if words and words[0] == "$":
            words = words[1:]
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            if words[:cut]:
                commands.append(shlex.join(words[:cut]))
            words = words[cut + 1:]
    return commands


def shell_commands() -> list[tuple[str, str]]:
    """``(where, command)`` for every command in README.md's, docs/*.md's and examples/**/*.md's shell blocks
    (fenced ``bash``/``sh``/``shell``/``console``, or bare fences that start with a command) and in the
    header comments of examples/**/*.yaml and the docstrings of examples/**/*.py (indented lines that start
    with a command)."""
    found = []
    pages = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]
    for page in pages:
        lines, fence, start, block = page.read_text().splitlines(), None, 0, []
        for number, line in enumerate(lines, 1):
            if line.startswith("```"):
                if fence is None:
                    fence, start, block = line[3:].strip(), number, []
                    continue
                body = "\n".join(block)
                if fence in SHELL_FENCES or (fence == "" and COMMAND_START.match(body.lstrip())):
                    found += [(f"{page.relative_to(ROOT)}:{start}", cmd) for cmd in _commands_of(body)]
                fence = None
            elif fence is not None:
                block.append(line)
    headers = [*sorted((ROOT / "examples").rglob("*.yaml")), *sorted((ROOT / "examples").rglob("*.py"))]
    for path in headers:
        text = path.read_text()
        if path.suffix == ".py":
            head = re.match(r'\s*(?:"""|\'\'\')(.*?)(?:"""|\'\'\')', text, re.DOTALL)
            lines = head.group(1).replace("\\\\\n", "\\\n").splitlines() if head else []
        else:
            lines = [line[1:] for line in text.splitlines() if line.startswith("#")]
        body = "\n".join(line.strip() for line in lines if line.startswith(("  ", "\t")))
        for cmd in _commands_of(body.replace("\\\n", " ")):
            if COMMAND_START.match(cmd):
                found.append((f"{path.relative_to(ROOT)}", cmd))
    return found


def _strip(command: str) -> list[str]:
    """The command's words with leading ``VAR=value`` assignments and a ``.venv/bin/`` prefix dropped."""
    words = shlex.split(command)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words = words[1:]
    if words:
        words[0] = words[0].removeprefix(".venv/bin/")
    return words


_HELP: dict[tuple[str, ...], set[str]] = {}


def known_flags(command: tuple[str, ...]) -> set[str]:
    """The flags ``plasmid COMMAND --help`` shows with every installed plugin, plus the flags that repository
    plugins not installed here declare (their ``options.py``: the trackers, SGLang, Megatron)."""
    if command not in _HELP:
        import contextlib
        import io

        from plasmid.app import cli
        from plasmid.plugins import installed_entry_points

        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            cli.main([*command, "--help"])
        flags = set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*|-[a-zA-Z])\b", out.getvalue()))
        installed = set(installed_entry_points())
        for pyproject in sorted(ROOT.glob("plugins/*/*/pyproject.toml")):
            names = tomllib.loads(pyproject.read_text())["project"].get("entry-points", {}).get("plasmid", {})
            if command[0] in ("train", "rollout", "replay", "eval", "score") and not set(names) & installed:
                for options in pyproject.parent.glob("src/*/options.py"):
                    for name in re.findall(r"^\s+(\w+):[^=\n]*=\s*option\(", options.read_text(), re.MULTILINE):
                        flags |= {"--" + name.replace("_", "-"), "--no-" + name.replace("_", "-")}
        _HELP[command] = flags
    return _HELP[command]


#: Native pass-through flags (``--sglang-tp-size``: a field of SGLang's ServerArgs) exist only where their
#: package is installed; where it is not (this env), a flag with its prefix cannot be checked here.
NATIVE_PREFIXES = {"sglang": "--sglang-", "vllm": "--vllm-", "megatron": "--megatron-"}


def unverifiable(flag: str) -> bool:
    import importlib.util

    return any(flag.startswith(prefix) and importlib.util.find_spec(package) is None
               for package, prefix in NATIVE_PREFIXES.items())


def check_command(words: list[str]) -> str | None:
    """Why ``words`` (a command of the pages, not executed) would fail as written, or ``None``."""
    program = words[0]
    if program == "plasmid":
        command = tuple(words[1:3]) if words[1:2] in (["config"], ["plugins"]) and len(words) > 2 \
            and not words[2].startswith("-") else tuple(words[1:2])
        unknown = [w.split("=")[0] for w in words if w.startswith("-") and w != "-"
                   and w.split("=")[0].strip("[]") not in known_flags(command) and not unverifiable(w)]
        return f"unknown options {unknown} of plasmid {' '.join(command)}" if unknown else None
    if program in ("pip", "python") and "install" in words:
        paths = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-r", "-e")]
        paths += [w for w in words if w.startswith(("./", "plugins/", "requirements/"))]
        missing = [p for p in paths if not (ROOT / re.sub(r"\[.*\]$", "", p).strip("'")).exists()]
        return f"no such path {missing}" if missing else None
    if program == "python" and words[1:2] == ["-c"]:
        import ast

        try:
            ast.parse(words[2])
        except SyntaxError as exc:
            return f"python -c: {exc}"
        return None
    if program == "python" and words[1:2] != ["-m"]:
        return None if (ROOT / words[1]).is_file() else f"no such file {words[1]}"
    return "neither executed (EXECUTED), parse-checked, nor another tool's (OTHER_TOOLS)"


def classify(command: str) -> str:
    words = _strip(command)
    normal = shlex.join(words)
    if normal in EXECUTED:
        return "executed"
    if any(normal == tool or normal.startswith(tool + " ") for tool in OTHER_TOOLS):
        return "other"
    return "checked"


def test_the_pages_show_commands_of_every_kind():
    kinds = {classify(cmd) for _, cmd in shell_commands()}
    assert kinds == {"executed", "other", "checked"}
    shown = {shlex.join(_strip(cmd)) for _, cmd in shell_commands()}
    assert set(EXECUTED) <= shown, f"EXECUTED names commands no page shows: {sorted(set(EXECUTED) - shown)}"


@pytest.mark.timeout(120)
def test_every_command_not_executed_parses_against_what_is_installed():
    wrong = []
    for where, command in shell_commands():
        if classify(command) == "checked":
            problem = check_command(_strip(command))
            if problem:
                wrong.append(f"{where}: {command}: {problem}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", sorted(EXECUTED))
def test_an_executed_command_works_as_written(command, tmp_path):
    from plasmid_e2e import run_plasmid

    (tmp_path / "examples").symlink_to(ROOT / "examples")
    words = _strip(command)
    proc = run_plasmid(*words[1:], *EXECUTED[command], cwd=tmp_path, timeout=110)
    assert proc.returncode == 0, f"{command}: {proc.stderr[-2000:]}"
