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


# Not tests of embedding: the shared corpus's vectors come from the cache (no model calls).
pytestmark = pytest.mark.warm_cache


def _doc(root: Path, rel: str):
    (doc,) = load_file(root / rel, root, "default", 10_000_000)
    return doc


def test_trade_journal_graph_has_its_exact_triples_and_links(corpus_copy):
    root = corpus_copy(TRADE, EARNINGS, STRATEGY, PROFILE, LEARNING, f"{K}/analysis/stock/AMD_20250122T0935.yaml")
    doc = _doc(root, TRADE)
    graph = document_graph(doc, flatten(doc, load_mapping(Path("rag_lib/sections.yaml"))))
    me = f"doc:{TRADE}"
    triples = {(e.src, e.predicate, e.dst) for e in graph.edges if e.section == "_graph" and e.predicate != "has_entity"}
    assert triples == {  # the trade's id names its journal: one node
        (me, "traded", "ticker:NVDA"),
        (me, "catalyst_type", "earnings"),
        (me, "resulted_in", "win"),
        (me, "exhibited_bias", "loss-aversion"),
        (me, "based_on", "ea-nvda-q4-2024"),
    }
    links = {(e.role, e.dst) for e in graph.edges if e.predicate == "links_to"}
    assert links == {
        ("analysis", f"doc:{EARNINGS}"), ("strategy", f"doc:{STRATEGY}"),
        ("ticker", f"doc:{PROFILE}"), ("learnings", f"doc:{LEARNING}"),
    }
    assert all(e.src == me and e.section == "_links" for e in graph.edges if e.predicate == "links_to")
    assert graph.dangling == []
    facts = {(e.predicate, e.dst) for e in graph.edges if e.section == "_meta"}
    assert {("about_ticker", "ticker:NVDA"), ("has_type", "doc_type:trade-journal"), ("dated", "date:2025-01-15")} <= facts
    kinds = {n.key: n.kind for n in graph.nodes}
    assert "trd-2025-001" not in kinds and ("trd-2025-001", me, "TRD-2025-001") in \
        {(a.alias, a.key, a.spelling) for a in graph.aliases}
    assert kinds["loss-aversion"] == "bias" and kinds["earnings"] == "catalyst"
    assert kinds["ticker:NVDA"] == "ticker" and kinds[me] == "doc"
    # every edge endpoint is a node of the graph
    assert {k for e in graph.edges for k in (e.src, e.dst)} <= set(kinds)


def test_links_climbing_out_of_their_folder_resolve_inside_the_root():
    from rag_lib.graph.extract import resolve_link

    known = {"notes/stop-loss-checklist.md", "knowledge/learnings/biases/a.yaml"}
    # the demo corpus's own link (it was reported dangling by graph_dangling_links)
    assert resolve_link("../notes/stop-loss-checklist.md", "knowledge/learnings/risk/x.yaml", known) == \
        "notes/stop-loss-checklist.md"
    assert resolve_link("../biases/a.yaml", "knowledge/learnings/risk/x.yaml", known) == "knowledge/learnings/biases/a.yaml"
    assert resolve_link("../../../../notes/stop-loss-checklist.md", "knowledge/x.yaml", known) is None  # not above the root


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


