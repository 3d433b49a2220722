"""Corpus-adapted embeddings (issue 30 item 5): fine-tune the local all-MiniLM-L6-v2 on a corpus's
own structure and compare it with the base model through the product's own eval path.

Training pairs come from the corpus alone, parsed and chunked exactly as ingest does: for each
chunk, (document title or ticker + section heading) -> the chunk's text; for SciFact the title ->
each chunk of the abstract. Loss: MultipleNegativesRankingLoss (in-batch negatives), batches that
never hold two pairs of one document (a document's other sections would be false negatives). No
query and no qrels are used for training.

Both models then ingest the same corpus into their own database on the reusable benchmark server
(the adapted one through `embedding.model_path`, exported to ONNX like the installed model) and
are scored with `rag_lib.eval` (`evaluate_kb`, per query type), semantic and hybrid. Prints ONE
JSON line.

What the README reports (2026-11-26, not adopted; the defaults are that run's recipe):

    .venv/bin/python benchmarks/adapt_model.py --corpus tradegent
    .venv/bin/python benchmarks/adapt_model.py --corpus scifact --docs 600 --steps 20
    .venv/bin/python benchmarks/adapt_model.py --corpus FOLDER --queries Q.jsonl --qrels QRELS.tsv --steps 1  # a smoke run
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_db import SHARED, bench_database  # noqa: E402

from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.chunking import Chunker  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.documents import iter_corpus_files, load_file  # noqa: E402
from rag_lib.embedding.local import default_model_path  # noqa: E402
from rag_lib.eval import evaluate_kb, load_qrels, load_queries, load_query_types, metrics_by_type  # noqa: E402
from rag_lib.flatten import flatten, load_mapping  # noqa: E402
from rag_lib.models import Document  # noqa: E402
from rag_lib.tokens import get_tokenizer  # noqa: E402

MAX_FILE_BYTES = 64 * 1024 * 1024  # SciFact is one 8 MB file of records


def corpus_spec(name: str, work: Path, docs: int | None, seed: int, queries: Path | None = None,
                qrels: Path | None = None) -> tuple[Path, str, str, list[tuple[str, Path, Path]]]:
    """(corpus path, collection, unit, [(eval set name, queries, qrels)]): `tradegent` (the shared
    corpus, dev and dev2), `scifact` (test split) or a folder with `--queries`/`--qrels`."""
    if name == "tradegent":
        sets = [(s, SHARED / "eval" / f"tradegent-{s}" / "queries.jsonl", SHARED / "eval" / f"tradegent-{s}" / "qrels.tsv")
                for s in ("dev", "dev2")]
        return SHARED / "corpus", "tradegent", "section", sets
    if name == "scifact":
        data = SHARED / "datasets" / "scifact"
        corpus = data / "corpus.jsonl"
        if docs is not None:
            corpus = scifact_sample(data, work, docs, seed)
        return corpus, "scifact", "document", [("test", data / "queries.jsonl", data / "qrels" / "test.tsv")]
    return Path(name), "corpus", "section", [("set", queries, qrels)] if queries and qrels else []


def scifact_sample(data: Path, work: Path, docs: int, seed: int) -> Path:
    """A smaller SciFact for a loaded 2-core machine (each model embeds the whole corpus): every
    abstract judged for a test query plus random others up to `docs`, in a file of the same name.
    Both models search the same sample, so the comparison stays fair; the figures are higher than
    on the full corpus (fewer distractors). The qrels choose the corpus only, never training pairs."""
    judged = {line.split("\t")[1] for line in (data / "qrels" / "test.tsv").read_text().splitlines()[1:] if line}
    lines = (data / "corpus.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    ids = [json.loads(line)["_id"] for line in lines]
    others = [i for i, d in enumerate(ids) if d not in judged]
    keep = {i for i, d in enumerate(ids) if d in judged}
    keep |= set(random.Random(seed).sample(others, max(0, min(len(others), docs - len(keep)))))
    out = work / f"scifact-{docs}-{seed}" / "corpus.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(lines[i] for i in sorted(keep)), encoding="utf-8")
    return out


def anchor_of(doc: Document, section_title: str, section_name: str) -> str:
    """What a reader would call the chunk: the document's title (or ticker, or file name) and its heading."""
    name = doc.title or doc.ticker or Path(doc.path).stem
    if section_name.startswith("_") or doc.format == "jsonl":  # intro / a record's single text: the title alone
        return name
    return f"{name} {section_title}"


