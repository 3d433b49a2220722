"""The corpus-roots registry: what ingest registers, `rag roots list|add|remove`, validation, and
that removing a root stops the watching without deleting documents."""

from __future__ import annotations

import json

import pytest

import rag_lib.api
from rag_lib.config import CorpusRootSettings, Settings
from rag_lib.errors import ConfigError, NotFoundError, ValidationError

LEARNING = "tradegent/knowledge/learnings/biases/loss-aversion-pre-earnings.yaml"
TRADE = "tradegent/fixtures/sample_trade.yaml"


# Not tests of embedding: the shared corpus's vectors come from the cache (no model calls).
pytestmark = pytest.mark.warm_cache


def test_ingest_registers_directories_and_root_only(kb, corpus_copy, tmp_path):
    root = corpus_copy(LEARNING, TRADE)
    kb.ingest([root / TRADE])  # a single file without --root: its folder was not named as a corpus
    assert kb.roots() == []
    kb.ingest([root], "research")  # a directory is its own root
    kb.ingest([root / LEARNING], root=root)  # --root is the root
    assert {(r.path, r.collection, r.name) for r in kb.roots()} == {
        (root.resolve(), "research", "corpus"), (root.resolve(), "default", "corpus-2")}
    kb.ingest([root], "research")  # idempotent
    assert len(kb.roots()) == 2


def test_a_folder_inside_a_root_keeps_the_roots_paths_and_is_no_root_of_its_own(kb, corpus_copy):
    root = corpus_copy(LEARNING, TRADE)
    kb.ingest([root])
    before = sorted(d["path"] for d in kb.list_documents())
    # a subfolder or a file of the corpus, named alone: the corpus's paths, not a second copy
    assert kb.ingest([root / "tradegent" / "fixtures"]).outcomes[0].path == TRADE
    assert kb.ingest([root / LEARNING], force=True).outcomes[0].path == LEARNING
    assert sorted(d["path"] for d in kb.list_documents()) == before
    assert [r.path for r in kb.roots()] == [root.resolve()]
    with pytest.raises(ValidationError, match="is inside .*a corpus root of collection 'default'"):
        kb.add_root(root / "tradegent")  # as `rag materialize SUBFOLDER` registers it
    with pytest.raises(ValidationError, match="holds .*a corpus root of collection 'default'"):
        kb.add_root(root.parent)
    with pytest.raises(ValidationError, match="holds"):
        kb.ingest([root.parent])
    kb.add_root(root / "tradegent", "elsewhere")  # another collection is another corpus
    assert len(kb.list_documents()) == len(before)
    # a nested root in rag.yaml's pipeline.roots is not registered either (a warning, once)
    kb.settings.pipeline.roots = [CorpusRootSettings(path=root / "tradegent", collection="default")]
    assert [r.path for r in kb.roots() if r.collection == "default"] == [root.resolve()]


def test_upload_folder_is_never_a_root(kb, tmp_path):
    uploads = kb.upload_folder() / "default"
    uploads.mkdir(parents=True)
    (uploads / "note.md").write_text("# Note\n\nStops go below the prior swing low.\n")
    kb.ingest([uploads / "note.md"], root=uploads)  # what the HTTP API's upload does
    assert kb.roots() == []
    with pytest.raises(ValidationError, match="upload folder"):
        kb.add_root(uploads)


def test_add_validates_and_remove_keeps_documents(kb, corpus_copy, tmp_path):
    root = corpus_copy(TRADE)
    with pytest.raises(ValidationError, match="not an existing directory"):
        kb.add_root(tmp_path / "missing")
    with pytest.raises(ValidationError, match="not an existing directory"):
        kb.add_root(root / TRADE)
    kb.ingest([root])
    (removed,) = kb.remove_root(root)
    assert removed.path == root.resolve() and kb.roots() == []
    assert kb.show(TRADE)["chunk_count"] > 0  # documents stay
    with pytest.raises(NotFoundError):
        kb.remove_root(root)


def test_configured_roots_are_merged_and_protected(database_url, provider, corpus_copy, tmp_path):
    root = corpus_copy(TRADE)
    settings = Settings(database_url=database_url, home=tmp_path / ".rag")
    settings.pipeline.roots = [CorpusRootSettings(path=root, collection="desk")]
    with rag_lib.api.KnowledgeBase(settings, provider=provider) as kb:
        (configured,) = kb.roots()
        assert (configured.path, configured.collection) == (root.resolve(), "desk")
        with pytest.raises(ConfigError, match="pipeline.roots"):
            kb.remove_root(root)




def test_cli_roots_list_add_remove(rag, corpus_copy, tmp_path):
    root = corpus_copy(TRADE)
    code, out, err = rag("roots", "add", str(root), "-c", "desk")
    assert code == 0, err
    code, out, _ = rag("roots", "list", "--json")
    assert code == 0 and json.loads(out) == [{"name": "corpus", "path": str(root.resolve()), "collection": "desk"}]
    code, _, err = rag("roots", "add", str(tmp_path / "nope"))
    assert code == 1 and "not an existing directory" in err and "Traceback" not in err
    code, out, err = rag("roots", "remove", str(root))
    assert code == 0 and "documents are kept" in out
    code, out, _ = rag("roots", "list", "--json")
    assert json.loads(out) == []
    code, _, err = rag("roots", "remove", str(root))
    assert code == 1 and "not a registered corpus root" in err


def test_a_root_registered_by_another_ingest_after_the_check_refuses_its_subfolder(kb, tmp_path, monkeypatch):
    """Two ingests at once, one of a folder and one of its subfolder: both passed the nested-root
    check before either registered, and the subfolder's files became documents a second time under
    shorter paths. The check is part of the registration now, under the registry's lock."""
    desk = tmp_path / "desk"
    (desk / "sub").mkdir(parents=True)
    (desk / "sub" / "x.md").write_text("# X\n\n## Body\n\nThe desk's note on copper.\n")
    checked = kb._registered_root_of

    def first_commits_meanwhile(paths, collection):  # the other ingest registers desk after this check
        found = checked(paths, collection)
        kb.store.register_root(desk.resolve(), collection)
        return found

    monkeypatch.setattr(kb, "_registered_root_of", first_commits_meanwhile)
    with pytest.raises(ValidationError, match=r"sub is inside .*desk, a corpus root of collection 'default'"):
        kb.ingest([desk / "sub"])
    assert kb.list_documents() == []  # refused before anything was written
    assert [r.path for r in kb.roots()] == [desk.resolve()]
    # the store refuses it however it is asked, and a failed ingest leaves no root it claimed
    with pytest.raises(ValidationError, match="inside"):
        kb.store.register_root((desk / "sub").resolve(), "default")
    monkeypatch.undo()
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.md").write_text("# A\n")
    with pytest.raises(ValidationError, match="not an existing directory"):
        kb.ingest([other], root=tmp_path / "nowhere")
    with pytest.raises(ValidationError, match="no such file"):
        kb.ingest([other, tmp_path / "missing.md"])
    assert [r.path for r in kb.roots()] == [desk.resolve()]
