"""One node per real thing in the knowledge graph (aliases kept and shown, duplicates reported), and
entity linking: questions that describe a company instead of naming it reach its documents through
per-ticker profiles built from the corpus. Fixture corpora are written here; real database and model."""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def _write(root: Path, rel: str, body: dict) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(body, sort_keys=False), encoding="utf-8")
    return path


def _profile(ticker: str, name: str, sector: str, industry: str, description: str) -> dict:
    return {"_meta": {"id": ticker, "type": "ticker", "version": 1, "created": "2025-01-01T09:00:00Z"},
            "ticker": ticker,
            "company": {"name": name, "sector": sector, "industry": industry, "description": description},
            "_graph": {"entities": [["ticker", ticker], ["sector", sector], ["industry", industry]],
                       "relations": [[ticker, "in_sector", sector], [ticker, "in_industry", industry]]}}


def _analysis(ticker: str, doc_id: str) -> dict:
    # The same plain trading words for every ticker: nothing here says what the company does.
    return {"_meta": {"id": doc_id, "type": "stock-analysis", "version": 1, "created": "2025-01-05T09:00:00Z"},
            "ticker": ticker,
            "risk_management": {"stop_loss": "Stop below the 50-day average; size one percent of the account.",
                                "invalidation": "Thesis fails if the company misses guidance two quarters running."},
            "summary": {"text": f"{ticker} setup: pullback to support with rising volume, risk defined."}}


TRADE = "trades/NVDA_20250115T1000.yaml"
LEARNING = "learnings/loss-aversion.yaml"
NVDA_PROFILE = "profiles/NVDA_20250110T1000.yaml"
RESEARCH = "research/MKT_20250110T0800.yaml"
TSLA_PROFILE = "profiles/TSLA_20250101T0900.yaml"


def _nvda_corpus(root: Path) -> None:
    _write(root, NVDA_PROFILE, _profile("NVDA", "NVIDIA Corporation", "Technology", "Semiconductors",
                                        "Designs GPUs for AI training"))
    _write(root, TRADE, {
        "_meta": {"id": "TRD-2025-001", "type": "trade-journal", "created": "2025-01-15T10:00:00Z"},
        "ticker": "NVDA",
        "review": {"notes": "Exited NVDA early to lock in gains before earnings."},
        "_graph": {"entities": [["trade", "TRD-2025-001"], ["ticker", "NVDA"], ["bias", "loss_aversion"]],
                   "relations": [["TRD-2025-001", "traded", "NVDA"], ["TRD-2025-001", "exhibited_bias", "loss_aversion"]]}})
    _write(root, LEARNING, {
        "_meta": {"id": "LRN-loss-aversion", "type": "learning", "created": "2025-01-28T17:30:00Z"},
        "pattern": {"description": "Selling winners before the catalyst to protect gains."},
        "_graph": {"entities": [["learning", "LRN-loss-aversion"], ["bias", "loss-aversion"]],
                   "relations": [["LRN-loss-aversion", "addresses", "loss-aversion"],
                                 ["LRN-loss-aversion", "derived_from", "TRD-2025-001"]]}})


def _node_keys(kb) -> set[str]:
    with kb.store.db.connection() as conn:
        return {r[0] for r in conn.execute("SELECT key FROM rag_graph_nodes WHERE collection = 'default'")}


def test_ticker_named_four_ways_is_one_node_with_its_aliases(kb, tmp_path):
    root = tmp_path / "corpus"
    # text and `_graph` name the company only: written before the profile saying who "Tesla" is
    _write(root, RESEARCH, {
        "_meta": {"id": "MKT-2025-001", "type": "research", "created": "2025-01-10T08:00:00Z"},
        "summary": {"text": "Battery costs fall; TSLA and its suppliers benefit."},
        "_graph": {"entities": [["customer", "Tesla"], ["theme", "Battery-Costs"]],
                   "relations": [["Tesla", "benefits_from", "Battery-Costs"]]}})
    _write(root, "analysis/KO_20250105T0900.yaml", _analysis("KO", "SA-KO-1"))  # KO: a second known ticker
    assert kb.ingest([root]).count("failed") == 0
    assert "tesla" in _node_keys(kb)  # nothing says yet that Tesla is a ticker
    _write(root, TSLA_PROFILE, _profile("TSLA", "Tesla, Inc.", "Consumer Cyclical", "Auto Manufacturers",
                                        "Electric vehicles and battery storage"))
    _write(root, "analysis/TSLA_20250105T0900.yaml", _analysis("TSLA", "SA-TSLA-1"))
    assert kb.ingest([root]).count("failed") == 0

    keys = _node_keys(kb)
    assert "tesla" not in keys and "tsla" not in keys and "ticker:TSLA" in keys
    with kb.store.db.connection() as conn:
        research = {tuple(r) for r in conn.execute(
            "SELECT src, predicate, dst FROM rag_graph_edges WHERE path = %s", (RESEARCH,))}
    # `_graph` entity by company name, text mention by symbol: the same node as the metadata ticker
    assert ("ticker:TSLA", "benefits_from", "battery-costs") in research
    for ref in ("TSLA", "Tesla", "Tesla, Inc.", "tsla"):
        assert kb.neighbors(ref)["node"]["key"] == "ticker:TSLA", ref
    node = kb.neighbors("Tesla")["node"]
    assert {"Tesla", "Tesla, Inc."} <= set(node["aliases"])

    # a new version of the research note, written after the profile, resolves the name at once
    _write(root, RESEARCH, {**yaml.safe_load((root / RESEARCH).read_text()),
                            "notes": {"text": "Tesla guidance due."}})
    assert kb.ingest([root]).count("changed") == 1
    assert "tesla" not in _node_keys(kb)
    with kb.store.db.connection() as conn:
        research = {tuple(r) for r in conn.execute(
            "SELECT src, predicate, dst FROM rag_graph_edges WHERE path = %s", (RESEARCH,))}
    assert {("ticker:TSLA", "benefits_from", "battery-costs"), (f"doc:{RESEARCH}", "mentions", "ticker:TSLA"),
            (f"doc:{RESEARCH}", "has_entity", "ticker:TSLA")} <= research
    assert kb.graph_check("duplicate_nodes").passed