def without_heading(text: str, title: str | None, section_name: str) -> str:
    """The chunk's text without what the anchor already says (a markdown heading line, a record's
    title repeated at its start): otherwise the pair is matched by copying, and nothing is learnt."""
    text = text.lstrip()
    if title and text.startswith(title):
        text = text[len(title):]
    first, _, rest = text.partition("\n")
    if first.lstrip().startswith("#") or first.strip() == section_name:
        text = rest
    return text.strip()


def training_pairs(corpus: Path, collection: str, settings: Settings) -> list[tuple[str, str, str]]:
    """(anchor, positive text, document path) for every chunk of the corpus, chunked as ingest does."""
    mapping = load_mapping(Path(settings.sections_file))
    chunker = Chunker(get_tokenizer(default_model_path()), settings.chunking)
    files = [corpus] if corpus.is_file() else sorted(iter_corpus_files(corpus))
    pairs = []
    for path in files:
        for doc in load_file(path, corpus, collection, MAX_FILE_BYTES, settings.limits):
            if not isinstance(doc, Document):
                continue
            sections = flatten(doc, mapping)
            titles = {s.name: s.title for s in sections}
            for chunk in chunker.chunk(doc, sections):
                anchor = anchor_of(doc, titles[chunk.section], chunk.section)
                text = without_heading(chunk.text, doc.title, chunk.section)
                if text.strip() and anchor.strip():
                    pairs.append((anchor, text, doc.path))
    return pairs


def batches(pairs: list[tuple[str, str, str]], size: int, rng: random.Random) -> list[list[tuple[str, str, str]]]:
    """Shuffled batches in which no document (and so no anchor) appears twice."""
    pending = pairs[:]
    rng.shuffle(pending)
    out = []
    while pending:
        batch, seen, rest = [], set(), []
        for pair in pending:
            if len(batch) < size and pair[2] not in seen:
                batch.append(pair)
                seen.add(pair[2])
            else:
                rest.append(pair)
        if len(batch) < 2:
            break
        out.append(batch)
        pending = rest
    return out


