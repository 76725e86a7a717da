"""plasmid-gguf: the ``plasmid model-from-gguf SOURCE OUT_DIR`` command (entry-point group
``plasmid.commands``): a GGUF model file, or an installed Python package that ships one, written as
an ordinary Hugging Face model directory that ``plasmid train --model OUT_DIR`` takes.

- :mod:`plasmid_gguf.source`: which file SOURCE names, and its identity (sha256, size);
- :mod:`plasmid_gguf.convert`: GGUF -> Hugging Face model and tokenizer, written into a directory;
- :mod:`plasmid_gguf.record`: ``plasmid_gguf_source.json``, what a directory was converted from;
- :mod:`plasmid_gguf.command`: the command: validate everything, convert into a staging directory,
  rename it into place.
"""