def test_rag_graph_nvda_depth_2_lists_its_trade_and_bias_spelled_two_ways(kb, rag, tmp_path):
    root = tmp_path / "corpus"
    _nvda_corpus(root)
    assert kb.ingest([root]).count("failed") == 0

    code, out, _ = rag("graph", "NVDA", "--depth", "2", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["node"]["key"] == "ticker:NVDA"
    assert {"NVIDIA Corporation", "NVIDIA"} <= set(data["node"]["aliases"])
    nodes = {n["key"]: n for n in data["nodes"]}
    trade = nodes[f"doc:{TRADE}"]  # the trade id and its journal: one node
    assert trade["label"] == "TRD-2025-001"
    assert nodes["loss-aversion"]["depth"] == 2 and nodes["loss-aversion"]["kind"] == "bias"
    assert not any(k in nodes for k in ("nvda", "trd-2025-001", "loss_aversion"))
    # the bias spelled `loss_aversion` (trade) and `loss-aversion` (learning) is one node, both spellings kept
    bias = kb.neighbors("loss_aversion")
    assert bias["node"]["key"] == "loss-aversion"
    assert {bias["node"]["label"], *bias["node"]["aliases"]} >= {"loss_aversion", "loss-aversion"}
    assert {(e["src"], e["dst"]) for e in bias["edges"]} >= {(f"doc:{TRADE}", "loss-aversion"),
                                                             (f"doc:{LEARNING}", "loss-aversion")}
    # the learning's `derived_from TRD-2025-001` reaches the trade's node
    assert (f"doc:{LEARNING}", "derived_from", f"doc:{TRADE}") in {
        (e["src"], e["predicate"], e["dst"]) for e in kb.neighbors("LRN-loss-aversion")["edges"]}
    code, out, _ = rag("graph", "NVIDIA")
    assert code == 0 and "ticker:NVDA is also named: NVIDIA, NVIDIA Corporation" in out
    assert "TRD-2025-001" in kb.ticker_context("NVDA")["trades"]


def test_duplicate_looking_nodes_check_reports_a_planted_near_duplicate(kb, tmp_path):
    root = tmp_path / "corpus"
    _nvda_corpus(root)
    assert kb.ingest([root]).count("failed") == 0
    assert kb.graph_check("duplicate_nodes").passed
    _write(root, "analysis/NVDA_20250120T0900.yaml", {
        "_meta": {"id": "EA-NVDA-1", "type": "earnings-analysis", "created": "2025-01-20T09:00:00Z"},
        "ticker": "NVDA", "summary": {"text": "Data center revenue drives the quarter."},
        "_graph": {"entities": [["metric", "DataCenter Revenue"], ["metric", "data-center-revenues"]],
                   "relations": [["NVDA", "key_metric", "DataCenter Revenue"],
                                 ["NVDA", "key_metric", "data-center-revenues"]]}})
    assert kb.ingest([root]).count("failed") == 0
    check = kb.graph_check("duplicate_nodes")
    assert not check.passed and check.severity == "warn"
    assert check.metadata["groups"] == ["data-center-revenues = datacenter-revenue"]
    assert "datacenter-revenue" in check.markdown["duplicate_nodes"]
    assert [r.metadata.get("duplicate_groups") for r in kb.graph_checks()][3] == 1


SECTORS = {
    "TSLA": ("Tesla, Inc.", "Consumer Cyclical", "Auto Manufacturers", "Electric vehicles (EVs), battery storage and charging networks"),
    "KO": ("The Coca-Cola Company", "Consumer Defensive", "Beverages", "Soft drinks, bottling partners, syrups"),
    "JPM": ("JPMorgan Chase & Co.", "Financial Services", "Banks", "Consumer banking, lending, investment banking"),
    "XOM": ("Exxon Mobil Corporation", "Energy", "Oil & Gas", "Crude oil production, refining, chemicals"),
}


def _linking_corpus(root: Path) -> None:
    for ticker, (name, sector, industry, description) in SECTORS.items():
        _write(root, f"profiles/{ticker}_20250101T0900.yaml", _profile(ticker, name, sector, industry, description))
        _write(root, f"analysis/{ticker}_20250105T0900.yaml", _analysis(ticker, f"SA-{ticker}-1"))


def test_question_describing_a_company_finds_its_documents_through_its_profile(kb, tmp_path):
    root = tmp_path / "corpus"
    _linking_corpus(root)
    report = kb.ingest([root])
    assert report.count("failed") == 0 and report.profiles["profiles"] == 4
    profiles = {p["ticker"]: p for p in kb.ticker_profiles()}
    assert set(profiles) == set(SECTORS) and "Electric vehicles" in profiles["TSLA"]["text"]
    assert "Electric" not in profiles["KO"]["text"]

    query = "the EV company"
    result = kb.search(query, mode="hybrid", top_k=4)
    assert list(result.plan["linked"]) == ["TSLA"] and result.plan["tickers"] == ["TSLA"]
    # the analysis says nothing about vehicles; the link is what puts it first
    analyses = [h for h in result.hits if h.doc_type == "stock-analysis"]
    assert analyses[0].ticker == "TSLA" and analyses[0].path == "analysis/TSLA_20250105T0900.yaml"
    assert kb.search("the bank", mode="semantic").plan["linked"].keys() == {"JPM"}
    # a question near no profile links nothing; a named ticker is not overridden
    assert kb.search("stop loss plan", mode="hybrid").plan["linked"] == {}
    named = kb.search("KO and the EV company", mode="hybrid").plan
    assert named["tickers"] == ["KO"] and named["linked"] == {}
    kb.settings.search.entity_linking = False
    assert kb.search(query, mode="hybrid").plan["linked"] == {}


def test_profiles_are_rebuilt_when_their_documents_change(kb, tmp_path):
    root = tmp_path / "corpus"
    _linking_corpus(root)
    assert kb.ingest([root]).count("failed") == 0
    before = {p["ticker"]: p for p in kb.ticker_profiles()}
    query = "the EV company"
    assert list(kb.search(query, mode="hybrid").plan["linked"]) == ["TSLA"]

    # TSLA's profile now describes a soft-drink maker: its profile is rebuilt (not every profile),
    # and the EV question no longer links to it
    _write(root, "profiles/TSLA_20250101T0900.yaml",
           _profile("TSLA", "Sunny Drinks Inc.", "Consumer Defensive", "Beverages", "Sparkling water and juices"))
    report = kb.ingest([root])
    # (KO's distinctive words shift too: "beverages" is no longer KO's alone; JPM's and XOM's do not)
    assert report.count("changed") == 1 and "TSLA" in report.profiles["rebuilt"]
    assert not {"JPM", "XOM"} & set(report.profiles["rebuilt"])
    after = {p["ticker"]: p for p in kb.ticker_profiles()}
    assert "Sparkling water" in after["TSLA"]["text"] and "Electric" not in after["TSLA"]["text"]
    assert after["TSLA"]["updated_at"] > before["TSLA"]["updated_at"]
    assert after["JPM"]["updated_at"] == before["JPM"]["updated_at"]
    assert "TSLA" not in kb.search(query, mode="hybrid").plan["linked"]

    # a ticker whose documents are all gone loses its profile
    kb.delete_document("profiles/XOM_20250101T0900.yaml")
    kb.delete_document("analysis/XOM_20250105T0900.yaml")
    assert "XOM" not in {p["ticker"] for p in kb.ticker_profiles()}


def test_linking_does_nothing_on_a_corpus_without_tickers(kb, tmp_path):
    root = tmp_path / "corpus"
    (root / "notes").mkdir(parents=True)
    (root / "notes" / "ops.md").write_text("# Ops\n\n## Backups\n\nNightly dumps of the database to object storage.\n")
    report = kb.ingest([root])
    assert report.count("failed") == 0 and report.profiles["profiles"] == 0 and kb.ticker_profiles() == []
    result = kb.search("how are backups of the database made", mode="hybrid")
    assert result.hits and result.plan["linked"] == {} and result.plan["tickers"] == []
