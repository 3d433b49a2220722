"""What keeps a search's cost bounded as the corpus grows (issue 32): full-text candidates are capped
for common and rare terms alike, and a repeated query is not encoded again."""

from __future__ import annotations


def _holds(kb, chunk_ids: list[str], tsquery: str) -> set[str]:
    with kb.store.db.connection() as conn:
        rows = conn.execute("SELECT chunk_id FROM rag_chunks WHERE chunk_id = ANY(%s) AND tsv @@ %s::tsquery",
                            (chunk_ids, tsquery)).fetchall()
    return {r[0] for r in rows}


def _df(kb, lexeme: str) -> int:
    with kb.store.db.connection() as conn:
        return conn.execute("SELECT count(*) FROM rag_chunks WHERE collection = 'default' AND tsv @@ %s::tsquery",
                            (f"'{lexeme}'",)).fetchone()[0]


def test_common_words_only_score_a_bounded_set_of_rows_holding_all_of_them(corpus_kb):
    lexemes = corpus_kb.store.query_lexemes("stock price", "english")
    assert lexemes == ["stock", "price"] and min(_df(corpus_kb, lex) for lex in lexemes) > 20
    corpus_kb.settings.search.lexical_max_candidates = 20
    hits = corpus_kb.search("stock price", mode="lexical", top_k=100, group=False).hits
    # before: every row holding the rarer word was scored (and returned, up to top_k)
    assert 0 < len(hits) <= 20
    ids = [h.chunk_id for h in hits]
    assert _holds(corpus_kb, ids, "'stock' & 'price'") == set(ids)  # those holding both rank highest


def test_one_common_word_scores_at_most_the_cap(corpus_kb):
    assert _df(corpus_kb, "stock") > 20
    corpus_kb.settings.search.lexical_max_candidates = 20
    assert len(corpus_kb.search("stock", mode="lexical", top_k=100, group=False).hits) == 20


def test_rare_terms_still_select_every_row_holding_them(corpus_kb):
    rare = _df(corpus_kb, "rvol")
    assert 0 < rare <= 2000
    hits = corpus_kb.search("rvol", mode="lexical", top_k=1000, group=False).hits
    assert len(hits) == rare


def test_a_repeated_query_is_encoded_once(corpus_kb):
    provider = corpus_kb.provider
    before = provider.calls
    corpus_kb.search("gap fill after earnings", mode="hybrid")
    cached = corpus_kb.search("gap fill after earnings", mode="semantic")
    assert provider.calls == before + 1  # the second search took the vector from the query cache
    corpus_kb.settings.search.query_cache_size = 0
    encoded = corpus_kb.search("gap fill after earnings", mode="semantic")
    assert provider.calls == before + 2  # off: every search encodes
    assert [(h.chunk_id, h.similarity) for h in cached.hits] == [(h.chunk_id, h.similarity) for h in encoded.hits]
