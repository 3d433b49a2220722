"""The settings reference: every setting's dotted name, variable, type, default and description, read
from `rag_lib/config.py` itself (a field's comment is its description), so the code and its
documentation cannot drift. `rag config` shows it with the values in force; `docs/settings.md` is
generated from it (`make settings-doc`), and a test fails when either falls behind."""

from __future__ import annotations

import ast
import inspect
import io
import os
import tokenize
import typing
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from rag_lib import config
from rag_lib.config import Settings

SECRET_SETTINGS = {"database_url", "search.database_url"}  # URLs that may carry a password


@dataclass(frozen=True)
class SettingDoc:
    """One setting as the reference shows it."""

    name: str  # dotted: search.top_k
    env: str  # RAG_SEARCH__TOP_K
    type: str
    default: Any
    description: str
    section: str  # the first part of the name ("" for top-level settings)


@dataclass(frozen=True)
class SettingValue:
    """A setting with the value in force and where it came from."""

    doc: SettingDoc
    value: Any
    source: str  # default | $RAG_X | a seed variable | the settings file's path


@lru_cache(maxsize=1)
def _field_comments() -> dict[tuple[str, str], str]:
    """(class name, field name) -> the comment lines right above the field plus its inline comment."""
    source = inspect.getsource(config)
    lines = source.splitlines()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    out: dict[tuple[str, str], str] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            above: list[str] = []
            line = item.lineno - 1
            while line >= 1 and lines[line - 1].strip().startswith("#"):
                above.insert(0, comments.get(line, ""))
                line -= 1
            inline = [comments[n] for n in range(item.lineno, (item.end_lineno or item.lineno) + 1) if n in comments]
            out[(node.name, item.target.id)] = " ".join(part for part in above + inline if part)
    return out


def _description(model: type[BaseModel], field: str) -> str:
    for cls in model.__mro__:  # an inherited field is described where it is defined
        text = _field_comments().get((cls.__name__, field))
        if text is not None:
            return text
    return ""


def _type_name(annotation: Any) -> str:
    text = str(annotation) if not isinstance(annotation, type) else annotation.__name__
    for noise in ("typing.", "pathlib.", "rag_lib.config."):
        text = text.replace(noise, "")
    return text.replace("NoneType", "None")


def _default(field: Any) -> Any:
    if field.default_factory is not None:
        made = field.default_factory()
        return made.model_dump(mode="json") if isinstance(made, BaseModel) else made
    return None if field.default is PydanticUndefined else field.default


