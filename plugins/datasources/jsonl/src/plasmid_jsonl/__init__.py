"""plasmid-jsonl: prompts from ``.jsonl`` and ``.parquet`` files (``--datasource jsonl``).

The rows and their errors are described in :mod:`plasmid_jsonl.reader`, prompt encoding in
:mod:`plasmid_jsonl.prompts`, the order of training prompts in :mod:`plasmid_jsonl.source`.
"""

from plasmid.errors import DataExhausted

__all__ = ["DataExhausted"]