def test_graph_entities_by_name_and_triples_are_read_and_what_is_not_is_a_warning(tmp_path: Path):
    """A `_graph` written as plain entity names and a `triples:` list (the README's word) made no
    edge and no warning: the graph lost the analyst's statements without a word."""
    (tmp_path / "TSLA_20260115T0930.yaml").write_text(
        "_meta:\n  type: stock-analysis\nticker: TSLA\nthesis: short\n_graph:\n  entities:\n  - BYD\n"
        "  - [theme, Robotaxi]\n  - {name: Optimus}\n  triples:\n  - [TSLA, competes_with, BYD]\n"
        "  - [TSLA, exposed_to]\n  notes: free text\n")
    doc = _doc(tmp_path, "TSLA_20260115T0930.yaml")
    graph = extract_graph(doc, [], set(), {"TSLA"})
    me = "doc:TSLA_20260115T0930.yaml"
    assert {(me, "has_entity", "byd"), (me, "has_entity", "robotaxi"),
            ("ticker:TSLA", "competes_with", "byd")} <= graph.triples()
    assert doc.warnings == [
        "_graph.notes is not read (a _graph holds entities and relations); the knowledge graph has none of it",
        "_graph.entities[2] {'name': 'Optimus'}; _graph.triples[1] ['TSLA', 'exposed_to']: not [kind, name] or "
        "a name (entities), nor [subject, predicate, object] (relations); the knowledge graph skipped them"]
    (tmp_path / "list.yaml").write_text("ticker: TSLA\nthesis: short\n_graph:\n- [TSLA, competes_with, BYD]\n")
    assert _doc(tmp_path, "list.yaml").warnings == [
        "_graph is a list, not a mapping of entities and relations; the knowledge graph has none of it"]


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
    assert (f"doc:{TRADE}", "exhibited_bias", "loss-aversion") in trade
    assert (f"doc:{TRADE}", "links_to", f"doc:{EARNINGS}") in trade
    # the learning derives from the trade: its id resolves to the trade's node
    assert (f"doc:{LEARNING}", "derived_from", f"doc:{TRADE}") in _edges(kb, LEARNING)
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
    assert f"doc:{TRADE}" in keys  # the learning still derives from it
    assert "earnings" not in keys or any("earnings" in (s, d) for p in (EARNINGS, LEARNING)
                                         for s, _, d in _edges(kb, p))
    assert kb.store.graph_orphan_nodes("default") == []
    kb.delete_document(LEARNING)
    kb.delete_document(EARNINGS)
    assert _node_keys(kb) == set()


AMD = f"{K}/analysis/stock/AMD_20250122T0935.yaml"
MSFT = f"{K}/analysis/stock/MSFT_20260220T1805.yaml"
META = f"{K}/analysis/stock/META_20260220T2115.yaml"
SMALL = (TRADE, EARNINGS, LEARNING, STRATEGY, PROFILE, AMD, MSFT, META)


