-- Knowledge graph in plain tables beside the vectors: nodes (entities, documents, tickers, types,
-- dates) and edges with provenance (the document and section that state them). A document's edges
-- are written in the transaction that publishes its chunks and go with the document (ON DELETE
-- CASCADE); nodes no edge references are removed in the same transaction.
CREATE TABLE rag_graph_nodes (
    collection  text NOT NULL,
    key         text NOT NULL,      -- doc:<path> | ticker:<SYM> | doc_type:<t> | date:<d> | <entity name>
    kind        text NOT NULL,      -- doc | ticker | doc_type | date | bias | strategy | ... | entity
    label       text NOT NULL,      -- the name as first written
    PRIMARY KEY (collection, key)
);
CREATE INDEX rag_graph_nodes_kind ON rag_graph_nodes (collection, kind);

CREATE TABLE rag_graph_edges (
    id          bigserial PRIMARY KEY,
    collection  text NOT NULL,
    path        text NOT NULL,      -- provenance: the document stating the fact
    section     text NOT NULL,      -- provenance: _graph | _links | _meta | the section naming a ticker
    src         text NOT NULL,
    predicate   text NOT NULL,
    dst         text NOT NULL,
    role        text,               -- the _links key (analysis, strategy, ...) of a links_to edge
    doc_hash    text NOT NULL,      -- content hash of the document version the edge came from
    UNIQUE (collection, path, src, predicate, dst),
    FOREIGN KEY (collection, path) REFERENCES rag_documents (collection, path) ON DELETE CASCADE,
    FOREIGN KEY (collection, src) REFERENCES rag_graph_nodes (collection, key),
    FOREIGN KEY (collection, dst) REFERENCES rag_graph_nodes (collection, key)
);
CREATE INDEX rag_graph_edges_src ON rag_graph_edges (collection, src) INCLUDE (predicate, dst);
CREATE INDEX rag_graph_edges_dst ON rag_graph_edges (collection, dst) INCLUDE (predicate, src);
CREATE INDEX rag_graph_edges_predicate ON rag_graph_edges (collection, predicate);
