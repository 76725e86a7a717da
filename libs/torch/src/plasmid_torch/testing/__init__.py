"""Test kit of plasmid-torch: the contract suites of the families that need torch
(:mod:`plasmid_torch.testing.contracts`). :mod:`plasmid.testing` re-exports them
(``from plasmid.testing import TrainerContract``)."""
