"""Asset checks on `knowledge_graph`: thin glue from `rag_lib.graph.checks` results (over the whole
graph in Postgres, once per run) to AssetCheckResult. A run computes them ahead once its stages are
done (pipelines.assets.after_stages); each step reports its result."""


from dagster import AssetCheckExecutionContext, AssetCheckResult, asset_check

from pipelines.checks import to_check_result
from pipelines.graph_assets import knowledge_graph
from pipelines.resources import RagResource
from rag_lib.graph.checks import GRAPH_CHECKS as LIBRARY_CHECKS


def graph_check(rag: RagResource, name: str) -> AssetCheckResult:
    """The library's graph check `name`, or its result computed ahead in this run."""
    return to_check_result(rag.after(f"graph_check:{name}", lambda: rag.kb().graph_check(name)))


# The UI's text for each of the library's graph checks (rag_lib.graph.checks.GRAPH_CHECKS): a check
# added there without one fails this module's import.
DESCRIPTIONS = {
    "dangling_links": "`_links` pointing to files that are not in the corpus (warning, listed).",
    "orphan_nodes": "Graph nodes no edge references any more (error).",
    "stale_edges": "Graph edges written from another version of their document than the live one (error).",
    "duplicate_nodes": "Graph nodes that look like one thing under two names (warning, listed).",
    "counts": "Nodes per entity type and edges per predicate as metadata, with a sample of triples.",
}


def _graph_asset_check(name: str):
    """The asset check `graph_<name>` on knowledge_graph, reporting the library's check `name`."""

    @asset_check(asset=knowledge_graph, name=f"graph_{name}", description=DESCRIPTIONS[name])
    def check(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
        return graph_check(rag, name)

    return check


GRAPH_CHECKS = [_graph_asset_check(name) for name in LIBRARY_CHECKS]