def test_graph_queries_and_hybrid_context_routing_within_budget(kb, corpus_copy):
    from rag_lib.errors import NotFoundError, ValidationError
    from rag_lib.graph.extract import normalise_name

    assert kb.ingest([corpus_copy(*SMALL)]).count("failed") == 0
    ctx = kb.ticker_context("nvda")
    assert ctx["ticker"] == "NVDA"
    assert "loss-aversion" in {normalise_name(b) for b in ctx["biases"]}
    assert "TRD-2025-001" in ctx["trades"] and "win" in ctx["outcomes"]
    assert any("loss-aversion" in normalise_name(x) for x in ctx["learnings"])
    assert {"Semiconductors", "Technology"} <= set(ctx["sectors"])
    assert EARNINGS in {d["path"] for d in ctx["documents"]}
    # AMD's analysis links to the NVDA earnings analysis: a peer through a linked document
    peers = {p["ticker"]: p["via"] for p in kb.ticker_context("NVDA", depth=3)["peers"]}
    assert "AMD" in peers

    near = kb.neighbors("loss_aversion", depth=1)
    assert near["node"]["key"] == "loss-aversion" and near["node"]["kind"] == "bias"
    facts = {(e["src"], e["predicate"], e["dst"], e["path"]) for e in near["edges"]}
    assert (f"doc:{TRADE}", "exhibited_bias", "loss-aversion", TRADE) in facts
    assert (f"doc:{LEARNING}", "addresses", "loss-aversion", LEARNING) in facts
    two = kb.neighbors("loss-aversion", depth=2)
    assert len(two["edges"]) > len(near["edges"]) and max(n["depth"] for n in two["nodes"]) == 2
    only = kb.neighbors("TRD-2025-001", depth=2, predicates=["traded"])
    assert {e["predicate"] for e in only["edges"]} == {"traded"}
    with pytest.raises(ValidationError):
        kb.neighbors("NVDA", depth=4)
    with pytest.raises(NotFoundError):
        kb.neighbors("no-such-thing-at-all")
    with pytest.raises(ValidationError, match=r"predicate 'tradde' \(did you mean traded\?\); its predicates: "):
        kb.neighbors("TRD-2025-001", predicates=["tradde"])

    path = kb.graph_path("AMD", "loss-aversion")
    assert path["found"] and 1 <= len(path["edges"]) <= 4
    chain = {path["from"]["key"]}
    for e in path["edges"]:  # each edge continues the chain (either direction)
        assert e["src"] in chain or e["dst"] in chain
        chain |= {e["src"], e["dst"]}
    assert "loss-aversion" in chain

    # a context thinner than asked for says why
    assert kb.hybrid_context("NVDA risks", ticker="NVDX", token_budget=1500).note.startswith(
        "no document of collection 'default' has ticker NVDX (did you mean NVDA?)")
    assert kb.hybrid_context("NVDA risks", token_budget=64).note == "no passage fits within token_budget 64; raise it"
    assert "no document of type earnings-analyses (did you mean earnings-analysis" in kb.hybrid_context(
        "NVDA risks", analysis_type="earnings-analyses").note
    assert kb.hybrid_context("NVDA risks", analysis_type="earnings_analysis").note is None  # a spelling of a type
    assert kb.hybrid_context("NVDA risks", collection="elsewhere").note.startswith("collection 'elsewhere' holds no documents")
    rel = kb.hybrid_context("How does NVDA relate to AMD?", token_budget=1500)
    assert rel.note is None
    assert (rel.kind, rel.route) == ("relationship", "graph-first")
    assert rel.graph and rel.graph[0]["ticker"] == "NVDA" and "## Knowledge graph" in rel.markdown
    assert {c.ticker for c in rel.passages.citations} & {"NVDA", "AMD"}

    cmp_ = kb.hybrid_context("compare MSFT vs META", token_budget=1500)
    assert (cmp_.kind, cmp_.route) == ("comparison", "per-ticker")
    assert {"MSFT", "META"} <= {c.ticker for c in cmp_.passages.citations}

    trend = kb.hybrid_context("NVDA earnings trend over time", token_budget=1500)
    assert (trend.kind, trend.route) == ("trend", "time-filtered")
    assert trend.passages.citations
    assert all(c.ticker == "NVDA" for c in trend.passages.citations if c.doc_type != "learning")

    plain = kb.hybrid_context("where is the stop loss", ticker="NVDA", token_budget=2000)
    assert plain.route == "hybrid" and plain.tickers == ["NVDA"]
    assert "learning" in {c.doc_type for c in plain.passages.citations}  # learnings always added
    count = kb.provider.tokenizer().count
    for budget in (80, 300, 900):
        small = kb.hybrid_context("How does NVDA relate to AMD?", token_budget=budget)
        assert small.tokens <= budget and count(small.markdown) <= budget

    analysis = kb.build_analysis_context("NVDA", "earnings-analysis", token_budget=1200)
    assert analysis.tokens <= 1200 and analysis.passages.citations and analysis.graph
    similar = kb.get_similar_analyses("NVDA")
    assert similar and all(h.ticker == "NVDA" and h.doc_type in ("earnings-analysis", "ticker-profile",
                                                                 "stock-analysis", "research") for h in similar)
    assert len({h.path for h in similar}) == len(similar)


def test_graph_checks_fail_on_planted_dangling_link_orphan_and_stale_edge(kb, corpus_copy):
    root = corpus_copy(TRADE, EARNINGS, STRATEGY, PROFILE, LEARNING)
    assert kb.ingest([root]).count("failed") == 0
    dangling, orphans, stale, duplicates, summary = kb.graph_checks()
    # the learning links to learnings/biases/timing-conservatism.yaml, which the corpus does not have
    assert not dangling.passed and dangling.severity == "warn"
    assert f"{LEARNING} → learnings/biases/timing-conservatism.yaml" in dangling.metadata["links"]
    assert orphans.passed and stale.passed
    assert summary.metadata["edges_by_predicate"]["links_to"] >= 4 and summary.metadata["nodes_by_kind"]["bias"] == 1
    sample = summary.markdown["sample"]
    assert sample.count("\n") >= 4 and "has_entity" not in sample and "has_type" not in sample
    assert "| links_to |" in summary.markdown["predicates"]

    with kb.store.db.connection() as conn:
        conn.execute("INSERT INTO rag_graph_nodes (collection, key, kind, label) VALUES ('default', 'planted', 'bias', 'x')")
        conn.execute("UPDATE rag_graph_edges SET doc_hash = 'old' WHERE path = %s AND predicate = 'traded'", (TRADE,))
    _, orphans, stale, _, _ = kb.graph_checks()
    assert not orphans.passed and orphans.severity == "error" and orphans.metadata["nodes"] == ["planted"]
    assert not stale.passed and stale.severity == "error"
    assert stale.metadata["edges"] == [f"{TRADE}: doc:{TRADE} traded ticker:NVDA"]

    # re-publishing the trade replaces its stale edges
    kb.ingest([root], force=True)
    assert kb.graph_checks()[2].passed


