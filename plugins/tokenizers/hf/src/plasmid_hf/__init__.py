"""plasmid-hf: the Hugging Face tokenizer of ``--model`` as the run's tokenizer."""
