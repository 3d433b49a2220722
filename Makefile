# Two entry points: `make demo` (ingest the demo corpus and search it) and `make test`.
# Each creates .venv when missing and installs the project into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# The suite writes bytecode (gitignored __pycache__) even where the environment says not to: else
# every session rewrites and compiles each test module again, and every `rag` child compiles rag_lib.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-fast install clean test-external-pg test-vectors settings-doc

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The ingest runs through Dagster on the Postgres-backed instance (one run, all seven assets and
# their checks); `rag dev` afterwards shows the run, checks and lineage in the UI.
# The demo's evaluation set (examples/eval) feeds the retrieval_quality check after hnsw_index.
DEMO_EVAL := RAG_EVAL__QUERIES=$(CURDIR)/examples/eval/queries.jsonl RAG_EVAL__QRELS=$(CURDIR)/examples/eval/qrels.tsv \
             RAG_EVAL__NDCG_FLOOR=0.5

demo: $(STAMP)
	$(DEMO_EVAL) $(BIN)/rag materialize examples/corpus
	$(BIN)/rag status
	$(BIN)/rag search "NVDA bull case" --mode hybrid --top-k 3
	$(BIN)/rag search "which trades hit their stop" --doc-type trade-journal --top-k 3

test: $(STAMP)
	$(BIN)/pytest -q -n 2 --dist loadfile

# The suite without the tests that start child processes or run Dagster (markers in pyproject.toml).
test-fast: $(STAMP)
	$(BIN)/pytest -q -n 2 --dist loadfile -m "not slow and not subprocess"

# Also part of `make test`: ingest, search and a Dagster run against a standalone PostgreSQL under a
# non-superuser role, PgBouncer (skipped without the `pgbouncer` package) and a streaming replica.
test-external-pg: $(STAMP)
	$(BIN)/pytest -q tests/test_external_pg.py

# Refresh tests/data's copy of the shared corpus's vectors (after a change of model, chunking or the
# cache table): the suite's corpus template loads it on a fresh clone instead of encoding ~3,200 chunks.
VECTORS := tests/data/shared-corpus-vectors
test-vectors: $(STAMP)
	rm -rf $(VECTORS) .pytest_cache/d/shared-corpus-vectors
	$(BIN)/pytest -q -p no:xdist tests/test_eval_kb.py -k dev_set_hybrid_beats_single_modes
	mkdir -p $(VECTORS)
	for f in .pytest_cache/d/shared-corpus-vectors/*.copy; do gzip -9 -n -c $$f > $(VECTORS)/$$(basename $$f).gz; done

# docs/settings.md from rag_lib/config.py (a field's comment is its description); a test fails when it is stale
settings-doc: $(STAMP)
	$(BIN)/rag config --markdown > docs/settings.md

clean:
	rm -rf .rag
