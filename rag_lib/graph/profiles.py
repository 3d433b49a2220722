"""Entity linking for questions that describe a company instead of naming it ("the GPU maker").

Each ticker gets a profile built from the corpus alone: its company names (graph aliases), what the
graph states around it (sector, industry, themes, catalysts, metrics, customers), its documents'
company sections (description, segments) and the words that set its documents apart from other
tickers' documents (TF-IDF over tickers). The profile is embedded with the active model and stored;
a question's vector is compared with every profile and a confident match becomes a ticker hint, the
same hint a named ticker gives (a ranking boost and graph-fusion seeds). No word lists: another
corpus gets its own profiles, and a corpus without tickers gets none (linking then does nothing).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rag_lib.flatten import load_mapping

# Sections whose text describes the company itself (the ticker-profile and analysis schemas' names).
COMPANY_SECTIONS = ("company", "company_profile", "business", "business_overview", "overview", "description",
                    "revenue_breakdown", "segments", "products")
HUB_SAMPLE = 400  # chunks sampled to measure each profile's hubness
HUB_NEIGHBOURS = 10
KEY_TERMS = 30  # distinctive words per profile; MiniLM reads 256 tokens, the profile stays well under
MAX_SECTION_CHARS = 600
_WORD = re.compile(r"[a-z][a-z0-9&'\-]{2,}")
# Function words carry no identity; TF-IDF over a handful of tickers cannot always tell them apart.
_STOP = frozenset("""the and for with that this from are was were been has have had not but its into than then
they them their there which while what when where who will would could should can may might also about
above after again against all any because before being below between both down during each few further
here how more most other our out over own same some such only very just now off once too under until
yes no per via vs using used use based see one two three new high low key""".split())


@dataclass
class ProfileReport:
    """What a rebuild did: profiles kept, (re)embedded, removed; a few of their texts."""

    collection: str
    space: str | None
    profiles: int = 0
    rebuilt: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    sample: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"collection": self.collection, "space": self.space, "profiles": self.profiles,
                "rebuilt": self.rebuilt, "removed": self.removed, "sample": self.sample}


def _words(text: str) -> list[str]:
    return [w.strip("-'") for w in _WORD.findall(text.lower()) if w not in _STOP and not w[0].isdigit()]


def key_terms(texts: dict[str, list[str]], n: int = KEY_TERMS) -> dict[str, list[str]]:
    """Per ticker, the `n` words that most set its documents apart: in how many of its sections a word
    occurs (a word its analyses keep using says more than a one-off) times IDF over tickers (a word
    every ticker's documents use scores zero)."""
    counts = {t: Counter(w for text in ts for w in set(_words(text))) for t, ts in texts.items()}
    df: Counter[str] = Counter(w for c in counts.values() for w in c)
    total = len(counts)
    symbols = {t.lower() for t in counts}  # another ticker's symbol says "compared with", not "is"
    out = {}
    for t, c in counts.items():
        least = 2 if len(texts[t]) >= 4 else 1
        scored = [(-sf * math.log(total / df[w]), w) for w, sf in c.items()
                  if df[w] < total and sf >= least and w not in symbols]
        out[t] = [w for _, w in sorted(scored)[:n]]
    return out


def profile_text(ticker: str, facts: dict[str, Any], terms: list[str]) -> str:
    """One short paragraph: names, graph facts, the company sections, distinctive words."""
    parts = [f"{ticker}: " + ", ".join(dict.fromkeys(facts.get("names") or [])) if facts.get("names") else ticker]
    for kind, labels in sorted((facts.get("neighbours") or {}).items()):
        parts.append(f"{kind}: " + ", ".join(label.replace("-", " ") for label in labels[:8]))
    for text in facts.get("company") or []:
        parts.append(re.sub(r"\s+", " ", text)[:MAX_SECTION_CHARS])
    if terms:
        parts.append("about: " + ", ".join(terms))
    return ". ".join(p.strip().rstrip(".") for p in parts if p.strip())


def hubness(vectors: dict[str, np.ndarray], sample: np.ndarray, k: int = HUB_NEIGHBOURS) -> dict[str, float]:
    """Per profile, its mean cosine to its `k` nearest chunks of the collection (CSLS, Conneau et al.
    2018): a profile near everything (a long, rich one) would otherwise win every vague question."""
    if not len(sample) or not vectors:
        return dict.fromkeys(vectors, 0.0)
    sample = sample / np.maximum(np.linalg.norm(sample, axis=1, keepdims=True), 1e-12)
    k = min(k, len(sample))
    return {t: float(np.sort(sample @ v)[-k:].mean()) for t, v in vectors.items()}


def build_profiles(store, provider, collection: str) -> ProfileReport:
    """Rebuild `collection`'s ticker profiles in the active space: texts from the store, vectors only
    for profiles whose text or sources changed; profiles of tickers no document is about go."""
    space = store.active_space()
    report = ProfileReport(collection, space["space"] if space else None)
    if space is None:
        return report
    # Descriptor sections (`_meta`, `_links`, `ticker: NVDA`, ...) say what a document is, not what its
    # company does: left out of the distinctive words and of the hubness sample (with them, a short
    # `ticker: JPM` chunk sat next to JPM's profile and the question "the bank" no longer linked).
    descriptors = sorted(load_mapping(Path(store.settings.sections_file)).descriptor_names)
    facts = store.ticker_profile_facts(collection, COMPANY_SECTIONS, descriptors)
    terms = key_terms({t: f["texts"] for t, f in facts.items()})
    texts = {t: profile_text(t, f, terms.get(t, [])) for t, f in facts.items()}
    hashes = {t: hashlib.sha256((texts[t] + "\0" + "\0".join(facts[t]["sources"])).encode()).hexdigest()[:32]
              for t in texts}
    stored = store.ticker_profile_hashes(collection, space["space"])
    changed = sorted(t for t in texts if stored.get(t) != hashes[t])
    vectors = provider.embed([texts[t] for t in changed]) if changed else []
    rows = [(t, texts[t], hashes[t], facts[t]["paths"], np.asarray(v, dtype=np.float32)) for t, v in zip(changed, vectors)]
    # Hubness moves with the whole collection, so every profile's is recomputed (no model call).
    old_tickers, old_matrix, _ = store.ticker_profile_vectors(collection, space["space"])
    current = {t: old_matrix[i] for i, t in enumerate(old_tickers)}
    current.update({t: v / (np.linalg.norm(v) or 1.0) for t, *_, v in rows})
    sample = store.chunk_vector_sample(collection, space["space"], HUB_SAMPLE, descriptors)
    hub = hubness({t: current[t] for t in texts if t in current}, sample)
    report.removed = store.write_ticker_profiles(collection, space["space"], space["dimensions"], rows, list(texts), hub)
    report.rebuilt, report.profiles = changed, len(texts)
    report.sample = {t: texts[t] for t in changed[:3]}
    return report


# ---- linking at query time ---------------------------------------------------------------------

# Searches reuse the profiles this long (`rag_lib.search.retrieval.SearchCaches`): a profile rebuilt by
# another process is seen within this delay (by the rebuilding knowledge base at once).
CACHE_SECONDS = 30.0
Profiles = tuple[list[str], np.ndarray, np.ndarray]  # tickers, unit profile vectors, hubness


def link_tickers(profiles: Profiles, vector: np.ndarray, threshold: float, margin: float,
                 limit: int = 1) -> list[tuple[str, float]]:
    """Tickers whose profile the question matches confidently: cosine similarity at least `threshold`,
    and a CSLS score (cosine minus half the profile's hubness) at least `margin` above the next
    profile's (a question near every profile names none)."""
    tickers, matrix, hub = profiles
    if not tickers:
        return []
    q = np.asarray(vector, dtype=np.float32)
    sims = matrix @ (q / (np.linalg.norm(q) or 1.0))
    scores = sims - hub / 2
    order = np.argsort(-scores)
    out = []
    for i, idx in enumerate(order[:limit]):
        runner_up = float(scores[order[i + 1]]) if i + 1 < len(order) else -1.0
        if sims[idx] >= threshold and scores[idx] - runner_up >= margin:
            out.append((tickers[idx], round(float(sims[idx]), 4)))
        else:
            break
    return out
