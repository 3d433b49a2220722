"""Generated text for benchmark collections: word-level Markov chains (order 2) trained on real text.

Each source (a real document type, or SciFact abstracts) gets its own chain, so generated chunks keep
the vocabulary, phrasing and topic spread of their source and cluster like real embeddings do.
Deterministic for a given seed and training text.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict

_WORD = re.compile(r"\S+")
_END = (".", "!", "?")


class MarkovText:
    """An order-2 word chain over one body of text."""

    def __init__(self, texts: list[str]):
        self.next: dict[tuple[str, str], list[str]] = defaultdict(list)
        self.starts: list[tuple[str, str]] = []
        for text in texts:
            words = _WORD.findall(text)
            for i in range(len(words) - 2):
                key = (words[i], words[i + 1])
                self.next[key].append(words[i + 2])
                if i == 0 or words[i - 1].endswith(_END):
                    self.starts.append(key)
        if not self.starts:
            raise ValueError("no training text")

    def paragraph(self, rng: random.Random, min_words: int, max_words: int) -> str:
        """Sentences of generated text, stopping at a sentence end once `min_words` are out."""
        words = list(rng.choice(self.starts))
        while len(words) < max_words:
            options = self.next.get((words[-2], words[-1]))
            if not options:  # dead end: start a new sentence
                words.extend(rng.choice(self.starts))
                continue
            words.append(rng.choice(options))
            if len(words) >= min_words and words[-1].endswith(_END):
                break
        return " ".join(words)