def fine_tune(pairs: list[tuple[str, str, str]], out: Path, *, steps: int, batch_size: int, lr: float,
              max_seq_length: int, seed: int, threads: int, train_layers: int) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    model = SentenceTransformer(default_model_path(), device="cpu")
    serving_length = model.max_seq_length
    model.max_seq_length = max_seq_length  # shorter while training: the cost is quadratic in length
    # Only the top `train_layers` transformer layers learn: backward stops there (about half the
    # cost of a step on a shared 2-core machine) and the embeddings keep what pre-training taught.
    bert = model[0].auto_model
    layers = bert.encoder.layer
    for param in bert.parameters():
        param.requires_grad = False
    for layer in layers[len(layers) - train_layers:]:
        for param in layer.parameters():
            param.requires_grad = True
    trainable = [p for p in model.parameters() if p.requires_grad]
    loss_fn = MultipleNegativesRankingLoss(model)
    optimizer = torch.optim.AdamW(trainable, lr=lr)
    plan = batches(pairs, batch_size, random.Random(seed))
    order = [plan[i % len(plan)] for i in range(steps)]
    warmup = max(1, steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, (steps - s) / max(1, steps - warmup)))
    model.train()
    started, losses = time.perf_counter(), []
    for batch in order:
        features = [model.preprocess([a for a, _, _ in batch]), model.preprocess([p for _, p, _ in batch])]
        loss = loss_fn(features, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        if len(losses) % 5 == 0:
            print(f"step {len(losses)}/{steps} loss {losses[-1]:.4f} {time.perf_counter() - started:.0f}s",
                  file=sys.stderr, flush=True)
    model.eval()
    model.max_seq_length = serving_length
    out.mkdir(parents=True, exist_ok=True)
    model.save(str(out))
    head = losses[: max(1, len(losses) // 10)]
    tail = losses[-max(1, len(losses) // 10):]
    return {"pairs": len(pairs), "batches_available": len(plan), "steps": steps, "batch_size": batch_size,
            "lr": lr, "max_seq_length": max_seq_length, "seed": seed, "train_layers": train_layers, "seconds": round(time.perf_counter() - started, 1),
            "loss_first": round(sum(head) / len(head), 4), "loss_last": round(sum(tail) / len(tail), 4)}


def evaluate_model(label: str, model_path: str | None, model_name: str, spec, modes: list[str], work: Path | None,
                   docs: int | None) -> dict:
    corpus, collection, unit, sets = spec
    url, work_dir = bench_database(f"adapt_{collection}{docs or ''}_{label}", work)
    embedding = {"model": model_name} | ({"model_path": model_path} if model_path else {})
    settings = Settings(database_url=url, home=work_dir / f"home-{label}", max_file_bytes=MAX_FILE_BYTES,
                        embedding=embedding)
    kb = KnowledgeBase(settings)
    try:
        started = time.perf_counter()
        report = kb.ingest([corpus], collection)
        space = kb.store.active_space()
        kb.store.ensure_hnsw_index(space["space"], space["dimensions"])
        out = {"ingest_seconds": round(time.perf_counter() - started, 1), "embedded_now": report.texts_embedded,
               "space": space["space"]}
        for name, queries_path, qrels_path in sets:
            queries, qrels, types = load_queries(queries_path), load_qrels(qrels_path), load_query_types(queries_path)
            for mode in modes:
                r = evaluate_kb(kb, queries, qrels, mode=mode, unit=unit, collection=collection)
                by_type = metrics_by_type(r.per_query, types)
                out[f"{name}/{mode}"] = {t: m["ndcg@10"] for t, m in by_type.items()} | {
                    "recall@10": by_type["all"]["recall@10"], "mrr@10": by_type["all"]["mrr@10"]}
        return out
    finally:
        kb.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="tradegent",
                        help="tradegent (shared corpus: dev, dev2), scifact (test) or a folder (with --queries/--qrels)")
    parser.add_argument("--queries", type=Path, default=None, help="a BEIR queries.jsonl for a folder corpus")
    parser.add_argument("--qrels", type=Path, default=None, help="its qrels.tsv (section units)")
    parser.add_argument("--max-pairs", type=int, default=4000, help="training pairs sampled from the corpus")
    parser.add_argument("--steps", type=int, default=24, help="optimizer steps (batches)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-seq-length", type=int, default=64, help="tokens per text while training")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--train-layers", type=int, default=2, help="top transformer layers that learn (of 6)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--modes", default="semantic,hybrid")
    parser.add_argument("--skip-base", action="store_true", help="do not (re)score the base model")
    parser.add_argument("--skip-eval", action="store_true", help="only train (a smoke run)")
    parser.add_argument("--docs", type=int, default=None,
                        help="SciFact: the test-judged abstracts plus random others up to this many")
    parser.add_argument("--work", type=Path, default=None, help="folder of the reusable benchmark server")
    args = parser.parse_args()

    work = (args.work or Path(__file__).resolve().parents[1] / ".rag" / "bench").resolve()
    spec = corpus_spec(args.corpus, work, args.docs, args.seed, args.queries, args.qrels)
    corpus, collection = spec[0], spec[1]
    pairs = training_pairs(corpus, collection, Settings())
    rng = random.Random(args.seed)
    if len(pairs) > args.max_pairs:
        pairs = rng.sample(pairs, args.max_pairs)
    recipe = json.dumps([args.corpus, args.docs, len(pairs), args.steps, args.batch_size, args.lr, args.max_seq_length,
                         args.seed, args.train_layers])
    tag = hashlib.sha256(recipe.encode()).hexdigest()[:8]
    label = args.corpus if args.corpus in ("tradegent", "scifact") else "corpus"
    out_dir = work / "adapted" / f"{label}-{tag}"
    training = fine_tune(pairs, out_dir, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                         max_seq_length=args.max_seq_length, seed=args.seed, threads=args.threads,
                         train_layers=args.train_layers)
    result = {"benchmark": "adapt_model", "corpus": label, "model_dir": str(out_dir), "training": training,
              "example_pair": list(pairs[0][:2]) if pairs else None}
    if not args.skip_eval:
        modes = args.modes.split(",")
        if not args.skip_base:
            result["base"] = evaluate_model("base", None, "all-MiniLM-L6-v2", spec, modes, args.work, args.docs)
        result["adapted"] = evaluate_model(f"ft{tag}", str(out_dir), f"all-MiniLM-L6-v2-{label}-{tag}", spec,
                                           modes, args.work, args.docs)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
