"""Retrieval evaluation on BEIR-format sets: load queries/qrels, run searches, score units.

Units: `section` = `<path>#<section>` (the chunk's unit id); `document` = the document id (for
JSONL corpora the record `_id`). A unit's rank is the rank of its best chunk. Metrics follow
trec_eval / pytrec_eval: nDCG@10 with linear gains, Recall@k over judged-relevant units (score > 0),
MRR@10 = reciprocal rank of the first relevant unit within the top 10."""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rag_lib.errors import ValidationError

UNITS = ("section", "document")
Qrels = dict[str, dict[str, int]]


def load_queries(path: str | Path) -> dict[str, str]:
    """`queries.jsonl`: one `{"_id", "text"}` per line (other fields ignored)."""
    out: dict[str, str] = {}
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValidationError(f"cannot read queries file {path}: {exc.strerror}") from exc
    first_line: dict[str, int] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            qid, text = str(record["_id"]), str(record["text"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValidationError(f"{path}:{n}: not a BEIR query record ({exc})") from exc
        if qid in first_line:  # which text the judgments are for cannot be told
            raise ValidationError(f"{path}:{n}: query id '{qid}' repeats line {first_line[qid]}; give each query its own id")
        first_line[qid] = n
        out[qid] = text
    return out


def load_qrels(path: str | Path) -> Qrels:
    """`qrels.tsv`: `query-id corpus-id score` (tab-separated; header and CRLF line ends allowed)."""
    qrels: Qrels = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValidationError(f"cannot read qrels file {path}: {exc.strerror}") from exc
    for n, line in enumerate(text.splitlines(), 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 3:
            raise ValidationError(f"{path}:{n}: expected 'query-id<TAB>corpus-id<TAB>score'")
        qid, unit, score = parts[0].strip(), parts[1].strip(), parts[-1].strip()
        try:
            value = int(float(score))
        except ValueError:
            if n == 1:  # header
                continue
            raise ValidationError(f"{path}:{n}: score '{score}' is not a number") from None
        qrels.setdefault(qid, {})[unit] = value
    return qrels


def unit_of(hit: Any, unit: str) -> str:
    return hit.unit_id if unit == "section" else hit.doc_id


def unit_ranking(hits: Sequence[Any], unit: str) -> list[str]:
    """Units in the order of their best chunk."""
    seen: dict[str, None] = {}
    for hit in hits:
        seen.setdefault(unit_of(hit, unit), None)
    return list(seen)


# ---- metrics (one query) ----------------------------------------------------------------------

def ndcg_at(ranking: Sequence[str], judged: Mapping[str, int], k: int = 10) -> float:
    dcg = sum(judged.get(u, 0) / math.log2(i + 2) for i, u in enumerate(ranking[:k]) if judged.get(u, 0) > 0)
    ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(ranking: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    relevant = {u for u, g in judged.items() if g > 0}
    return len(relevant & set(ranking[:k])) / len(relevant) if relevant else 0.0


def mrr_at(ranking: Sequence[str], judged: Mapping[str, int], k: int = 10) -> float:
    for i, u in enumerate(ranking[:k]):
        if judged.get(u, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def query_metrics(ranking: Sequence[str], judged: Mapping[str, int]) -> dict[str, float]:
    return {
        "ndcg@10": ndcg_at(ranking, judged, 10),
        "recall@10": recall_at(ranking, judged, 10),
        "recall@100": recall_at(ranking, judged, 100),
        "mrr@10": mrr_at(ranking, judged, 10),
    }


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (no interpolation)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class EvalReport:
    """Mean metrics over the judged queries, latency percentiles and per-query details."""

    mode: str
    unit: str
    queries: int
    metrics: dict[str, float]
    latency_ms: dict[str, float]
    per_query: dict[str, dict[str, float]] = field(default_factory=dict)
    missing_queries: list[str] = field(default_factory=list)  # judged ids with no query text
    # judged units the collection does not hold (no search can return them) → the closest held ones
    unknown_units: dict[str, list[str]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The one JSON object `rag eval --json` prints."""
        return {**{k: round(v, 4) for k, v in self.metrics.items()}, "queries": self.queries,
                "latency_ms": self.latency_ms, "mode": self.mode,
                **({"unknown_units": self.unknown_units} if self.unknown_units else {})}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate_rankings(rankings: Mapping[str, Sequence[str]], qrels: Qrels) -> dict[str, dict[str, float]]:
    """Per-query metrics for unit rankings (queries absent from `rankings` score 0)."""
    return {qid: query_metrics(rankings.get(qid, []), judged) for qid, judged in qrels.items()}


def evaluate(
    search: Callable[[str], Sequence[Any]],
    queries: Mapping[str, str],
    qrels: Qrels,
    *,
    unit: str = "section",
    mode: str = "",
    progress: Callable[[], None] | None = None,
) -> EvalReport:
    """Run `search(text) -> ranked hits` for every judged query and score the unit rankings."""
    if unit not in UNITS:
        raise ValidationError(f"unknown unit '{unit}'; use section or document")
    judged_ids = [q for q in qrels if any(g > 0 for g in qrels[q].values())]
    missing = [q for q in judged_ids if q not in queries]
    rankings: dict[str, list[str]] = {}
    latencies: list[float] = []
    for qid in judged_ids:
        if qid in missing:
            continue
        started = time.perf_counter()
        hits = search(queries[qid])
        latencies.append((time.perf_counter() - started) * 1000)
        rankings[qid] = unit_ranking(hits, unit)
        if progress:
            progress()
    scored = {q: m for q, m in evaluate_rankings(rankings, {q: qrels[q] for q in rankings}).items()}
    names = ("ndcg@10", "recall@10", "recall@100", "mrr@10")
    means = {n: statistics.fmean(m[n] for m in scored.values()) if scored else 0.0 for n in names}
    latency = {"p50": round(percentile(latencies, 50), 2), "p95": round(percentile(latencies, 95), 2)}
    return EvalReport(mode, unit, len(scored), means, latency, scored, missing)


def load_query_types(path: str | Path) -> dict[str, str]:
    """Each query's `metadata.type` (factual, paraphrase, ...); queries without one are `untyped`."""
    out: dict[str, str] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
            out[str(record["_id"])] = str(meta.get("type") or "untyped")
    return out


TYPED_METRICS = ("ndcg@10", "recall@10", "mrr@10")


def metrics_by_type(per_query: Mapping[str, Mapping[str, float]], types: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Mean nDCG@10, recall@10 and MRR@10 (and the query count) over all queries and per query type."""
    groups: dict[str, list[Mapping[str, float]]] = {"all": list(per_query.values())}
    for qid, m in per_query.items():
        groups.setdefault(types.get(qid, "untyped"), []).append(m)
    return {name: {**{n: round(statistics.fmean(m[n] for m in ms), 4) for n in TYPED_METRICS}, "queries": len(ms)}
            for name, ms in groups.items() if ms}


def score_eval_set(search: Callable[[str], Sequence[Any]], queries_path: str | Path, qrels_path: str | Path,
                   *, unit: str = "section", mode: str = "") -> dict[str, dict[str, float]]:
    """Run a BEIR set through `search` and score it per query type (`metrics_by_type`): the one
    scorer behind the `retrieval_quality` check and the re-embed's quality gate."""
    report = evaluate(search, load_queries(queries_path), load_qrels(qrels_path), unit=unit, mode=mode)
    return metrics_by_type(report.per_query, load_query_types(queries_path))


def evaluate_kb(kb: Any, queries: Mapping[str, str], qrels: Qrels, *, mode: str = "hybrid", unit: str = "section",
                collection: str | None = None, depth: int = 100,
                progress: Callable[[], None] | None = None) -> EvalReport:
    """Evaluate a `KnowledgeBase`: each query asks for `depth` units (document units: chunks, then
    collapsed by document id, so a document's rank is its best chunk's)."""
    def run(text: str) -> Sequence[Any]:
        if unit == "section":
            result = kb.search(text, mode=mode, collection=collection, top_k=depth)
        else:  # chunks, collapsed to documents by unit_ranking; several chunks per document on average
            result = kb.search(text, mode=mode, collection=collection, top_k=min(1000, depth * 3), group=False)
        return result.hits

    report = evaluate(run, queries, qrels, unit=unit, mode=mode, progress=progress)
    judged = {u for q in report.per_query for u, grade in qrels[q].items() if grade > 0}
    report.unknown_units = kb.units_not_held(judged, unit, collection)
    return report


# ---- RAGAS metrics judged by an OpenAI-compatible chat model ---------------------------------------

JUDGE_RELEVANCE = (
    "TASK: context relevance. You judge retrieval for a trading-research knowledge base. For each numbered "
    "context, decide whether it is useful for answering the question. Reply with one line per context, "
    "exactly `N: yes` or `N: no`, nothing else."
)
JUDGE_ANSWER = (
    "TASK: answer. Answer the question using only the numbered contexts, in at most five short sentences, "
    "one per line. If the contexts do not contain the answer, say so in one line."
)
JUDGE_SUPPORT = (
    "TASK: statement support. For each numbered statement, decide whether the contexts support it. Reply "
    "with one line per statement, exactly `N: yes` or `N: no`, nothing else."
)
JUDGE_ANSWER_RELEVANCE = (
    "TASK: answer relevance. For each numbered statement of an answer, decide whether it addresses the "
    "question (not whether it is true). Reply with one line per statement, exactly `N: yes` or `N: no`, "
    "nothing else."
)


def overall_score(scores: Mapping[str, float | None]) -> float | None:
    """Seed 004's `overall_score` (RAGAS's old `ragas_score`): the harmonic mean of the metrics judged."""
    values = [v for v in scores.values() if v is not None]
    if not values:
        return None
    if min(values) <= 0:
        return 0.0
    return round(len(values) / sum(1 / v for v in values), 4)


_VERDICT = re.compile(r"^\s*\[?(\d+)\]?\s*[:.)\-]\s*(yes|no)\b", re.I | re.M)


def load_references(path: str | Path) -> dict[str, str]:
    """Reference answers from queries.jsonl (`reference`, `answer` or `metadata.answer`), for context recall."""
    out: dict[str, str] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
        ref = record.get("reference") or record.get("answer") or meta.get("reference") or meta.get("answer")
        if ref:
            out[str(record["_id"])] = str(ref)
    return out


def average_precision(verdicts: Sequence[bool]) -> float:
    """RAGAS context precision: mean of precision@k over the ranks k that hold a relevant context."""
    hits, total = 0, 0.0
    for k, relevant in enumerate(verdicts, 1):
        if relevant:
            hits += 1
            total += hits / k
    return total / hits if hits else 0.0


def parse_verdicts(text: str, n: int) -> list[bool]:
    """`N: yes|no` lines → n booleans (a missing or unreadable line counts as no)."""
    found = {int(m.group(1)): m.group(2).lower() == "yes" for m in _VERDICT.finditer(text or "")}
    return [found.get(i, False) for i in range(1, n + 1)]


def _sentences(text: str) -> list[str]:
    parts = [p.strip(" -*•\t") for p in re.split(r"(?<=[.!?])\s+|\n+", text or "")]
    return [p for p in parts if len(p) > 2]


def _numbered(items: Sequence[str], prefix: str = "") -> str:
    # one line per item: a context's own line breaks (and lines like "2: ...") would blur where it ends
    return "\n".join(f"{prefix}{i}: {' '.join(t.split())}" for i, t in enumerate(items, 1))


class ChatJudge:
    """The judge model behind the RAGAS metrics (any OpenAI-compatible chat-completions server)."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None, timeout: float = 30.0,
                 max_context_chars: int = 1500):
        from openai import OpenAI

        self.model = model
        self.max_context_chars = max_context_chars
        self.client = OpenAI(base_url=base_url, api_key=api_key or "unused", timeout=timeout, max_retries=2)
        self.calls = 0

    def ask(self, system: str, user: str) -> str:
        from rag_lib.errors import RagError

        self.calls += 1
        try:
            reply = self.client.chat.completions.create(
                model=self.model, temperature=0,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": user}])
        except Exception as exc:  # the judge's failure is the eval's failure: say which server
            raise RagError(f"judge model {self.model} failed: {type(exc).__name__}: {exc}") from exc
        return reply.choices[0].message.content or ""

    def score(self, question: str, contexts: Sequence[str], reference: str | None = None) -> dict[str, Any]:
        """Context precision, faithfulness of a generated answer, and (with a reference) context recall."""
        ctx = [c[: self.max_context_chars] for c in contexts]
        block = _numbered(ctx, "context ")
        out: dict[str, Any] = {"contexts": len(ctx)}
        if not ctx:
            return {**out, "context_precision": 0.0, "faithfulness": 0.0,
                    "context_recall": 0.0 if reference else None, "answer": ""}
        relevant = parse_verdicts(self.ask(JUDGE_RELEVANCE, f"Question: {question}\n\n{_numbered(ctx)}"), len(ctx))
        out["context_precision"] = average_precision(relevant)
        answer = self.ask(JUDGE_ANSWER, f"Question: {question}\n\n{block}")
        claims = _sentences(answer)
        supported = parse_verdicts(self.ask(JUDGE_SUPPORT, f"Contexts:\n{block}\n\nStatements:\n{_numbered(claims)}"),
                                   len(claims)) if claims else []
        out["faithfulness"] = sum(supported) / len(claims) if claims else 0.0
        out["answer"] = answer
        if reference:
            facts = _sentences(reference)
            covered = parse_verdicts(self.ask(JUDGE_SUPPORT, f"Contexts:\n{block}\n\nStatements:\n{_numbered(facts)}"),
                                     len(facts)) if facts else []
            out["context_recall"] = sum(covered) / len(facts) if facts else 0.0
        else:
            out["context_recall"] = None
        return out


# What a caller of `judge_answer` is told instead of scores when no judge model is configured.
NO_JUDGE_NOTE = ("not judged: the RAGAS metrics need a chat model; set eval.judge_model ($RAG_EVAL__JUDGE_MODEL) and "
                 "eval.judge_base_url ($RAG_EVAL__JUDGE_BASE_URL or $LLM_BASE_URL) for an OpenAI-compatible server")


def judge_from_settings(settings: Any) -> ChatJudge:
    """The configured judge (`eval.judge_model`, `eval.judge_base_url`, or the seeds' LLM_BASE_URL)."""
    import os

    from rag_lib.errors import ConfigError

    cfg = settings.eval
    if not cfg.judge_model:
        raise ConfigError("the RAGAS metrics need a chat model: set eval.judge_model (RAG_EVAL__JUDGE_MODEL) "
                          "and eval.judge_base_url (or LLM_BASE_URL) for an OpenAI-compatible server")
    return ChatJudge(cfg.judge_model, cfg.judge_base_url, os.environ.get(cfg.judge_api_key_env), cfg.judge_timeout)


def judge_answer(settings: Any, query: str, contexts: Sequence[str], answer: str, reference: str | None = None,
                 judge: ChatJudge | None = None) -> dict[str, Any]:
    """RAGAS metrics of one given answer (seed 004's `evaluate_single`), judged by the configured chat
    model: context precision, faithfulness of the answer to the contexts, answer relevancy and (with
    `reference`) context recall."""
    from rag_lib.errors import ValidationError

    if not contexts or not answer.strip():
        raise ValidationError("give at least one context and a non-empty answer")
    judge = judge or judge_from_settings(settings)
    ctx = [c[: judge.max_context_chars] for c in contexts]
    block = _numbered(ctx, "context ")

    def supported(text: str) -> float:
        claims = _sentences(text)
        if not claims:
            return 0.0
        verdicts = parse_verdicts(judge.ask(JUDGE_SUPPORT, f"Contexts:\n{block}\n\nStatements:\n{_numbered(claims)}"),
                                  len(claims))
        return sum(verdicts) / len(claims)

    relevant = parse_verdicts(judge.ask(JUDGE_RELEVANCE, f"Question: {query}\n\n{_numbered(ctx)}"), len(ctx))
    claims = _sentences(answer)
    addressed = parse_verdicts(judge.ask(
        JUDGE_ANSWER_RELEVANCE, f"Question: {query}\n\nStatements:\n{_numbered(claims)}"), len(claims)) if claims else []
    scores = {"context_precision": round(average_precision(relevant), 4),
              "faithfulness": round(supported(answer), 4),
              "context_recall": round(supported(reference), 4) if reference else None,
              "answer_relevancy": round(sum(addressed) / len(addressed), 4) if addressed else 0.0}
    return {"query": query, "model": judge.model, "contexts": len(ctx), **scores,
            "overall_score": overall_score(scores), "judge_calls": judge.calls}


def judge_kb(kb: Any, queries: Mapping[str, str], *, mode: str = "hybrid", collection: str | None = None,
             top_k: int = 5, references: Mapping[str, str] | None = None, judge: ChatJudge | None = None,
             progress: Callable[[], None] | None = None) -> dict[str, Any]:
    """Mean RAGAS metrics over `queries`, judged on each query's top `top_k` retrieved chunks."""
    judge = judge or judge_from_settings(kb.settings)
    references = references or {}
    per_query: dict[str, dict[str, Any]] = {}
    for qid, text in queries.items():
        hits = kb.search(text, mode=mode, collection=collection, top_k=top_k).hits
        scored = judge.score(text, [h.text for h in hits], references.get(qid))
        scored.pop("answer", None)
        per_query[qid] = scored
        if progress:
            progress()

    def mean(name: str) -> float | None:
        values = [q[name] for q in per_query.values() if q.get(name) is not None]
        return round(statistics.fmean(values), 4) if values else None

    return {"model": judge.model, "queries": len(per_query), "context_precision": mean("context_precision"),
            "context_recall": mean("context_recall"), "faithfulness": mean("faithfulness"),
            "judge_calls": judge.calls, "per_query": per_query}
