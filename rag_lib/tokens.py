"""Token counting with the embedding model's own tokenizer (never a word count or tiktoken)."""

from __future__ import annotations

from bisect import bisect_left
import hashlib
import json
from functools import cached_property, lru_cache
from pathlib import Path
import unicodedata

import numpy as np

from rag_lib.errors import ConfigError


class Tokenizer:
    """A fast Hugging Face tokenizer loaded from a local model folder (offline)."""

    def __init__(self, model_path: str | Path):
        from tokenizers import Tokenizer as HFTokenizer

        path = Path(model_path)
        try:
            self._tok = HFTokenizer.from_file(str(path / "tokenizer.json"))
            config = _sentence_config(path)
            self.model_max_length = _max_seq_length(path, config)
        except Exception as exc:  # tokenizers raises plain Exception subclasses; an unreadable config OSError or ValueError
            raise ConfigError(f"cannot load tokenizer from {path}: {exc}") from exc
        self._tok.no_truncation()
        self._tok.no_padding()
        self._path = path
        self._lower = bool(config.get("do_lower_case", False))

    @cached_property
    def _inputs(self):
        """A second instance for model inputs ([CLS]/[SEP] added, truncated to the sequence length),
        made on first use: processes that only count tokens never need it."""
        from tokenizers import Tokenizer as HFTokenizer

        inputs = HFTokenizer.from_file(str(self._path / "tokenizer.json"))
        inputs.no_padding()
        inputs.enable_truncation(max_length=self.model_max_length)
        return inputs

    @property
    def limit(self) -> int:
        """Content tokens per input: the model's sequence length less [CLS] and [SEP]."""
        return self.model_max_length - 2

    @cached_property
    def definition_digest(self) -> str:
        """Hash of tokenizer.json, which decides how this tokenizer splits every text."""
        return hashlib.sha256((self._path / "tokenizer.json").read_bytes()).hexdigest()[:16]

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def count_many(self, texts: list[str]) -> list[int]:
        return [len(e.ids) for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    @cached_property
    def splits_on_whitespace(self) -> bool:
        """Whether every token lies within one whitespace-separated word and is made from it alone
        (BERT's pre-tokenizer and normalizer, as the local models have): then a span of a text cut
        at whitespace has the tokens of the whole text's encoding that lie in it."""
        return (type(self._tok.pre_tokenizer).__name__ == "BertPreTokenizer"
                and type(self._tok.normalizer).__name__ in ("BertNormalizer", "NoneType"))

    def span_counter(self, text: str) -> SpanCounter:
        """Token counts of spans of `text`, from one encoding of it where the tokenizer allows."""
        return SpanCounter(self, text)

    def model_inputs(self, text: str) -> dict[str, np.ndarray]:
        """What the model reads for `text`, prepared as sentence-transformers does (stripped,
        special tokens, truncated): int64 arrays of one row each."""
        text = text.strip()
        encoding = self._inputs.encode(text.lower() if self._lower else text)
        return {
            "input_ids": np.array([encoding.ids], dtype=np.int64),
            "attention_mask": np.array([encoding.attention_mask], dtype=np.int64),
            "token_type_ids": np.array([encoding.type_ids], dtype=np.int64),
        }

    def model_inputs_many(self, texts: list[str]) -> list[dict[str, np.ndarray]]:
        """`model_inputs` of many texts in one call to the tokenizer, each array one-dimensional."""
        stripped = [text.strip() for text in texts]
        encodings = self._inputs.encode_batch([t.lower() for t in stripped] if self._lower else stripped)
        return [{"input_ids": np.array(e.ids, dtype=np.int64),
                 "attention_mask": np.array(e.attention_mask, dtype=np.int64),
                 "token_type_ids": np.array(e.type_ids, dtype=np.int64)} for e in encodings]

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """The character span of each of `text`'s tokens (no special tokens)."""
        return self._tok.encode(text, add_special_tokens=False).offsets

    def windows(self, text: str, max_tokens: int, overlap: int = 0) -> list[tuple[int, int]]:
        """Character spans of windows of at most `max_tokens` tokens, `overlap` tokens shared."""
        offsets = self.offsets(text)
        step = max(1, max_tokens - max(0, min(overlap, max_tokens // 2)))
        spans: list[tuple[int, int]] = []
        for i in range(0, len(offsets), step):
            window = offsets[i : i + max_tokens]
            spans.append((window[0][0], window[-1][1]))
            if i + max_tokens >= len(offsets):
                break
        return spans


class SpanCounter:
    """`count(start, end)` == `tokenizer.count(text[start:end])`. Chunking asks for the counts of
    many nested spans of a section (its structure, paragraphs, lines, sentences): encoding each
    encoded the section's text 3.5 times over (19,467 encodings for the shared corpus's 1,728
    sections). A span cut at whitespace is counted from the text's one encoding; any other (a token
    window may end inside a word) is encoded on its own."""

    def __init__(self, tokenizer: Tokenizer, text: str):
        self._tok, self.text = tokenizer, text
        self._starts: list[int] | None = None
        if tokenizer.splits_on_whitespace:
            self._starts = [start for start, _ in tokenizer.offsets(text)]

    def _at_whitespace(self, i: int) -> bool:
        return i <= 0 or i >= len(self.text) or _bert_space(self.text[i - 1]) or _bert_space(self.text[i])

    def count(self, start: int, end: int) -> int:
        if self._starts is None or not (self._at_whitespace(start) and self._at_whitespace(end)):
            return self._tok.count(self.text[start:end])
        return bisect_left(self._starts, end) - bisect_left(self._starts, start)


def _bert_space(char: str) -> bool:
    """BERT's whitespace (Python's isspace() also takes control characters BERT deletes, which
    join the words either side of them)."""
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _sentence_config(path: Path) -> dict:
    config = path / "sentence_bert_config.json"
    return json.loads(config.read_text()) if config.is_file() else {}


def _max_seq_length(path: Path, config: dict) -> int:
    if "max_seq_length" in config:
        return int(config["max_seq_length"])
    tok_config = path / "tokenizer_config.json"
    if tok_config.is_file():
        value = json.loads(tok_config.read_text()).get("model_max_length", 512)
        return int(value) if value < 100_000 else 512
    return 512


def chunker_key(tokenizer: Tokenizer) -> str:
    """What decides the chunks cut with `tokenizer`: its definition and its input limit (a remote
    provider's `LimitedTokenizer` lowers the limit). Two providers with equal keys cut equal chunks."""
    return f"{tokenizer.definition_digest}:{tokenizer.limit}"


@lru_cache(maxsize=4)
def get_tokenizer(model_path: str) -> Tokenizer:
    return Tokenizer(model_path)
