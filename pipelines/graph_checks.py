"""Asset checks on `knowledge_graph`: thin glue from `rag_lib.graph.checks` results (over the whole
graph in Postgres, once per run) to AssetCheckResult. A run computes them ahead once its stages are
done (pipelines.assets.after_stages); each step reports its result."""


from dagster import AssetCheckExecutionContext, AssetCheckResult, asset_check

from pipelines.checks import to_check_result
from pipelines.graph_assets import knowledge_graph
from pipelines.resources import RagResource


def graph_check(rag: RagResource, name: str) -> AssetCheckResult:
    """The library's graph check `name`, or its result computed ahead in this run."""
    return to_check_result(rag.after(f"graph_check:{name}", lambda: rag.kb().graph_check(name)))


@asset_check(asset=knowledge_graph, description="`_links` pointing to files that are not in the corpus (warning, listed).")
def graph_dangling_links(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return graph_check(rag, "dangling_links")


@asset_check(asset=knowledge_graph, description="Graph nodes no edge references any more (error).")
def graph_orphan_nodes(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return graph_check(rag, "orphan_nodes")


@asset_check(asset=knowledge_graph,
             description="Graph edges written from another version of their document than the live one (error).")
def graph_stale_edges(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return graph_check(rag, "stale_edges")


@asset_check(asset=knowledge_graph,
             description="Graph nodes that look like one thing under two names (warning, listed).")
def graph_duplicate_nodes(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return graph_check(rag, "duplicate_nodes")


@asset_check(asset=knowledge_graph,
             description="Nodes per entity type and edges per predicate as metadata, with a sample of triples.")
def graph_counts(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return graph_check(rag, "counts")


GRAPH_CHECKS = [graph_dangling_links, graph_orphan_nodes, graph_stale_edges, graph_duplicate_nodes, graph_counts]
