"""Per-stage code versions: what each ingest stage's output depends on (algorithm version and the
settings it reads). The library's fingerprint and the Dagster assets' code versions both come from here."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rag_lib.config import Settings

LOADER_VERSION = "5"  # 2: documents carry their metadata warnings; 3: and unreadable front matter;
# 4: a note's front-matter ticker, the date in a file's name (ISO too), _graph statements not understood;
# 5: a document without an explicit date field is dated by its file name's date, then `_meta.updated`, then `_meta.created`
FLATTEN_VERSION = "2"  # 2: a section name met again in a document is made its own ("Desk note (2)"); a file
# that failed on it under 1 kept its stored sections, current, and failed again on every run
PUBLISH_VERSION = "1"
# The digest of the loader's limits (max_file_bytes, limits.*) at their defaults. They were part of its
# version, so a change of any re-read every file; now a skip records the limit it is over and only the
# files skipped under another value are read again (rag_lib.ingest.state). The digest stays in the
# version so that the outputs of a default setup stay current.
UNVERSIONED_LIMITS = "cf198bf3"
# Stages whose output decides a published document's chunks and vectors (the fingerprint's inputs).
CONTENT_STAGES = ("flattened_sections", "chunks", "embeddings")
# The chunker key (rag_lib.tokens.chunker_key) of the local all-MiniLM-L6-v2's tokenizer, and of a
# remote provider's under the default tokenizer_path and max_input_tokens: the chunks of every default
# setup were cut with it before the chunker was part of the chunks stage's version. It is left out of
# that version, so those chunks stay current instead of every document being chunked again.
UNVERSIONED_CHUNKER = "be50c3628f2bf5bb:254"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:8] if path.is_file() else "none"


def stage_versions(settings: Settings, chunker_version: str | None = None,
                   chunker: str | None = None, model: str | None = None) -> dict[str, str]:
    """Stage name → version string; a change marks that stage (and what follows) out of date.
    `chunker`: the chunker key of the provider cutting the chunks (`EmbeddingProvider.chunker`:
    its tokenizer and input limit), by default the configured provider's; `model`: the key of the
    model making the vectors (`EmbeddingProvider.key`), by default the configured one's."""
    from rag_lib.chunking import CHUNKER_VERSION
    from rag_lib.embedding import configured_chunker

    emb = settings.embedding
    # chunking.min_tokens was a setting that nothing read (removed); its default stays in the digest so
    # that chunks made before its removal stay current instead of every file being chunked again
    chunking = {**settings.chunking.model_dump(), "min_tokens": 8}
    chunker = chunker or configured_chunker(settings)
    space = f"{model or emb.key}:{emb.dimensions}"  # another local model under the same name: another space
    if chunker != UNVERSIONED_CHUNKER:  # another tokenizer or input limit cuts other chunks
        chunking["chunker"] = chunker
    return {
        "raw_documents": f"load-{LOADER_VERSION}-{UNVERSIONED_LIMITS}",
        "flattened_sections": f"flatten-{FLATTEN_VERSION}-sections-{_file_digest(Path(settings.sections_file))}",
        "chunks": f"chunker-{chunker_version or CHUNKER_VERSION}-{_digest(chunking)}",
        "embeddings": f"{space}:v{emb.embed_version}",
        "vector_table": f"publish-{PUBLISH_VERSION}-{space}",
    }


def fingerprint(versions: dict[str, str]) -> str:
    """Hash of the versions of the stages that change a document's chunks or vectors, and of the
    loader's: the metadata it reads (ticker, date, type) is published with every chunk, so a loader
    that reads more republishes documents (their vectors mostly come from the cache)."""
    payload = {**{stage: versions[stage] for stage in CONTENT_STAGES}, "loader": LOADER_VERSION}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