def _model_of(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _list_model(annotation: Any) -> type[BaseModel] | None:
    if typing.get_origin(annotation) is list:
        (arg,) = typing.get_args(annotation) or (None,)
        return _model_of(arg)
    return None


def setting_docs() -> list[SettingDoc]:
    """Every setting, in the order `config.py` defines them."""
    out: list[SettingDoc] = []

    def walk(model: type[BaseModel], prefix: str, env_prefix: str | None) -> None:
        for name, field in model.model_fields.items():
            dotted = f"{prefix}{name}"
            env = f"{env_prefix}{name.upper()}" if env_prefix is not None else ""
            nested = _model_of(field.annotation)
            if nested is not None:
                walk(nested, dotted + ".", env + "__" if env else None)
                continue
            item = _list_model(field.annotation)
            description = _description(model, name)
            if item is not None and not issubclass(config.EmbeddingSettings, item):
                # a list of records (pipeline.roots): each entry's fields are documented under name[]
                out.append(SettingDoc(dotted, env, f"list of {item.__name__}", _default(field),
                                      description, dotted.split(".")[0] if "." in dotted else ""))
                walk(item, dotted + "[].", None)
                continue
            if item is not None:  # embedding.providers: each entry takes the fields of `embedding`
                description += " Each entry takes the provider fields of `embedding` (provider, model, dimensions, ...)."
            out.append(SettingDoc(dotted, env, _type_name(field.annotation), _default(field), description.strip(),
                                  dotted.split(".")[0] if "." in dotted else ""))

    walk(Settings, "", "RAG_")
    return out


def _get(data: Any, dotted: str) -> tuple[bool, Any]:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return False, None
        data = data[part]
    return True, data


def _source(doc: SettingDoc, file_values: dict[str, Any], seed_values: dict[str, Any]) -> str:
    """Where a value came from, in the order the settings are read: RAG_* variables, the seeds'
    variables, the settings file."""
    parts = doc.env.split("__")
    for depth in range(len(parts), 0, -1):  # RAG_SEARCH__TOP_K, or RAG_SEARCH holding JSON
        name = "__".join(parts[:depth])
        if name and name in os.environ:
            return f"${name}"
    if _get(seed_values, doc.name)[0]:
        return "a seed variable (README, Configuration)"
    if _get(file_values, doc.name)[0]:
        return str(config.config_file())
    return "default"


def setting_values(settings: Settings | None = None) -> list[SettingValue]:
    """Every setting with the value in force and its source; URLs that may hold a password are redacted."""
    from rag_lib.db import redacted_url

    settings = settings or config.get_settings()
    path = config.config_file()
    file_values = config.ConfigFileSource(Settings, path)() if path.is_file() else {}
    seed_values = config.seed_env_values()
    data = settings.model_dump(mode="json")
    out: list[SettingValue] = []
    for doc in setting_docs():
        if "[]" in doc.name:
            continue  # shown inside its list's value
        value = _get(data, doc.name)[1]
        source = _source(doc, file_values, seed_values)
        if source == "default" and value != _plain(doc.default):
            # e.g. embedding.model under EMBED_PROVIDER=ollama: the provider's own default
            source = "embedding.provider's default" if doc.section == "embedding" else "derived from other settings"
        if doc.name in SECRET_SETTINGS and isinstance(value, str):
            value = redacted_url(value)
        out.append(SettingValue(doc, value, source))
    return out


def _plain(value: Any) -> Any:
    """A default as `model_dump(mode="json")` writes values (paths as strings)."""
    import json

    return json.loads(json.dumps(value, default=str))


def _shown(value: Any) -> str:
    """A default as a reader writes it in rag.yaml (paths inside the package as <rag_lib>/...)."""
    import json

    if isinstance(value, Path):
        value = str(value).replace(str(Path(config.__file__).resolve().parent), "<rag_lib>")
    return json.dumps(value, default=str) if not isinstance(value, str) else value


def _escaped(text: str) -> str:
    return text.replace("|", "\\|")


def reference_markdown() -> str:
    """docs/settings.md: one table per section."""
    docs = setting_docs()
    out = [
        "# Settings",
        "",
        "Generated from `rag_lib/config.py` by `make settings-doc` (`rag config --markdown`); do not edit by hand.",
        "Set them in `rag.yaml` (or the file `$RAG_CONFIG` names) or as environment variables (`RAG_` and the",
        "dotted name in capitals, `__` between parts; a list or mapping as JSON). Environment variables win over",
        "the file. `rag config` shows the values in force and where each came from; the seeds' variables",
        "(`EMBED_PROVIDER`, `PG_HOST`, ...) are listed in the README's Configuration section.",
        "",
    ]
    sections: dict[str, list[SettingDoc]] = {}
    for doc in docs:
        sections.setdefault(doc.section, []).append(doc)
    for section, items in sections.items():
        out += [f"## {section or 'top level'}", "", "| setting | variable | type | default | what it does |", "|---|---|---|---|---|"]
        for doc in items:
            env = f"`{doc.env}`" if doc.env else "(in the list)"
            out.append(f"| `{doc.name}` | {env} | {_escaped(doc.type)} | `{_escaped(_shown(doc.default))}` "
                       f"| {_escaped(doc.description)} |")
        out.append("")
    return "\n".join(out)
