-- One node per real thing. A document names nodes in several spellings (`loss_aversion`,
-- `loss-aversion`; a ticker's company name; a trade's id for its journal): each spelling is kept
-- here, with the document stating it, so resolution can find the node by any of them and show them.
-- They go with the document (ON DELETE CASCADE), like its edges.
CREATE TABLE rag_graph_aliases (
    collection  text NOT NULL,
    path        text NOT NULL,      -- provenance: the document giving the name
    alias       text NOT NULL,      -- the normalised spelling (lower case, `-` for spaces/underscores)
    key         text NOT NULL,      -- the node it names
    spelling    text NOT NULL,      -- as written
    PRIMARY KEY (collection, path, alias, key),
    FOREIGN KEY (collection, path) REFERENCES rag_documents (collection, path) ON DELETE CASCADE
);
CREATE INDEX rag_graph_aliases_alias ON rag_graph_aliases (collection, alias);
CREATE INDEX rag_graph_aliases_key ON rag_graph_aliases (collection, key);

-- Entity linking: one profile per ticker (company name, sector, industry, products, themes,
-- catalysts, built from the corpus), embedded in an embedding space; questions that describe a
-- company instead of naming it are matched against these vectors. Rebuilt when the documents behind
-- them change; `source_hash` identifies those documents' versions.
CREATE TABLE rag_ticker_profiles (
    collection   text        NOT NULL,
    ticker       text        NOT NULL,
    space        text        NOT NULL,
    dimensions   integer     NOT NULL,
    text         text        NOT NULL,
    source_hash  text        NOT NULL,
    sources      text[]      NOT NULL,   -- the documents' paths
    embedding    vector      NOT NULL,
    hubness      real        NOT NULL DEFAULT 0,  -- mean cosine to its nearest chunks (CSLS correction)
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (collection, ticker, space),
    CHECK (vector_dims(embedding) = dimensions)
);
