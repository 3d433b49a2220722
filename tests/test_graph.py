"""Knowledge graph: extraction from known corpus files, storage reconciliation with the document's
chunks (replace/delete leave no orphans or stale edges), graph queries, checks and surfaces."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rag_lib.documents import load_file
from rag_lib.flatten import flatten, load_mapping
from rag_lib.graph.extract import document_graph, extract_graph, scan_corpus

K = "tradegent/knowledge"
TRADE = f"{K}/trades/2025/01/NVDA_20250115T1000.yaml"
EARNINGS = f"{K}/analysis/earnings/NVDA_20250120T0900.yaml"
STRATEGY = f"{K}/strategies/earnings-momentum.yaml"
PROFILE = f"{K}/analysis/ticker-profiles/2025/01/NVDA_20250110T1000.yaml"
LEARNING = f"{K}/learnings/biases/loss-aversion-pre-earnings.yaml"
SCANNER = f"{K}/scanners/daily/premarket-gap.yaml"
MOMENTUM_SCANNER = f"{K}/scanners/daily/earnings-momentum.yaml"


def _doc(root: Path, rel: str):
    (doc,) = load_file(root / rel, root, "default", 10_000_000)
    return doc


def test_trade_journal_graph_has_its_exact_triples_and_links(corpus_copy):
    root = corpus_copy(TRADE, EARNINGS, STRATEGY, PROFILE, LEARNING, f"{K}/analysis/stock/AMD_20250122T0935.yaml")
    doc = _doc(root, TRADE)
    graph = document_graph(doc, flatten(doc, load_mapping(Path("rag_lib/sections.yaml"))))
    me = f"doc:{TRADE}"
    triples = {(e.src, e.predicate, e.dst) for e in graph.edges if e.section == "_graph" and e.predicate != "has_entity"}
    assert triples == {
        ("trd-2025-001", "traded", "ticker:NVDA"),
        ("trd-2025-001", "catalyst_type", "earnings"),
        ("trd-2025-001", "resulted_in", "win"),
        ("trd-2025-001", "exhibited_bias", "loss-aversion"),
        ("trd-2025-001", "based_on", "ea-nvda-q4-2024"),
    }
    links = {(e.role, e.dst) for e in graph.edges if e.predicate == "links_to"}
    assert links == {
        ("analysis", f"doc:{EARNINGS}"), ("strategy", f"doc:{STRATEGY}"),
        ("ticker", f"doc:{PROFILE}"), ("learnings", f"doc:{LEARNING}"),
    }
    assert all(e.src == me and e.section == "_links" for e in graph.edges if e.predicate == "links_to")
    assert graph.dangling == []
    facts = {(e.predicate, e.dst) for e in graph.edges if e.section == "_meta"}
    assert {("about_ticker", "ticker:NVDA"), ("has_type", "doc_type:trade-journal"), ("dated", "date:2025-01-15"),
            ("describes", "trd-2025-001")} <= facts
    kinds = {n.key: n.kind for n in graph.nodes}
    assert kinds["trd-2025-001"] == "trade" and kinds["loss-aversion"] == "bias" and kinds["earnings"] == "catalyst"
    assert kinds["ticker:NVDA"] == "ticker" and kinds[me] == "doc"
    # every edge endpoint is a node of the graph
    assert {k for e in graph.edges for k in (e.src, e.dst)} <= set(kinds)


def test_unresolved_links_are_kept_dangling_and_text_mentions_known_tickers(corpus_copy):
    root = corpus_copy(SCANNER, MOMENTUM_SCANNER)
    doc = _doc(root, SCANNER)
    graph = extract_graph(doc, [], scan_corpus(root).paths, set())
    assert graph.dangling == ["reference/templates/watchlist.yaml"]
    links = {(e.role, e.dst) for e in graph.edges if e.predicate == "links_to"}
    assert links == {("related_scanners", f"doc:{MOMENTUM_SCANNER}"),
                     ("output_template", "doc:reference/templates/watchlist.yaml")}
    assert ("doc:" + SCANNER, "scans_for", "gap-plays") in graph.triples()  # `this` is the document
    from rag_lib.models import Section
    graph = extract_graph(doc, [Section("notes", "Notes", 1, "Watch $AMD and NVDA; not AI or THE.")],
                          set(), {"AMD", "NVDA", "MSFT"})
    mentions = {(e.dst, e.section) for e in graph.edges if e.predicate == "mentions"}
    assert mentions == {("ticker:AMD", "notes"), ("ticker:NVDA", "notes")}


def _edges(kb, path: str) -> set[tuple[str, str, str]]:
    with kb.store.db.connection() as conn:
        rows = conn.execute("SELECT src, predicate, dst FROM rag_graph_edges WHERE collection = 'default' AND path = %s",
                            (path,)).fetchall()
    return {tuple(r) for r in rows}


def _node_keys(kb) -> set[str]:
    with kb.store.db.connection() as conn:
        return {r[0] for r in conn.execute("SELECT key FROM rag_graph_nodes WHERE collection = 'default'")}


def test_ingest_writes_graph_and_replace_delete_leave_no_orphans_or_stale_edges(kb, corpus_copy):
    root = corpus_copy(TRADE, EARNINGS, LEARNING)
    report = kb.ingest([root])
    assert report.count("failed") == 0
    trade = _edges(kb, TRADE)
    assert ("trd-2025-001", "exhibited_bias", "loss-aversion") in trade
    assert (f"doc:{TRADE}", "links_to", f"doc:{EARNINGS}") in trade
    # the learning derives from the trade: both documents reach the same entity node
    assert ("lrn-loss-aversion-pre-earnings", "derived_from", "trd-2025-001") in _edges(kb, LEARNING)
    assert "win" in _node_keys(kb)

    # replace: the trade no longer records an outcome, its edge and the now-unused node go
    path = root / TRADE
    body = yaml.safe_load(path.read_text())
    body["_graph"]["relations"].remove(["TRD-2025-001", "resulted_in", "win"])
    body["_graph"]["entities"].remove(["outcome", "win"])
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    assert kb.ingest([root]).count("changed") == 1
    assert not any(p == "resulted_in" for _, p, _ in _edges(kb, TRADE))
    assert "win" not in _node_keys(kb)
    assert kb.store.graph_orphan_nodes("default") == [] and kb.store.graph_stale_edges("default") == []

    # delete: the trade's edges go; nodes still used by the learning stay
    kb.delete_document(TRADE)
    assert _edges(kb, TRADE) == set()
    keys = _node_keys(kb)
    assert "trd-2025-001" in keys  # the learning still derives from it
    assert "earnings" not in keys or any("earnings" in (s, d) for p in (EARNINGS, LEARNING)
                                         for s, _, d in _edges(kb, p))
    assert kb.store.graph_orphan_nodes("default") == []
    kb.delete_document(LEARNING)
    kb.delete_document(EARNINGS)
    assert _node_keys(kb) == set()