def test_graph_surfaces_cli_http_mcp_end_to_end(kb, corpus_copy, rag, tmp_path):
    import json

    import anyio
    from fastapi.testclient import TestClient
    from mcp import Client

    from rag_lib.mcp_server import create_mcp
    from rag_lib.server import create_app
    from rag_lib.server.security import KeyRing

    assert kb.ingest([corpus_copy(TRADE, EARNINGS, LEARNING, AMD)]).count("failed") == 0

    # CLI, in process against the same database (the `rag` fixture uses this test's database)
    code, out, _ = rag("graph", "loss-aversion", "--depth", "2", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["node"]["key"] == "loss-aversion" and any(e["predicate"] == "exhibited_bias" for e in data["edges"])
    code, out, _ = rag("graph", "NVDA", "--to", "AMD", "--json")
    assert code == 0 and json.loads(out)["found"]
    code, out, err = rag("graph", "nothing-like-this")
    assert code == 1 and "no graph node 'nothing-like-this'" in err and "did you mean" not in err
    code, out, err = rag("graph", "NVDX")  # a typo: the close ticker is offered
    assert code == 1 and "no graph node 'NVDX' in collection 'default' (did you mean NVDA?)" in err
    code, out, err = rag("graph", "aversion")  # part of a name: the nodes whose label holds it
    assert code == 1 and "(did you mean loss-aversion" in err
    code, out, _ = rag("graph", "export", "--format", "graphml", "--output", str(tmp_path / "g.graphml"))
    assert code == 0
    import xml.etree.ElementTree as ET
    tree = ET.parse(tmp_path / "g.graphml")
    ns = {"g": "http://graphml.graphdrawing.org/xmlns"}
    assert len(tree.findall(".//g:edge", ns)) == sum(kb.store.graph_counts("default")["edges"].values())
    code, out, _ = rag("graph", "export", "--format", "cypher")
    assert code == 0 and "MERGE (n:RagNode {key: \"loss-aversion\"}) SET n:Bias" in out
    assert ":EXHIBITED_BIAS {path: \"" + TRADE in out
    code, out, _ = rag("context", "How does NVDA relate to AMD?", "--budget", "400", "--json")
    assert code == 0
    ctx = json.loads(out)
    assert ctx["route"] == "graph-first" and ctx["tokens"] <= 400 and ctx["hits"]
    # `rag context ... > prompt.md`: the markdown alone on stdout, how it was built on stderr
    code, out, err = rag("context", "How does NVDA relate to AMD?", "--budget", "400")
    assert code == 0 and out.strip() == ctx["markdown"].strip() and "graph-first" in err

    # HTTP
    app = create_app(kb.settings, kb=kb, keys=KeyRing())
    with TestClient(app, base_url="http://127.0.0.1") as client:
        r = client.get("/api/rag/graph/TRD-2025-001", params={"depth": 1})
        assert r.status_code == 200, r.text
        assert r.json()["node"]["key"] == f"doc:{TRADE}" and r.json()["node"]["label"] == "TRD-2025-001"
        assert (f"doc:{TRADE}", "traded", "ticker:NVDA") in {(e["src"], e["predicate"], e["dst"]) for e in r.json()["edges"]}
        r = client.get(f"/api/rag/graph/{TRADE}", params={"depth": 1})
        assert r.status_code == 200 and r.json()["node"]["kind"] == "doc"
        r = client.get("/api/rag/graph/NVDA", params={"context": True})
        assert r.status_code == 200 and "TRD-2025-001" in r.json()["trades"]
        assert client.get("/api/rag/graph/NVDA", params={"depth": 9}).status_code == 422
        assert client.get("/api/rag/graph/nothing-here").json()["error"]["code"] == "not_found"
        r = client.post("/api/rag/hybrid-context", json={"query": "compare NVDA vs AMD", "token_budget": 500})
        assert r.status_code == 200, r.text
        assert r.json()["route"] == "per-ticker" and r.json()["tokens"] <= 500
        # the Python API's and MCP tool's arguments (seed 004's get_hybrid_context) are the route's too
        r = client.post("/api/rag/hybrid-context", json={"query": "NVDA thesis", "analysis_type": "trade-journal",
                                                         "exclude_doc_id": "TRD-2025-001", "token_budget": 800})
        assert r.status_code == 200, r.text
        assert r.json()["hits"] and all(h["doc_id"] != "TRD-2025-001" for h in r.json()["hits"])

    # MCP, in process through the SDK client
    async def run() -> None:
        async with Client(create_mcp(lambda: kb)) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"rag_hybrid_context", "rag_graph"} <= names
            res = await client.call_tool("rag_graph", {"node": "loss-aversion", "depth": 1})
            assert not res.is_error
            body = res.structured_content or json.loads(res.content[0].text)
            assert any(e["predicate"] == "addresses" for e in body["edges"])
            # one node for the bias the trade spells loss_aversion and the learning loss-aversion, both shown
            assert {body["node"]["label"], *body["node"]["aliases"]} >= {"loss_aversion", "loss-aversion"}
            res = await client.call_tool("rag_hybrid_context", {"query": "How does NVDA relate to AMD?",
                                                                 "token_budget": 300})
            body = res.structured_content or json.loads(res.content[0].text)
            assert not res.is_error and body["route"] == "graph-first" and body["tokens"] <= 300
            res = await client.call_tool("rag_graph", {"node": "no-such-node"})
            assert res.is_error and "not_found" in " ".join(getattr(c, "text", "") for c in res.content)
            # a client naming no collection (the seeds') against an empty one is told where documents are
            for args in ({"node": "NVDA", "collection": "elsewhere"}, {"node": "NVDA", "context": True,
                                                                       "collection": "elsewhere"}):
                res = await client.call_tool("rag_graph", args)
                text = " ".join(getattr(c, "text", "") for c in res.content)
                assert res.is_error and "collection 'elsewhere' holds no documents; these do: " in text, text
            res = await client.call_tool("rag_similar", {"ticker": "NVDX"})
            body = res.structured_content or json.loads(res.content[0].text)
            assert body["results"] == [] and "did you mean NVDA?" in body["note"]

    anyio.run(run)


