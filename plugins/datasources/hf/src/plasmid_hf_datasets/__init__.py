"""plasmid-hf-datasets: the ``hf`` data source, prompts from what Hugging Face ``datasets`` opens
locally (json/jsonl/parquet/csv files, or a directory written by ``save_to_disk``)."""
