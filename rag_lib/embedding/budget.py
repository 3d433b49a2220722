"""Token counts for remote models without tiktoken (it downloads its encodings at run time, so it
cannot work offline). Counts come from a local tokenizer: the remote model's own when
`tokenizer_path` is set (exact), otherwise the local model's WordPiece tokenizer (an estimate).
The per-input limit is enforced with a proof where possible: a BPE token covers at least one UTF-8
byte, so a text of ≤ L bytes has ≤ L tokens; longer texts must fit with a 1.5× safety margin on
the estimate, else they are refused before any request is made."""

from __future__ import annotations

from rag_lib.errors import EmbeddingError
from rag_lib.tokens import Tokenizer

SAFETY = 1.5  # estimate margin when the byte bound cannot prove a text fits


class TokenBudget:
    """Counts tokens and refuses inputs that could exceed the provider's real per-input limit."""

    def __init__(self, tokenizer: Tokenizer, max_input_tokens: int, exact: bool, label: str):
        self.tokenizer = tokenizer
        self.max_input_tokens = max_input_tokens
        self.exact = exact
        self.label = label

    def count(self, texts: list[str]) -> list[int]:
        """Token estimates (exact with the model's own tokenizer), +2 for special tokens."""
        return [n + 2 for n in self.tokenizer.count_many(texts)] if texts else []

    def provably_fits(self, text: str) -> bool:
        """Every token covers at least one UTF-8 byte, so bytes (+2 special tokens) bound the count."""
        return len(text.encode("utf-8")) + 2 <= self.max_input_tokens

    def check(self, texts: list[str]) -> None:
        """Raise EmbeddingError for any text that might not fit; tokenizes only texts the byte
        bound cannot clear (none, with default chunk sizes and OpenAI's 8,191-token limit)."""
        doubtful = [i for i, text in enumerate(texts) if not self.provably_fits(text)]
        for i, n in zip(doubtful, self.count([texts[i] for i in doubtful])):
            fits = n <= self.max_input_tokens if self.exact else n * SAFETY <= self.max_input_tokens
            if not fits:
                raise EmbeddingError(
                    f"{self.label}: input {i} has about {n} tokens ({len(texts[i])} characters), over the provider's "
                    f"limit of {self.max_input_tokens}; lower chunking.max_tokens (nothing was sent)"
                )


class LimitedTokenizer:
    """A tokenizer whose `limit` is also capped by the remote provider's per-input limit (with the
    safety margin when counts are estimates), so the chunker never makes a chunk the provider refuses."""

    def __init__(self, tokenizer: Tokenizer, max_input_tokens: int, exact: bool):
        self._tok = tokenizer
        cap = max_input_tokens - 2 if exact else int(max_input_tokens / SAFETY) - 2
        self.limit = max(1, min(tokenizer.limit, cap))

    def __getattr__(self, name: str):
        return getattr(self._tok, name)