def test_documents_without_parsed_body_reread_their_source_for_the_graph(corpus_copy):
    """Stage runs (Dagster) publish documents rebuilt from metadata: the graph still has the triples."""
    import dataclasses

    root = corpus_copy(TRADE, LEARNING)
    doc = _doc(root, TRADE)
    bare = dataclasses.replace(doc, body=None)
    assert (f"doc:{TRADE}", "traded", "ticker:NVDA") in document_graph(bare).triples()
    (root / TRADE).write_text((root / TRADE).read_text() + "\n# edited\n")  # content no longer what was chunked
    assert not any(e.section == "_graph" for e in document_graph(bare).edges)


def test_graph_fusion_lifts_linked_documents_in_hybrid_search(corpus_kb):
    from rag_lib.models import SearchFilters
    from rag_lib.search.fusion import graph_candidates

    query = "NVDA trade exit and what the trader learned"
    s = corpus_kb.settings.search
    assert s.graph_fusion  # on by default: benchmarks/graph_fusion.py (tradegent-dev, per query type)
    on = corpus_kb.search(query, mode="hybrid", top_k=300, group=False)
    assert "graph" in on.timings_ms
    s.graph_fusion = False
    off = corpus_kb.search(query, mode="hybrid", top_k=300, group=False)
    assert "graph" not in off.timings_ms
    # the strategy the trade links to (`_links.strategy`) ranks higher with the graph's list (chunk
    # ranks: with document evidence in the fusion it no longer reaches the top 50 units either way)
    rank = lambda hits: next((i for i, h in enumerate(hits) if h.path == STRATEGY), len(hits))  # noqa: E731
    assert rank(on.hits) < rank(off.hits)

    # the list itself: first-pass hits of documents linked to / sharing nodes with the top documents, in order
    first = corpus_kb.search(query, mode="hybrid", top_k=300, group=False).hits
    listed = graph_candidates(corpus_kb.store, SearchFilters(collection="default"), first, s)
    seeds = list(dict.fromkeys(h.path for h in first))[: s.graph_seeds]
    assert TRADE in seeds and listed.source == "graph" and listed.weight == s.graph_weight
    paths = {h.path for h in listed.hits}
    assert STRATEGY in paths and not paths & set(seeds)
    assert [h.chunk_id for h in listed.hits] == [h.chunk_id for h in first if h.path in paths]
    # queries naming no ticker or document type keep plain hybrid fusion
    s.graph_fusion = True
    assert "graph" not in corpus_kb.search("max log file size before rotation", mode="hybrid").timings_ms


