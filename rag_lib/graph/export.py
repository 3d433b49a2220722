"""The graph as text for other tools: Cypher statements for Neo4j, GraphML for Gephi / yEd / NetworkX."""

from __future__ import annotations

import json
import re
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from rag_lib.errors import ValidationError

FORMATS = ("cypher", "graphml")


def _label(kind: str) -> str:
    """A Cypher label from a node kind (`doc_type` → `DocType`)."""
    return "".join(p.capitalize() for p in re.split(r"[^A-Za-z0-9]+", kind) if p) or "Entity"


def _rel(predicate: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", predicate).upper() or "RELATED_TO"


def to_cypher(nodes: list[dict[str, Any]], edges: list[dict[str, Any]]) -> str:
    """MERGE statements (safe to run twice): nodes keyed by `key`, edges carrying their provenance."""
    lines = ["CREATE CONSTRAINT rag_node_key IF NOT EXISTS FOR (n:RagNode) REQUIRE n.key IS UNIQUE;"]
    for n in nodes:
        lines.append(f"MERGE (n:RagNode {{key: {json.dumps(n['key'])}}}) SET n:{_label(n['kind'])}, "
                     f"n.kind = {json.dumps(n['kind'])}, n.label = {json.dumps(n['label'])};")
    for e in edges:
        props = {"path": e["path"], "section": e["section"]}
        if e.get("role"):
            props["role"] = e["role"]
        body = ", ".join(f"{k}: {json.dumps(v)}" for k, v in props.items())
        lines.append(f"MATCH (a:RagNode {{key: {json.dumps(e['src'])}}}), (b:RagNode {{key: {json.dumps(e['dst'])}}}) "
                     f"MERGE (a)-[:{_rel(e['predicate'])} {{{body}}}]->(b);")
    return "\n".join(lines) + "\n"


def to_graphml(nodes: list[dict[str, Any]], edges: list[dict[str, Any]]) -> str:
    """A directed GraphML document with node kind/label and edge predicate/provenance attributes."""
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           '<graphml xmlns="http://graphml.graphdrawing.org/xmlns">']
    for key, target, name in (("kind", "node", "kind"), ("label", "node", "label"), ("predicate", "edge", "predicate"),
                              ("path", "edge", "path"), ("section", "edge", "section"), ("role", "edge", "role")):
        out.append(f'  <key id="{key}" for="{target}" attr.name="{name}" attr.type="string"/>')
    out.append('  <graph id="rag" edgedefault="directed">')
    for n in nodes:
        out.append(f"    <node id={quoteattr(n['key'])}><data key=\"kind\">{escape(n['kind'])}</data>"
                   f"<data key=\"label\">{escape(n['label'])}</data></node>")
    for i, e in enumerate(edges):
        data = "".join(f'<data key="{k}">{escape(str(e[k]))}</data>' for k in ("predicate", "path", "section", "role")
                       if e.get(k))
        out.append(f"    <edge id=\"e{i}\" source={quoteattr(e['src'])} target={quoteattr(e['dst'])}>{data}</edge>")
    out += ["  </graph>", "</graphml>"]
    return "\n".join(out) + "\n"


def export_graph(nodes: list[dict[str, Any]], edges: list[dict[str, Any]], fmt: str) -> str:
    if fmt == "cypher":
        return to_cypher(nodes, edges)
    if fmt == "graphml":
        return to_graphml(nodes, edges)
    raise ValidationError(f"unknown export format '{fmt}'; use one of {', '.join(FORMATS)}")
