"""plasmid_serving.journal: what a restarted server replays (no server needed)."""

from __future__ import annotations

from plasmid_serving.journal import WeightJournal

ALL = frozenset({"embed", "head", "norm"})


def test_payloads_replay_in_order_and_a_newer_one_with_the_same_names_replaces_the_older():
    journal = WeightJournal(all_names=ALL)
    journal.loaded_payload(["embed"], "e1")
    journal.loaded_payload(["head", "norm"], "hn1")
    journal.loaded_payload(["embed"], "e2")
    snapshot = journal.snapshot()
    assert snapshot.payloads == [(("head", "norm"), "hn1"), (("embed",), "e2")]
    assert (snapshot.disk, snapshot.adapter, snapshot.lost) == (None, None, None)


def test_a_directory_replaces_everything_before_it_and_payloads_after_it_stack_on_it():
    journal = WeightJournal(all_names=ALL)
    journal.loaded_payload(["embed"], "e1")
    journal.served_adapter(("fake-v1", "/adapters/1"))
    journal.loaded_directory("/ckpt/v2")
    assert (journal.snapshot().disk, journal.snapshot().payloads, journal.snapshot().adapter) == ("/ckpt/v2", [], None)
    journal.loaded_payload(["head"], "h3")
    journal.served_adapter(("fake-v3", "/adapters/3"))
    snapshot = journal.snapshot()
    assert (snapshot.disk, snapshot.payloads, snapshot.adapter) == ("/ckpt/v2", [(("head",), "h3")],
                                                                    ("fake-v3", "/adapters/3"))
    journal.served_adapter(None)
    assert journal.snapshot().adapter is None


def test_lost_weights_are_restorable_again_only_once_payloads_cover_every_tensor():
    journal = WeightJournal(all_names=ALL)
    journal.loaded_directory("/ckpt/v1")
    journal.lost_track("a distributed group")
    snapshot = journal.snapshot()
    assert (snapshot.lost, snapshot.disk, snapshot.payloads) == ("a distributed group", None, [])
    journal.loaded_payload(["embed", "head"], "eh")
    assert journal.snapshot().lost == "a distributed group"
    journal.loaded_payload(["norm"], "n")
    assert journal.snapshot().lost is None
    journal.lost_track("CUDA IPC handles")
    journal.loaded_directory("/ckpt/v4")   # a whole version from disk covers every tensor
    assert (journal.snapshot().lost, journal.snapshot().disk) == (None, "/ckpt/v4")


def test_a_disabled_journal_keeps_no_copy_of_payloads():
    journal = WeightJournal(enabled=False, all_names=ALL)
    journal.loaded_payload(["embed", "head", "norm"], "all")
    assert journal.snapshot().payloads == []


def test_a_snapshot_is_a_copy():
    journal = WeightJournal(all_names=ALL)
    journal.loaded_payload(["embed"], "e1")
    snapshot = journal.snapshot()
    journal.loaded_payload(["head"], "h1")
    assert snapshot.payloads == [(("embed",), "e1")]
