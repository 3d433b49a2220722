"""Asset checks on `knowledge_graph`: thin glue from `rag_lib.graph.checks` results (over the whole
graph in Postgres, once per run) to AssetCheckResult."""


from dagster import AssetCheckExecutionContext, AssetCheckResult, asset_check

from pipelines.checks import to_check_result
from pipelines.graph_assets import knowledge_graph
from pipelines.resources import RagResource


@asset_check(asset=knowledge_graph, description="`_links` pointing to files that are not in the corpus (warning, listed).")
def graph_dangling_links(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return to_check_result(rag.kb().graph_check("dangling_links"))


@asset_check(asset=knowledge_graph, description="Graph nodes no edge references any more (error).")
def graph_orphan_nodes(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return to_check_result(rag.kb().graph_check("orphan_nodes"))


@asset_check(asset=knowledge_graph,
             description="Graph edges written from another version of their document than the live one (error).")
def graph_stale_edges(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return to_check_result(rag.kb().graph_check("stale_edges"))


@asset_check(asset=knowledge_graph,
             description="Graph nodes that look like one thing under two names (warning, listed).")
def graph_duplicate_nodes(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return to_check_result(rag.kb().graph_check("duplicate_nodes"))


@asset_check(asset=knowledge_graph,
             description="Nodes per entity type and edges per predicate as metadata, with a sample of triples.")
def graph_counts(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return to_check_result(rag.kb().graph_check("counts"))


GRAPH_CHECKS = [graph_dangling_links, graph_orphan_nodes, graph_stale_edges, graph_duplicate_nodes, graph_counts]