def test_the_graph_list_query_and_its_time_limit_take_one_round_trip(kb, corpus_copy, tmp_path):
    """A hybrid search waits on the graph's list: its statement goes with its statement_timeout in
    one round trip (inside a transaction they took four), and the time limit still holds."""
    from rag_lib.errors import QueryTimeoutError
    from rag_lib.graph.extract import STRUCTURAL
    from testkit import round_trips

    kb.ingest([corpus_copy(TRADE, STRATEGY, LEARNING, EARNINGS)])
    related, trips = round_trips(tmp_path / "graph.log", lambda: kb.store.graph_related_paths(
        "default", [TRADE], STRUCTURAL, 20))
    assert trips == 1 and STRATEGY in {p for p, _ in related}
    kb.settings.graph.query_timeout_ms = 50
    with pytest.raises(QueryTimeoutError, match="query_timeout_ms=50"):
        kb.store._graph_statement("SELECT pg_sleep(2)", {})
    assert kb.store.graph_related_paths("default", [TRADE], STRUCTURAL, 20) == related  # the pool's connection is fine


def test_search_goes_on_without_the_graph_list_when_the_graph_query_times_out(kb, corpus_copy, caplog):
    """The graph's list waits on `graph.query_timeout_ms` like every graph query; past it the
    search answers without the list (and says so in the log) instead of waiting on the graph."""
    import threading

    import psycopg

    kb.ingest([corpus_copy(TRADE, STRATEGY, LEARNING, EARNINGS)])
    query = "NVDA trade exit and what the trader learned"
    assert "graph" in kb.search(query, mode="hybrid").timings_ms
    kb.settings.search.graph_fusion = False
    without = [h.chunk_id for h in kb.search(query, mode="hybrid").hits]
    kb.settings.search.graph_fusion = True
    kb.settings.graph.query_timeout_ms = 300
    released = threading.Event()
    with psycopg.connect(kb.settings.database_url) as locker:
        locker.execute("LOCK TABLE rag_graph_edges IN ACCESS EXCLUSIVE MODE")  # held until commit
        timer = threading.Timer(60, lambda: (released.set(), locker.cancel()))
        timer.start()
        try:
            with caplog.at_level("WARNING", logger="rag_lib.search.fusion"):
                result = kb.search(query, mode="hybrid")
        finally:
            timer.cancel()
    assert not released.is_set()  # answered while the graph was still locked
    assert without and [h.chunk_id for h in result.hits] == without  # as if the graph's list were off
    assert any("without the graph's list" in r.getMessage() and "query_timeout_ms=300" in r.getMessage()
               for r in caplog.records)


def test_a_load_leaves_the_tables_searches_read_with_planner_statistics(kb, corpus_copy):
    """Searches right after a bulk load are planned on real statistics (not after autovacuum's
    next round): the graph list's query ran seconds on tables without them."""
    import psycopg

    from rag_lib.store.stages import SERVING_TABLES

    def with_statistics() -> set[str]:
        with psycopg.connect(kb.settings.database_url) as conn:
            return {r[0] for r in conn.execute(
                "SELECT DISTINCT tablename FROM pg_stats WHERE tablename = ANY(%s)", (list(SERVING_TABLES),))}

    assert with_statistics() == set()
    kb.ingest([corpus_copy(TRADE, STRATEGY, LEARNING, EARNINGS, PROFILE)])
    assert {"rag_documents", "rag_chunks", "rag_chunk_vectors", "rag_graph_edges", "rag_graph_nodes"} <= with_statistics()
    assert kb.store.refresh_statistics(force=True) == sorted(SERVING_TABLES)
