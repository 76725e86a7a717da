"""The recipe of ``--datasource verifiers``: the environment's rollout through the agent gateway,
its rubric as the reward, and, without ``--model``, a tiny model that covers the dataset's text.

Applied by the plugin's ``plasmid_defaults`` (after the other plugins' defaults) when
``verifiers`` is the chosen data source. It checks the verifiers version, ``--vf-env`` and its
arguments (loading the environment), and fills only what the user left unset:

- ``--generate agent --agent plasmid_verifiers.rollout:run`` and ``--reward verifiers``;
- ``--model``: ``<run dir>/model``, built by :func:`prepare_tiny_model` (the source's ``prepare``)
  unless it exists: a char tokenizer over printable ASCII plus every other character of the
  datasets' prompts and answers, with :data:`TOOL_TEMPLATE` as its chat template (roles as
  ``<user>``-style tags; an assistant's tool calls rendered as ``<tool_call>{json}</tool_call>``,
  the text the gateway parses calls from), and a tiny causal LM with ``--vf-arch``. It runs on a
  CPU and downloads nothing; it is not expected to learn.
- ``--lr`` 5e-4 and ``--max-new-tokens`` 32 for that tiny model.
"""

from __future__ import annotations

from pathlib import Path

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions
from plasmid_verifiers import vf
from plasmid_verifiers.options import VerifiersOptions

AGENT = "plasmid_verifiers.rollout:run"
TINY_LR = 5e-4
TINY_MAX_NEW_TOKENS = 32
TINY_MODEL_SHAPE = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "tie_word_embeddings": True,
                    "max_positions": 1024}
BASE_ALPHABET = "\t\n" + "".join(chr(code) for code in range(32, 127))
#: The tiny model's chat template (see the module docstring).
TOOL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{% if m['tool_calls'] %}{% for c in m['tool_calls'] %}<tool_call>{\"name\": \"{{ c['function']['name'] }}\", "
    "\"arguments\": {% if c['function']['arguments'] is mapping %}{{ c['function']['arguments'] | tojson }}"
    "{% else %}{{ c['function']['arguments'] }}{% endif %}}</tool_call>{% endfor %}{% endif %}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def apply_recipe(config: Config) -> None:
    """Check the verifiers options; fill the rollout, reward and tiny-model options left unset."""
    vf.check_version()
    options = VerifiersOptions.of(config)
    if options.vf_env is None:
        raise UsageError("--datasource verifiers needs --vf-env NAME: an installed verifiers environment")
    vf.load_env(options.vf_env, vf.canonical_args(vf.parse_env_args(options.vf_env_args)))
    config.set_default("generate", "agent")
    config.set_default("agent", AGENT)
    if not config.is_given("reward"):
        config.option.reward = ["verifiers"]
        config.option.reward_weights = [("verifiers", 1.0)]
    if GeneralOptions.of(config).model is None:
        config.set_default("model", str(tiny_model_dir(config)))
        config.set_default("lr", TINY_LR)
        config.set_default("max_new_tokens", TINY_MAX_NEW_TOKENS)


def tiny_model_dir(config: Config) -> Path:
    return Path(config.run_dir) / "model"


def tiny_alphabet(config: Config) -> str:
    options = VerifiersOptions.of(config)
    assert options.vf_env is not None
    env = vf.load_env(options.vf_env, vf.canonical_args(vf.parse_env_args(options.vf_env_args)))
    chars: set[str] = set()
    for split in ("train", "eval"):
        for row in vf.dataset_rows(env, split):
            for message in row.get("prompt") or []:
                chars.update(str(message.get("content") or ""))
            chars.update(str(row.get("answer") or ""))
    return BASE_ALPHABET + "".join(sorted(chars - set(BASE_ALPHABET)))


def prepare_tiny_model(config: Config) -> None:
    """Build the tiny model the recipe named as ``--model`` unless it is there (or ``--model``
    was given). Writes only ``<run dir>/model``."""
    model_dir = tiny_model_dir(config)
    if config.is_given("model") or GeneralOptions.of(config).model != str(model_dir) or model_dir.exists():
        return
    import torch
    import transformers

    from plasmid_torch.tiny import char_tokenizer, save_model_dir, tiny_config

    transformers.logging.set_verbosity_error()
    tokenizer = char_tokenizer(tiny_alphabet(config), max_length=TINY_MODEL_SHAPE["max_positions"])
    tokenizer.chat_template = TOOL_TEMPLATE
    torch.manual_seed(GeneralOptions.of(config).seed)
    model = transformers.AutoModelForCausalLM.from_config(
        tiny_config(len(tokenizer), arch=VerifiersOptions.of(config).vf_arch, **TINY_MODEL_SHAPE))
    save_model_dir(model, tokenizer, model_dir)
