"""The `rag` command: exit codes, JSON output and one-line errors."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

LEARNING = "tradegent/knowledge/learnings/biases/loss-aversion-pre-earnings.yaml"
TRADE = "tradegent/knowledge/trades/2025/01/NVDA_20250115T1000.yaml"
MALFORMED = "tradegent/templates/post-trade-review.yaml"
REPO = Path(__file__).resolve().parents[1]


# Not tests of embedding: the shared corpus's vectors come from the cache (no model calls).
pytestmark = pytest.mark.warm_cache


def test_ingest_search_show_delete_round_trip(rag, corpus_copy):
    root = corpus_copy(LEARNING, MALFORMED)
    code, out, _ = rag("ingest", str(root), "--json")
    assert code == 0
    report = json.loads(out)
    assert report["new"] == 1 and report["skipped"] == 1
    assert report["files"][0]["path"] == LEARNING or report["files"][1]["path"] == LEARNING

    code, out, _ = rag("search", "loss aversion before earnings", "--json", "--top-k", "3")
    assert code == 0
    result = json.loads(out)
    assert result["results"][0]["path"] == LEARNING and len(result["results"]) <= 3

    code, out, _ = rag("status", "--json")
    status = json.loads(out)
    assert status["documents"] == 1 and status["skipped"][0]["reason"] == "malformed_yaml"

    code, out, _ = rag("list", "--json")
    assert [d["path"] for d in json.loads(out)] == [LEARNING]
    code, out, _ = rag("show", "LRN-loss-aversion-pre-earnings", "--json")
    assert code == 0 and json.loads(out)["path"] == LEARNING

    code, out, _ = rag("delete", LEARNING)
    assert code == 0 and "deleted" in out
    code, out, _ = rag("status", "--json")
    assert json.loads(out)["documents"] == 0


def _fresh_note(root: Path, name: str, topic: str) -> None:
    """A note whose text no cache holds, and a copy of it: two chunks for each of its texts."""
    text = "\n\n".join(f"## {topic} {n}\n\nThe desk's {topic} observation {n}: spreads widened {n * 7} bp "
                       f"while the {topic} basis held." for n in range(3))
    for place in (root / name, root / "copy" / name):
        place.parent.mkdir(exist_ok=True)
        place.write_text(f"# {topic}\n\n{text}\n")


def test_ingest_counts_chunks_and_texts_apart(rag, corpus_copy):
    """Chunks with the same text (a copied file's) share one vector, embedded once. The ingest report
    counted distinct texts in `embedded` and chunks in `cache_hits`, so its parts did not add up to
    its chunks; it now counts as `rag reembed` does: chunks, chunks_from_cache, texts_embedded."""
    root = corpus_copy(LEARNING)  # its texts are in the (warm) embedding cache
    _fresh_note(root, "basis.md", "zinc")
    code, out, _ = rag("ingest", str(root), "--json")
    report = json.loads(out)
    chunks = {f["path"]: f["chunks"] for f in report["files"]}
    cached, fresh = chunks[LEARNING], chunks["basis.md"]
    assert code == 0 and chunks["copy/basis.md"] == fresh > 1
    assert (report["chunks"], report["chunks_from_cache"], report["texts_embedded"]) == (cached + 2 * fresh, cached, fresh)

    _fresh_note(root, "carry.md", "nickel")
    code, out, _ = rag("ingest", str(root))
    said = " ".join(out.replace("│", " ").split())
    published = int(said.split("chunks published ")[1].split()[0])
    # the copy's chunks take the vectors embedded for the note's (from the cache when in a later call)
    from_cache = int(said.split("chunks from the embedding cache ")[1].split()[0])
    assert code == 0 and published % 2 == 0 and from_cache in (0, published // 2)
    assert f"distinct texts embedded for the other {published - from_cache} {published // 2} " in said, said

    # `--all PATHS` reports as `--all` does (it printed the ingest report), every vector from the cache
    code, out, _ = rag("reembed", "--all", str(root), "--json")
    data = json.loads(out)
    assert code == 0 and data["paths"] == [str(root)] and data["documents"] == data["reembedded"] == 5
    total = cached + 2 * fresh + published
    assert (data["chunks"], data["chunks_from_cache"], data["texts_embedded"]) == (total, total, 0)
    code, out, _ = rag("reembed", "--all", str(root))
    assert code == 0 and f"the 5 documents of {root}: 5 re-embedded under version " in " ".join(out.split())


def test_search_without_top_k_returns_search_top_k(rag, corpus_copy, monkeypatch):
    rag("ingest", str(corpus_copy(LEARNING, TRADE)))
    monkeypatch.setenv("RAG_SEARCH__TOP_K", "2")
    code, out, _ = rag("search", "loss aversion before earnings", "--json")
    assert code == 0 and len(json.loads(out)["results"]) == 2
    code, out, _ = rag("search", "loss aversion before earnings", "--json", "-k", "3")
    assert code == 0 and len(json.loads(out)["results"]) == 3
    monkeypatch.setenv("RAG_SEARCH__TOP_K", "-5")
    code, _, err = rag("status")
    assert code != 0 and "search.top_k" in err


def test_a_search_of_an_empty_collection_names_the_collections_that_hold_documents(rag, corpus_copy):
    root = corpus_copy(LEARNING)
    assert rag("ingest", str(root), "--collection", "research")[0] == 0
    code, out, _ = rag("search", "loss aversion")  # the default collection: nothing there
    assert code == 0
    assert "no results: collection 'default' holds no documents" in out and "research (1 document)" in out
    code, out, _ = rag("search", "loss aversion", "--collection", "research")
    assert code == 0 and "no results" not in out and "loss-aversion" in out
    code, out, _ = rag("status", "--collection", "default")
    assert code == 0 and "collection 'default' holds no documents; these do: research (1 document)" in out
    assert "holds no documents" not in rag("status")[1]  # every collection's figures
    code, out, _ = rag("list", "--collection", "default")
    assert code == 0 and "no documents: collection 'default' holds no documents; these do: research" in out
    assert "loss-aversion" in rag("list", "--collection", "research", "--json")[1]


def test_ingest_and_validate_say_which_metadata_a_document_lost(rag, tmp_path):
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "odd.yaml").write_text("_meta:\n  type: stock-analysis\nticker: 123\nanalysis_date: soon\nthesis: up\n")
    code, out, _ = rag("validate", str(root), "--json")
    assert code == 0  # a warning, not a problem
    assert [len(f["warnings"]) for f in json.loads(out)["files"]] == [2]
    code, out, _ = rag("ingest", str(root), "--json")
    files = json.loads(out)["files"]
    assert code == 0 and files[0]["status"] == "new"
    assert [w.split(" is not")[0] for w in files[0]["warnings"]] == ["ticker 123", "analysis_date 'soon'"]
    code, out, _ = rag("ingest", str(root))  # unchanged: still said, until the file is fixed
    assert code == 0 and "ingested without some of their metadata" in out and "analysis_date 'soon'" in out
    (root / "odd.yaml").write_text("_meta:\n  type: stock-analysis\nticker: NVDA\nanalysis_date: 2025-01-02\n"
                                   "thesis: up\n")
    code, out, _ = rag("ingest", str(root), "--json")
    assert code == 0 and json.loads(out)["files"][0]["warnings"] == []


def test_a_search_says_what_it_preferred_and_why(rag, corpus_copy):
    from rag_lib.cli.core import _plan_hints

    assert _plan_hints({"tickers": ["NVDA"], "linked": {"NVDA": 0.5285}}) == \
        "preferred: linked NVDA (profile similarity 0.53)"
    assert _plan_hints({"tickers": ["AMD", "NVDA"], "linked": {}, "doc_types": ["stock-analysis"],
                        "dates": ["2025-01-01", "2025-01-31"]}) == \
        "preferred: named AMD, NVDA; document types stock-analysis; dated 2025-01-01 to 2025-01-31"
    assert _plan_hints({"tickers": ["NVDA"], "linked": {}, "doc_types": ["strategy"],
                        "documents": ["strategies/earnings-momentum.yaml"]}) == \
        "preferred: named NVDA; document types strategy; documents strategies/earnings-momentum.yaml"
    assert _plan_hints({"tickers": [], "linked": {}, "doc_types": ["trade-journal"],
                        "type_lists": ["trade-journal"]}) == \
        "preferred: document types trade-journal; trade-journal also searched alone"
    assert _plan_hints({"tickers": [], "linked": {}}) == ""
    root = corpus_copy(LEARNING)
    assert rag("ingest", str(root))[0] == 0
    code, out, _ = rag("search", "loss aversion learnings", "--mode", "hybrid")
    assert code == 0 and "preferred: document types learning" in out


def test_the_search_table_shows_the_query_and_passages_as_written_and_excerpts_whole(rag, corpus_copy):
    """`rag search` read a query's or passage's brackets as console markup (a query holding "[/x]" failed
    with "unexpected MarkupError"; "[localhost:8501](http://...)" lost its link text) and cut every
    excerpt at 200 characters mid-word ("exit rationale: Targe") without a mark."""
    portal = "tradegent-docs/tradegent/dashboard/METABASE_PORTAL_SETUP.md"
    assert rag("ingest", str(corpus_copy(LEARNING, portal)))[0] == 0
    code, out, err = rag("search", "Streamlit [/x] custom dashboards", "--mode", "lexical", "-k", "1")
    assert code == 0, err
    assert "[/x]" in out and "[localhost:8501](http://localhost:8501)" in out
    query = "loss aversion pattern behavior when position reaches profit before earnings"
    code, out, _ = rag("search", query, "--mode", "hybrid", "--json")
    excerpts = [h["excerpt"] for h in json.loads(out)["results"]]
    assert any(len(e) > 200 for e in excerpts)
    code, out, _ = rag("search", query, "--mode", "hybrid")
    assert code == 0 and all(e.replace("\n", " ") in out for e in excerpts)


EARNINGS = "tradegent/knowledge/analysis/earnings/NVDA_20250120T0900.yaml"


def _row_of(out: str, cell: str) -> str:
    """The one line of `out` that holds `cell` (a unit id or a path) between a table's borders."""
    lines = [line for line in out.splitlines() if f"│ {cell} " in line]
    assert len(lines) == 1, (cell, lines)
    return lines[0]


def test_piped_search_and_list_print_each_row_on_one_line_with_its_date_and_ticker(rag, corpus_copy):
    """Into a pipe or a file (`rag search ... | less`, `rag list | grep NVDA`) rich took 80 columns and
    folded each row over several lines mid-word ("...earnings/NVDA_2025012" / "0T0900.yaml#phase8_pos..."),
    and a search row had no date or ticker: "what did we say in January about NVDA" meant opening each hit."""
    code, out, _ = rag("ingest", str(corpus_copy(TRADE, EARNINGS, LEARNING)))
    assert code == 0 and out.startswith("ingest into 'default'")  # no blank line from a hidden progress bar
    query = "what did we say in January about NVDA"
    hits = json.loads(rag("search", query, "--mode", "hybrid", "--json")[1])["results"]
    code, out, _ = rag("search", query, "--mode", "hybrid")
    assert code == 0 and out.startswith(f"hybrid search: {query}")  # the title at the margin, not centred
    assert "NVDA" in {h["ticker"] for h in hits} and {"2025-01-15", "2025-01-20"} <= {h["doc_date"] for h in hits}
    for n, hit in enumerate(hits, 1):
        row = _row_of(out, hit["unit_id"])
        cells = [c.strip() for c in row.strip("│ ").split(" │ ")]
        assert cells[:4] == [str(n), f"{hit['score']:.3f}", hit["doc_date"] or "", hit["ticker"] or ""], row
        assert cells[5] == hit["excerpt"].replace("\n", " ")  # whole, on the same line
    documents = json.loads(rag("list", "--json")[1])
    code, out, _ = rag("list")
    assert code == 0 and len(documents) == 3
    for doc in documents:
        row = _row_of(out, doc["path"])
        cells = [c.strip() for c in row.strip("│ ").split(" │ ")]
        assert cells[2:6] == [doc["doc_id"], doc["doc_type"], doc["ticker"] or "", doc["doc_date"] or ""], row


def test_an_ingest_of_a_deleted_folder_says_what_it_still_serves_and_what_deletes_it(rag, corpus_copy):
    """A folder deleted (or moved), then `rag ingest FOLDER --prune` to drop its documents, since an
    ingest names and prunes only under the path it is given: "no such file or directory", not a word
    of the documents read from there, which searches went on serving."""
    import shutil

    root = corpus_copy(LEARNING, TRADE, EARNINGS)
    assert rag("ingest", str(root))[0] == 0
    shutil.rmtree(root / "tradegent/knowledge/trades")
    code, _, err = rag("ingest", str(root / "tradegent/knowledge/trades"), "--prune")
    assert code == 1 and err.strip() == (
        f"error: {root}/tradegent/knowledge/trades: no such file or directory; 1 document of collection 'default' "
        f"read from there is still served: `rag ingest {root}/tradegent/knowledge --collection default --prune` "
        "deletes it")
    code, out, _ = rag("ingest", str(root / "tradegent/knowledge"), "--collection", "default", "--prune")
    assert code == 0 and f"pruned (their files are gone): {TRADE}" in out
    assert {d["path"] for d in json.loads(rag("list", "--json")[1])} == {LEARNING, EARNINGS}
    code, _, err = rag("ingest", str(root / "tradegent/knowledge/trades"))
    assert code == 1 and err.strip() == f"error: {root}/tradegent/knowledge/trades: no such file or directory"


def test_a_piped_table_title_wider_than_its_table_stays_on_one_line(rag, corpus_copy):
    """Into a pipe the rows were one line each, but a title wider than its table was still folded
    at the table's width: "ingest into 'tradegent' (264.8" / "s)", "database check (active space
    all-MiniLM-L6-v2:384, 3325" / "chunks, 3325 vectors)"."""
    assert rag("ingest", str(corpus_copy(LEARNING)))[0] == 0
    code, out, _ = rag("validate")
    assert code == 0
    assert re.fullmatch(r"database check \(active space all-MiniLM-L6-v2:384, \d+ chunks, \d+ vectors\)",
                        out.splitlines()[0]), out
    assert out.splitlines()[1].startswith("┏")  # the table follows its title


def test_a_terminal_of_80_columns_gets_a_search_table_80_columns_wide(rag, corpus_copy, monkeypatch):
    """COLUMNS (or a terminal's width) still bounds the table: each row is folded within it, with
    its rank, score, date and ticker on its first line."""
    assert rag("ingest", str(corpus_copy(TRADE, EARNINGS)))[0] == 0
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = rag("search", "NVDA entry and stop", "--mode", "hybrid", "-k", "3")
    lines = out.splitlines()
    assert code == 0 and max(len(line) for line in lines) <= 80
    firsts = [line for line in lines if re.match(r"│ +\d+ │ \d\.\d{3} │ 2025-01-(15|20) │ NVDA +│", line)]
    assert len(firsts) == 3, out


def test_a_path_in_a_narrow_column_breaks_after_a_slash_or_before_its_section():
    """A unit id in a column narrower than it was folded mid-name ("...earnings/NVDA_2025012" /
    "0T0900.yaml#phase8_pos..."); a part longer than the column is still folded, nothing is lost."""
    from rich.console import Console
    from rich.table import Table

    from rag_lib.cli.output import PathCell

    def cell_lines(width: int) -> list[str]:
        table = Table.grid()
        table.add_column(width=width)
        table.add_row(PathCell(f"{EARNINGS}#phase8_post_earnings"))
        console = Console(width=200, file=io.StringIO())
        console.print(table)
        return [line.rstrip() for line in console.file.getvalue().splitlines()]

    assert cell_lines(30) == ["tradegent/knowledge/analysis/", "earnings/", "NVDA_20250120T0900.yaml",
                              "#phase8_post_earnings"]
    assert cell_lines(200) == [f"{EARNINGS}#phase8_post_earnings"]
    folded = cell_lines(10)
    assert "".join(folded) == f"{EARNINGS}#phase8_post_earnings" and max(map(len, folded)) == 10


def test_show_previews_each_chunk_on_one_line_and_marks_where_it_was_cut(rag, tmp_path):
    """`rag show` printed a chunk's first 120 characters with its indentation as runs of spaces
    ("revenue trend 8q:     -") and cut mid-word without a mark ("... updated: 2025-01-20 sta")."""
    yaml = ("_meta:\n  type: research\nthesis:\n  levels:\n    entry: 4.10\n    stop: 3.85\n  view: "
            + "The desk is long copper on supply. " * 6 + "\nrisk: low\n")
    (tmp_path / "copper.yaml").write_text(yaml)
    assert rag("ingest", str(tmp_path / "copper.yaml"))[0] == 0
    chunks = {c["section_path"]: c["preview"] for c in json.loads(rag("show", "copper.yaml", "--json")[1])["chunks"]}
    assert len(chunks["thesis"]) == 120 and "\n" in chunks["thesis"] and chunks["risk"] == "risk: low"
    out = rag("show", "copper.yaml")[1]
    thesis = " ".join(chunks["thesis"].split())  # its line break a space
    assert re.search(rf"│ {re.escape(thesis)}… +│", out) and re.search(r"│ risk: low +│", out)


def test_tables_print_a_file_name_with_brackets_as_it_is(rag, tmp_path):
    """A skipped file named "copper [draft].yaml" was listed as "copper .yaml" by `rag ingest`, `rag
    status` and `rag validate`: its name was read as console markup."""
    (tmp_path / "copper [draft].yaml").write_text("_meta:\n  type: research\nthesis: [The desk is long copper.\n")
    for args in (("ingest", str(tmp_path)), ("status",), ("validate", str(tmp_path))):
        out = rag(*args)[1]
        assert "│ copper [draft].yaml " in out and "expected ',' or ']'" in out, (args, out)


def test_a_trend_search_says_its_results_read_in_date_order(rag, corpus_copy):
    """`rag search "latest MSFT analysis recommendation"` listed scores 1.000, 0.637, 0.544, 0.995: the
    results of a trend question read in date order, and nothing said so."""
    from rag_lib.cli.core import _order_hint

    assert _order_hint({"kind": "retrieval", "query": "MSFT stop"}) == ""
    assert _order_hint({"kind": "trend", "query": "how has MSFT evolved"}).startswith("in date order, oldest first")
    stock = "tradegent/knowledge/analysis/stock/"
    assert rag("ingest", str(corpus_copy(stock + "MSFT_20260220T1805.yaml", stock + "MSFT_20260221T1145.yaml")))[0] == 0
    code, out, _ = rag("search", "latest MSFT analysis recommendation", "--mode", "hybrid")
    assert code == 0 and "in date order, newest first" in out


def test_errors_are_one_clear_line_with_nonzero_exit(rag):
    code, out, err = rag("show", "no-such-doc")
    assert code == 1
    assert "no document 'no-such-doc'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1

    code, _, err = rag("search", "x", "--from", "last tuesday")
    assert code == 2 and "--from/--since must be a date" in err

    code, _, err = rag("search", "x", "--mode", "psychic")  # a usage error, like a bad --from
    assert code == 2 and "--mode must be one of semantic, lexical, hybrid, got 'psychic'" in err

    code, _, err = rag("ingest", "/definitely/not/here")
    assert code == 1 and "no such file or directory" in err

    code, _, err = rag("reset")
    assert code == 2 and "--yes" in err

    # usage errors are click's, shown as such (exit code 2), not as an unexpected failure
    code, _, err = rag("search", "x", "--date-from", "2025-01-01")
    assert code == 2 and "No such option: --date-from" in err and "unexpected" not in err
    code, _, err = rag("search", "x", "--top-k", "0")
    assert code == 2 and "--top-k" in err and "unexpected" not in err
    code, _, err = rag("graph", "export", "--format", "xml")
    assert code == 2 and "--format must be one of cypher, graphml" in err
    code, _, err = rag("list", "--offset", "99999999999999999999")
    assert code == 2 and "--offset" in err and "unexpected" not in err
    code, _, err = rag("serve", "--port", "99999")  # was taken modulo 65536: another port than it said
    assert code == 2 and "--port" in err


def test_cli_errors_name_the_file_the_collection_and_the_predicate(rag, corpus_copy, tmp_path):
    root = corpus_copy(LEARNING, TRADE)
    (root / "risk [draft].md").write_text("# Risk\n\n## Stops\n\nStops sit below support.\n")
    rag("ingest", str(root))
    # a path with brackets is printed as it is, not read as console markup
    code, out, _ = rag("delete", "risk [draft].md")
    assert code == 0 and "deleted risk [draft].md" in out
    code, _, err = rag("show", "risk [draft].md")
    assert code == 1 and "no document 'risk [draft].md'" in err
    code, _, err = rag("graph", "export", "--format", "graphml", "-o", str(tmp_path / "no" / "such" / "g.graphml"))
    assert code == 1 and "cannot write" in err and "No such file or directory" in err and "unexpected" not in err
    code, _, err = rag("graph", "NVDA", "--predicate", "exhibited_bais")
    assert code == 1 and "predicate 'exhibited_bais' (did you mean exhibited_bias?)" in err
    queries, qrels, empty = tmp_path / "q.jsonl", tmp_path / "qrels.tsv", tmp_path / "empty.tsv"
    queries.write_text(json.dumps({"_id": "q1", "text": "loss aversion before earnings"}) + "\n")
    qrels.write_text(f"query-id\tcorpus-id\tscore\nq1\t{LEARNING}#pattern\t1\n")
    empty.write_text("")
    code, _, err = rag("eval", "--queries", str(queries), "--qrels", str(qrels), "-c", "nosuch")
    assert code == 1 and "collection 'nosuch' holds no documents; these do: default" in err
    code, _, err = rag("eval", "--queries", str(queries), "--qrels", str(empty))
    assert code == 1 and "no judgments in it" in err
    code, out, err = rag("eval", "--queries", str(queries), "--qrels", str(qrels), "--json")
    assert code == 0 and json.loads(out)["queries"] == 1 and "warning" not in err
    # judgments of units the collection does not hold (another corpus, --unit document for section ids)
    code, out, err = rag("eval", "--queries", str(queries), "--qrels", str(qrels), "--unit", "document")
    assert code == 0 and "warning: 1 judged document is not in collection 'default'" in err and LEARNING in err
    queries.write_text(queries.read_text() * 2)  # the same id twice: which text is judged?
    code, _, err = rag("eval", "--queries", str(queries), "--qrels", str(qrels))
    assert code == 1 and "query id 'q1' repeats line 1" in err


def test_eval_names_judged_units_the_collection_does_not_hold(rag, corpus_copy, tmp_path):
    """A qrels line whose section is spelled differently (`#Pattern` for `#pattern`) was scored as a
    retrieval miss without a word: the figures read as poor retrieval, not as a typo."""
    root = corpus_copy(LEARNING, TRADE)
    rag("ingest", str(root))
    queries, qrels = tmp_path / "q.jsonl", tmp_path / "qrels.tsv"
    queries.write_text(json.dumps({"_id": "q1", "text": "loss aversion before earnings"}) + "\n"
                       + json.dumps({"_id": "q2", "text": "NVDA trade review"}) + "\n")
    qrels.write_text(f"query-id\tcorpus-id\tscore\nq1\t{LEARNING}#Pattern\t1\nq2\t{TRADE}#review\t1\n"
                     "q2\tnotes/gone.md#x\t1\n")
    code, out, err = rag("eval", "--queries", str(queries), "--qrels", str(qrels), "--json")
    assert code == 0
    assert json.loads(out)["unknown_units"] == {f"{LEARNING}#Pattern": [f"{LEARNING}#pattern"], "notes/gone.md#x": []}
    assert ("warning: 2 judged sections are not in collection 'default', so no search can return them and the "
            f"figures count a miss: notes/gone.md#x; {LEARNING}#Pattern (did you mean {LEARNING}#pattern?).") in err
    # judgments it holds: no warning
    qrels.write_text(f"q1\t{LEARNING}#pattern\t1\nq2\t{TRADE}#review\t1\n")
    code, out, err = rag("eval", "--queries", str(queries), "--qrels", str(qrels))
    assert code == 0 and "warning" not in err and "unknown_units" not in out


def test_validate_is_a_dry_run_that_fails_on_problems(rag, corpus_copy):
    root = corpus_copy(LEARNING, MALFORMED)
    code, out, _ = rag("validate", str(root / LEARNING), "--root", str(root), "--json")
    assert code == 0
    report = json.loads(out)
    assert report["problems"] == 0 and report["files"][0]["chunks"] > 0
    assert report["files"][0]["max_tokens"] <= 254
    code, out, _ = rag("validate", str(root), "--json")
    assert code == 1
    bad = [f for f in json.loads(out)["files"] if f.get("problem")]
    assert bad[0]["path"] == MALFORMED and "line 153" in bad[0]["problem"]
    code, out, _ = rag("status", "--json")
    assert json.loads(out)["documents"] == 0  # nothing was written


def test_reset_deletes_everything(rag, corpus_copy):
    rag("ingest", str(corpus_copy(LEARNING)))
    code, out, _ = rag("reset", "--yes")
    assert code == 0
    _, out, _ = rag("status", "--json")
    assert json.loads(out)["documents"] == 0


def test_validate_and_status_name_documents_published_under_other_chunking_settings(rag, tmp_path, monkeypatch):
    """After chunking.max_tokens changed, `rag validate` said "no problems" and `rag status` nothing
    while searches served the old chunks (and a part-finished ingest left a mix of both)."""
    root = tmp_path / "desk"
    root.mkdir()
    body = " ".join(f"Rates sentence {n} on the curve and credit spreads." for n in range(40))
    (root / "rates.md").write_text(f"# Rates\n\n## Outlook\n\n{body}\n")
    (root / "fx.md").write_text("# FX\n\n## Dollar\n\nThe dollar view.\n")
    assert rag("ingest", str(root))[0] == 0
    assert rag("validate")[0] == 0

    monkeypatch.setenv("RAG_CHUNKING__MAX_TOKENS", "64")
    code, out, _ = rag("validate", "--json")
    stale = json.loads(out)["documents_with_other_settings"]
    assert code == 1 and stale == {"count": 2, "ids": ["default:fx.md", "default:rates.md"]}
    code, out, _ = rag("validate")
    assert code == 1 and "2 documents were published under other settings" in " ".join(out.split())
    assert "rag reembed --all" in out
    code, out, _ = rag("status")
    assert "2 documents were published under other settings" in " ".join(out.split())
    assert json.loads(rag("status", "--json")[1])["documents_with_other_settings"] == 2

    assert rag("ingest", str(root))[0] == 0  # publishes both again under today's settings
    code, out, _ = rag("validate", "--json")
    assert code == 0 and json.loads(out)["documents_with_other_settings"]["count"] == 0
    assert "other settings" not in rag("status")[1]


def test_status_says_when_the_settings_name_another_embedding_space_than_the_active_one(rag, tmp_path, monkeypatch):
    """After `rag reembed --to` switched spaces, or embedding settings changed, status said nothing
    while every ingest was refused."""
    (tmp_path / "fx.md").write_text("# FX\n\n## Dollar\n\nThe dollar view.\n")
    assert rag("ingest", str(tmp_path / "fx.md"))[0] == 0
    monkeypatch.setenv("RAG_EMBEDDING__MODEL", "rotated-minilm")
    out = " ".join(rag("status")[1].split())
    assert ("the settings name embedding space rotated-minilm:384, not the active all-MiniLM-L6-v2:384: ingests are "
            "refused until they match (`rag reembed --to rotated-minilm:384`, or set embedding.provider local, "
            "model all-MiniLM-L6-v2, dimensions 384)") in out


def test_an_empty_database_is_named_with_how_to_point_at_another(rag, tmp_path, database_url):
    """Run from another folder without RAG_HOME, rag opened a new empty `.rag` database and said only
    "collection 'default' holds no documents", as if the knowledge base had been lost."""
    code, out, _ = rag("search", "NVDA bull case")
    said = " ".join(out.split())
    assert code == 0 and "holds no documents at all" in said and "point RAG_HOME at" in said and "RAG_DATABASE_URL" in said
    assert database_url.split("@")[-1].split("?")[0] in said  # which database it opened
    assert "holds no documents at all" in " ".join(rag("status")[1].split())
    assert "holds no documents at all" in " ".join(rag("list")[1].split())

    (tmp_path / "fx.md").write_text("# FX\n\n## Dollar\n\nThe dollar view.\n")
    assert rag("ingest", str(tmp_path / "fx.md"), "--collection", "desk")[0] == 0
    code, out, _ = rag("search", "NVDA bull case")  # the default collection is empty, the database is not
    assert "holds no documents" in out and "at all" not in out and "RAG_HOME" not in out


def test_a_command_that_loses_the_database_says_so_in_one_line(rag, monkeypatch):
    """`rag reembed` with the server stopped mid-fill ended in "error: unexpected PoolTimeout: couldn't get a
    connection after 30.00 sec (for the traceback: ...)", as if rag had a bug."""
    from psycopg_pool import PoolTimeout

    from rag_lib.store import Store

    def gone(self, *args, **kwargs):
        raise PoolTimeout("couldn't get a connection after 30.00 sec")

    monkeypatch.setattr(Store, "list_spaces", gone)
    code, _, err = rag("reembed", "--status")
    assert code == 1 and "unexpected" not in err and "Traceback" not in err
    assert " ".join(err.split()) == (
        "error: the database stopped answering (PoolTimeout); what was re-embedded so far is kept whole (each batch "
        "or document is one transaction) and the active space keeps serving; run the same command again to resume; "
        "start the database first (`rag db start`, or the server of RAG_DATABASE_URL)")


def test_db_status_reports_an_external_database(rag):
    code, out, _ = rag("db", "status", "--json")
    assert code == 0 and json.loads(out) == {**json.loads(out), "embedded": False, "running": True}


def test_db_status_says_an_external_database_that_does_not_answer_is_not_running(rag, tmp_path, monkeypatch):
    """It read the setting only: "external server running" (exit 0) for a server that was down."""
    monkeypatch.setenv("RAG_DATABASE_URL", f"postgresql://rag_app:s3cret@/rag?host={tmp_path / 'no-server'}")
    code, out, _ = rag("db", "status", "--json")
    data = json.loads(out)
    assert code == 3 and data["embedded"] is False and data["running"] is False
    assert "no-server" in data["error"] and "s3cret" not in out
    code, out, _ = rag("db", "status")
    assert code == 3 and out.startswith("external server at ") and "does not answer" in out and "s3cret" not in out


@pytest.mark.subprocess
def test_installed_entry_point_prints_no_traceback(database_url, tmp_path):
    env = {**os.environ, "RAG_DATABASE_URL": database_url, "RAG_HOME": str(tmp_path)}
    rag_bin = Path(sys.executable).parent / "rag"
    proc = subprocess.run([str(rag_bin), "show", "nothing"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: no document 'nothing'")
    assert "Traceback" not in proc.stderr


def test_embed_alias_and_reindex(rag, corpus_copy):
    code, out, _ = rag("embed", str(corpus_copy(LEARNING)), "--json")
    assert code == 0 and json.loads(out)["new"] == 1
    code, out, _ = rag("reindex", "--json")
    info = json.loads(out)
    assert code == 0 and info["created"] is True and info["rows"] == json.loads(rag("status", "--json")[1])["chunks"]


def test_validate_reports_a_file_that_crashes_the_parser_and_goes_on(rag, corpus_copy):
    root = corpus_copy(LEARNING)
    deep = root / "aaa-deep.yaml"  # nested 5,000 levels deep: generated here, never committed
    deep.write_text("_meta:\n  type: learning\n  id: deep\nsummary: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n")
    code, out, _ = rag("validate", str(root), "--json")
    assert code == 1
    files = {f["path"]: f for f in json.loads(out)["files"]}
    assert files["aaa-deep.yaml"]["problem"]
    assert not files[LEARNING].get("problem") and files[LEARNING]["chunks"] > 0


def test_a_mistyped_document_path_is_answered_with_the_closest_ones(rag, corpus_copy):
    assert rag("ingest", str(corpus_copy(LEARNING)))[0] == 0
    path = LEARNING  # stored relative to the root ingested
    for typed in (path.replace("learnings", "learnigns"), path.rsplit("/", 1)[-1], path.replace(".yaml", "x.yaml")):
        code, _, err = rag("show", typed)
        assert code == 1 and f"(did you mean {path}?)" in err, err
    code, _, err = rag("delete", path.replace("learnings", "learnigns"))
    assert code == 1 and f"(did you mean {path}?)" in err
    code, _, err = rag("show", "nothing-like-it.md")
    assert code == 1 and "did you mean" not in err


def test_ingest_without_prune_names_the_documents_a_rename_left_behind(rag, tmp_path):
    """A renamed note re-ingested without --prune: its old document is still served (duplicate hits);
    the run says so, names it and the flag that deletes it, and deletes nothing."""
    root = tmp_path / "notes"
    root.mkdir()
    (root / "copper.md").write_text("# Copper\n\n## Thesis\n\nThe desk is long copper into the strike.\n")
    (root / "other.md").write_text("# Other\n\n## Body\n\nNothing to do with metals.\n")
    assert rag("ingest", str(root))[0] == 0
    (root / "copper.md").rename(root / "copper-2026.md")
    code, out, _ = rag("ingest", str(root))
    assert code == 0
    flat = " ".join(out.split())
    assert "still served though their files are gone: copper.md; run the same command with --prune" in flat, out
    code, out, _ = rag("ingest", str(root), "--json")
    assert json.loads(out)["stale"] == ["copper.md"] and json.loads(out)["pruned"] == []
    code, out, _ = rag("ingest", str(root), "--prune", "--json")
    assert json.loads(out)["pruned"] == ["copper.md"] and json.loads(out)["stale"] == []
    code, out, _ = rag("ingest", str(root))
    assert "still served" not in out


def test_prune_keeps_a_folder_that_lists_no_files_until_told_with_the_command_it_names(rag, tmp_path):
    """An unmounted mount point is an empty folder: `rag ingest --prune` used to delete all of its
    documents. It keeps them and names, in one warning line, the command that deletes them on purpose."""
    import logging
    import shlex

    root = tmp_path / "mnt"
    (root / "sub").mkdir(parents=True)
    for rel in ("a.md", "b.md", "sub/c.md"):
        (root / rel).write_text(f"# {rel}\n\n## Body\n\nThe desk's note {rel} on copper.\n")
    assert rag("ingest", str(root))[0] == 0
    (root / "b.md").unlink()  # some files deleted: pruned as before
    code, out, _ = rag("ingest", str(root), "--prune", "--json")
    assert code == 0 and json.loads(out)["pruned"] == ["b.md"]

    for rel in ("a.md", "sub/c.md"):  # the mount point, unmounted: an empty folder
        (root / rel).unlink()
    (root / "sub").rmdir()
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("rag_lib.ingest.run").addHandler(handler)
    try:
        code, out, _ = rag("ingest", str(root), "--prune", "--json")
    finally:
        logging.getLogger("rag_lib.ingest.run").removeHandler(handler)
    assert code == 0 and json.loads(out)["pruned"] == []
    (line,) = [w for w in warnings if "lists no files" in w]
    assert line.startswith(f"kept 2 document(s) of {root} (collection 'default'): the folder lists no files at all")
    assert "unmounted disk" in line
    code, out, _ = rag("show", "a.md", "--json")
    assert code == 0

    command = shlex.split(line.split("delete their documents with: ")[1])
    assert command == ["rag", "ingest", str(root), "--collection", "default", "--prune-empty"]
    code, out, _ = rag(*command[1:], "--json")
    assert code == 0 and sorted(json.loads(out)["pruned"]) == ["a.md", "sub/c.md"]


@pytest.mark.subprocess
def test_ctrl_c_during_ingest_keeps_whole_documents_and_says_how_to_resume(rag, database_url, corpus_copy, tmp_path):
    import signal
    import time

    import psycopg

    root = corpus_copy("tradegent-docs/.claude")
    # The copied files' vectors are cached, so they publish at once; the model has to embed this one
    # (text seen nowhere else, listed last), so the ingest is still running when it is interrupted.
    (root / "zz_desk_log.md").write_text("# Desk log\n\n" + "\n\n".join(
        f"## Session {n}\n\n" + " ".join(f"Session {n} note {m}: the desk sized position {n * 31 + m} in "
                                          f"contract {m * 17 + n} after the open." for m in range(12))
        for n in range(40)))
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    env = {**os.environ, "RAG_DATABASE_URL": database_url, "RAG_HOME": str(tmp_path / "child")}
    rag_bin = Path(sys.executable).parent / "rag"
    # its own process group, as a terminal's Ctrl-C signals the whole foreground group
    proc = subprocess.Popen([str(rag_bin), "ingest", str(root)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    with psycopg.connect(database_url, autocommit=True) as conn:
        def published() -> int:
            return conn.execute("SELECT count(*) FROM rag_documents").fetchone()[0]

        while proc.poll() is None and published() == 0:  # interrupted once it has started publishing
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        interrupted_at = time.monotonic()
        _, err = proc.communicate(timeout=120)
        stopped_in = time.monotonic() - interrupted_at
        kept = published()
        # every document is whole: its chunks all there, each with its vector
        partial = conn.execute(
            """SELECT d.path FROM rag_documents d
               LEFT JOIN rag_chunks c ON c.collection = d.collection AND c.path = d.path
               LEFT JOIN rag_chunk_vectors v USING (chunk_id)
               GROUP BY d.path, d.chunk_count HAVING count(c.chunk_id) <> d.chunk_count
                  OR count(v.chunk_id) <> d.chunk_count""").fetchall()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    line = err.strip()
    assert "\n" not in line and line.startswith("interrupted: rag ingest stopped"), err
    assert "stay published" in line and "run the same command again" in line
    assert 0 < kept < len(files) and partial == []
    assert stopped_in < 30, f"the ingest took {stopped_in:.1f} s to stop after Ctrl-C"

    code, out, _ = rag("validate", "--json")
    assert code == 0 and json.loads(out)["problems"] == 0
    code, out, _ = rag("ingest", str(root), "--json")
    report = json.loads(out)
    assert code == 0 and report["failed"] == 0
    assert report["unchanged"] == kept and report["new"] == len(files) - kept


def test_status_lists_only_failures_not_fixed_since(rag, tmp_path):
    first, second = tmp_path / "desk_a", tmp_path / "desk_b"
    for folder, metal in ((first, "lithium"), (second, "copper")):
        folder.mkdir()
        (folder / "notes.md").write_text(f"# Notes\n\n## Metals\n\nThe desk watches {metal} supply.\n")
    assert rag("ingest", str(first), "-c", "desk")[0] == 0
    assert rag("ingest", str(second), "-c", "desk")[0] == 1  # the same document path from another file
    failures = json.loads(rag("status", "--json")[1])["failures"]
    assert [f["partition"] for f in failures] == ["notes.md"]

    (first / "notes.md").unlink()  # fixed: the file moved, so desk_b's takes the document over
    assert rag("ingest", str(second), "-c", "desk")[0] == 0
    code, out, _ = rag("status", "--json")
    status = json.loads(out)
    assert code == 0 and status["failures"] == [] and status["failures_fixed"] == 1
    code, out, _ = rag("status")
    assert "recent pipeline failures" not in out
    assert "1 earlier file failures are fixed" in out


def test_a_jsonl_file_of_repeated_ids_is_a_few_rows_in_the_tables_and_whole_in_json(rag, tmp_path, monkeypatch):
    """2,000 records on 10 ids (1,990 `duplicate_id` skips, one a line) and 40 unreadable lines: the
    ingest's and status's tables give each file and reason one row (the count, the first lines, the
    first detail), where they gave a row a line; --json and the log still name every line."""
    import logging

    root = tmp_path / "beir"
    root.mkdir()
    lines = [json.dumps({"_id": f"r{n % 10}", "text": f"Record {n} on copper supply."}) for n in range(2000)]
    lines += ["{not json"] * 40
    (root / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    (root / "other.jsonl").write_text('{"_id": "a", "text": "x"}\n{"_id": "a", "text": "y"}\n')  # one: a row as before

    code, out, _ = rag("ingest", str(root), "--json")
    files = json.loads(out)["files"]
    duplicates = [f["path"] for f in files if f["reason"] == "duplicate_id"]
    assert code == 0 and len(duplicates) == 1991 and "corpus.jsonl:11" in duplicates and "other.jsonl:2" in duplicates
    assert sum(f["reason"] == "malformed_json" for f in files) == 40

    logged: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("rag_lib.cli").addHandler(handler)
    monkeypatch.setenv("RAG_LOG_LEVEL", "INFO")
    try:
        code, out, _ = rag("ingest", str(root))  # unchanged: its skips are reported again
    finally:
        logging.getLogger("rag_lib.cli").removeHandler(handler)
        monkeypatch.delenv("RAG_LOG_LEVEL")
    flat = re.sub(r"[│┃\s]+", " ", out)  # a cell's lines joined (only the detail column wraps)
    assert code == 0 and len(out.splitlines()) < 40, out
    assert "1990 records (lines 11, 12, 13, 14, 15 and 1,985 more); first: line 11: _id 'r0' is already used on line 1" in flat
    assert "40 records (lines 2001, 2002" in flat and "other.jsonl:2" in flat and "--json lists every one" in flat
    (line,) = [m for m in logged if m.startswith("corpus.jsonl: 1990 records")]
    assert line.startswith("corpus.jsonl: 1990 records skipped as duplicate_id: lines 11, 12, 13,") and line.endswith(", 2000")

    code, out, _ = rag("status")
    table = out.split("skipped inputs")[1].split("embedding usage")[0]
    assert code == 0 and len(table.splitlines()) < 25, out
    assert "1990 records (lines 11, 12, 13, 14, 15 and 1,985 more)" in re.sub(r"[│┃\s]+", " ", table)
    skipped = json.loads(rag("status", "--json")[1])["skipped"]
    assert sum(s["reason"] == "duplicate_id" for s in skipped) == 1991 and len(skipped) == 2031


def test_status_names_files_served_from_an_older_version_and_what_to_do(rag, tmp_path):
    """A file whose newest edit is malformed is skipped, and its last good version is still served:
    `rag status` (text and --json) names the file, why, what is served (a JSONL file: its records)
    and what to do; fixed and ingested again, or deleted, it is no longer listed. A JSONL file with
    some bad lines serves its good ones as they are now: not listed."""
    root = tmp_path / "desk"
    root.mkdir()
    (root / "copper.yaml").write_text("_meta:\n  type: research\nthesis: The desk is long copper.\n")
    (root / "beir.jsonl").write_text("".join(json.dumps({"_id": f"d{n}", "text": f"Record {n} on rates."}) + "\n"
                                             for n in range(7)))
    (root / "mixed.jsonl").write_text('{"_id": "m1", "text": "Tin."}\n{"_id": "m2", "text": "Zinc."}\n')
    assert rag("ingest", str(root))[0] == 0
    assert json.loads(rag("status", "--json")[1])["held"] == []

    (root / "copper.yaml").write_text("_meta:\n  type: research\nthesis: [The desk is long copper.\n")
    (root / "beir.jsonl").write_text("{broken\n" * 3)  # every record unreadable
    (root / "mixed.jsonl").write_text('{"_id": "m1", "text": "Tin, revised."}\n{broken\n')
    code, out, _ = rag("ingest", str(root))
    # the ingest itself says so: "skipped" alone read as if the file were left out
    assert code == 0 and "served from an older version (the newest edit is skipped, the last good version stays " \
        "live): beir.jsonl, copper.yaml; fix and ingest again" in out
    assert "still served though their files are gone" not in out  # their files are there, unreadable
    code, out, _ = rag("ingest", str(root), "--json", "--prune")
    report = json.loads(out)
    # a prune (the sensor's too) keeps the records of a file whose lines can't be read: it deleted all seven
    assert code == 0 and report["held"] == ["beir.jsonl", "copper.yaml"] and report["pruned"] == []
    code, out, _ = rag("status", "--json")
    held = {h["path"]: h for h in json.loads(out)["held"]}
    assert code == 0 and sorted(held) == ["beir.jsonl", "copper.yaml"]
    assert held["copper.yaml"]["reason"] == "malformed_yaml" and held["copper.yaml"]["documents"] == 1
    assert held["copper.yaml"]["action"] == ("fix copper.yaml and run rag ingest on it again, or delete what is "
                                             "served: rag delete copper.yaml --collection default")
    beir = held["beir.jsonl"]
    assert beir["reason"] == "malformed_json" and beir["detail"].startswith("line 1: ")
    assert beir["documents"] == 7 and beir["examples"] == [f"beir.jsonl#d{n}" for n in range(5)]
    code, out, _ = rag("status")
    lines = out.split("served from an older version (2; the newest edit is skipped):\n")[1].splitlines()
    assert lines[0].startswith("  beir.jsonl (default): malformed_json: line 1: ") and lines[0].endswith(
        "; serves 7 documents: beir.jsonl#d0, beir.jsonl#d1, beir.jsonl#d2, beir.jsonl#d3, beir.jsonl#d4 and 2 more; "
        "fix beir.jsonl and run rag ingest on it again, or delete what is served: rag delete beir.jsonl --collection default")
    assert lines[1].startswith("  copper.yaml (default): malformed_yaml: ") and "; serves its 1 document; fix" in lines[1]

    (root / "copper.yaml").write_text("_meta:\n  type: research\nthesis: The desk is short copper.\n")
    assert rag("ingest", str(root))[0] == 0
    assert rag("delete", "beir.jsonl")[0] == 0
    code, out, _ = rag("status", "--json")
    assert code == 0 and json.loads(out)["held"] == []
    assert "served from an older version" not in rag("status")[1]


def test_a_tokenizer_path_without_a_readable_tokenizer_is_one_line_naming_the_setting(rag, tmp_path, monkeypatch):
    """embedding.tokenizer_path naming a missing folder, or one whose tokenizer.json is not one: a
    command that needs the chunker's version says which setting, which path and what to do, in one
    line (it said "cannot load tokenizer from PATH", naming no setting)."""
    import rag_lib.api
    import rag_lib.embedding

    broken = tmp_path / "tokenizer"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    monkeypatch.setenv("RAG_EMBEDDING__PROVIDER", "openai_compatible")
    monkeypatch.setenv("RAG_EMBEDDING__BASE_URL", "http://127.0.0.1:9/v1")
    note = tmp_path / "corpus" / "note.md"
    note.parent.mkdir()
    note.write_text("# Desk\n\n## Copper\n\nThe desk is long copper.\n")
    for path in (tmp_path / "missing", broken):
        monkeypatch.setenv("RAG_EMBEDDING__TOKENIZER_PATH", str(path))
        # `rag validate PATH` chunks as ingest does, so it stops as ingest does (it chunked with the
        # local model's tokenizer and passed)
        with monkeypatch.context() as configured:  # the provider the settings name, not the fixture's local one
            configured.setattr(rag_lib.api, "get_provider", rag_lib.embedding.get_provider)
            ingested = rag("ingest", str(note.parent))
        assert rag("validate", str(note.parent)) == ingested
        code, out, err = rag("status")
        assert code == 1 and not out and err.count("\n") == 1, err
        assert err.startswith(f"error: embedding.tokenizer_path of openai_compatible/all-MiniLM-L6-v2:384 ({path}): "
                              "no tokenizer.json readable there ("), err
        assert err.rstrip().endswith("point it at the folder of the remote model's Hugging Face tokenizer, or "
                                     "remove it to count tokens with the local model's tokenizer (an estimate)")
