"""Flattening to readable sections and chunking within the model's real token limit."""

from __future__ import annotations


import pytest

from rag_lib.chunking import Chunker, context_prefix
from rag_lib.config import ChunkSettings, Settings
from rag_lib.documents import iter_corpus_files, load_file
from rag_lib.flatten import flatten, flatten_markdown, load_mapping
from rag_lib.models import Document, Skipped
from rag_lib.tokens import get_tokenizer
from rag_lib.embedding.local import default_model_path

from conftest import SHARED_CORPUS


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer(default_model_path())


@pytest.fixture(scope="module")
def mapping():
    return load_mapping(Settings().sections_file)


def load(rel: str) -> tuple[Document, str]:
    path = SHARED_CORPUS / rel
    doc = load_file(path, SHARED_CORPUS, "default", 10**7)[0]
    assert isinstance(doc, Document)
    return doc, path.read_text()


def test_yaml_sections_are_readable_and_skip_bookkeeping(mapping):
    doc, raw = load("tradegent/knowledge/analysis/stock/PFE_20250118T1400.yaml")
    sections = {s.name: s for s in flatten(doc, mapping, raw)}
    assert "_indexing" not in sections  # machine bookkeeping
    # descriptor sections: what the document is (search weighs them down, README "Descriptor sections")
    assert sections["ticker"].text == "ticker: PFE" and "type: stock-analysis" in sections["_meta"].text
    catalyst = sections["phase1_catalyst"]
    assert catalyst.title == "Catalyst"
    assert "thesis wrong if: Dividend cut announced" in catalyst.text
    assert catalyst.line == 14  # where the key starts in the file
    for s in sections.values():
        assert "{'" not in s.text and "None" not in s.text and "[]" not in s.text


def test_null_stub_sections_are_kept_as_empty_and_never_chunked(mapping, tokenizer):
    doc, raw = load("tradegent/knowledge/analysis/stock/PFE_20250118T1400.yaml")
    sections = flatten(doc, mapping, raw)
    empty = [s.name for s in sections if s.is_empty]
    assert "bear_case_analysis" in empty and "do_nothing_gate" in empty
    chunks = Chunker(tokenizer, ChunkSettings()).chunk(doc, sections)
    assert not {c.section for c in chunks} & set(empty)


def test_a_chunk_is_named_after_the_top_level_key_or_heading_it_lies_under(mapping, tokenizer):
    """A chunk's section path named the key of its first line, however deep ("phase5_probability >
    probability" for the tail of a scenario), and in markdown a code line or a bold label ("Scenario 3:
    Scanner Alerts with React Query > const displayAlerts = wsConnected ? alerts")."""
    chunker = Chunker(tokenizer, ChunkSettings())
    doc, raw = load("tradegent/knowledge/analysis/earnings/NFLX_20250118T0800.yaml")
    sections = {s.name: s for s in flatten(doc, mapping, raw)}
    chunks = chunker.chunk(doc, list(sections.values()))
    named = [c for c in chunks if " > " in c.section_path]
    assert named
    for c in named:
        top_keys = {line.split(":")[0] for line in sections[c.section].text.splitlines() if line[:1].strip()}
        assert c.section_path.split(" > ", 1)[1] in top_keys, c.section_path
    tail = next(c for c in chunks if c.section == "phase5_probability" and c.text.startswith("    "))
    assert tail.section_path == "phase5_probability > scenarios"
    doc, raw = load("tradegent-docs/docs/CLIENT_USAGE_EXAMPLES.md")
    sections = {s.name: s for s in flatten(doc, mapping, raw)}
    for c in chunker.chunk(doc, list(sections.values())):
        if " > " in c.section_path:
            assert "### " + c.section_path.split(" > ", 1)[1] in sections[c.section].text, c.section_path


def test_markdown_splits_on_h2_outside_code_fences():
    text = "---\ntitle: x\n---\n# Title\nintro text\n## First\nbody\n```\n## not a heading\n```\n### Sub\nmore\n## Second\nend\n"
    sections = flatten_markdown(text)
    assert [s.name for s in sections] == ["_intro", "First", "Second"]
    assert "## not a heading" in sections[1].text and "### Sub" in sections[1].text
    assert text[sections[1].char_start:].startswith("## First")


def test_a_heading_written_again_names_a_section_of_its_own(mapping, tokenizer):
    """A section's name is its unit id and its key in the store: a heading met again is 'A (2)' (one
    the document writes itself, 'A (2)' here, keeps its name), its title stays as written, and
    every chunk id of the document is its own, also for a note pasted twice."""
    text = "# Desk\n\n## A\n\nSized down.\n\n## A\n\nSized down.\n\n## A (2)\n\nAdded back.\n\n## A\n\nFlat.\n"
    doc = Document("c", "desk.md", "desk.md", "note", "markdown", "h", text)
    sections = flatten(doc, mapping)
    assert [(s.name, s.title) for s in sections] == [
        ("_intro", "_intro"), ("A", "A"), ("A (3)", "A"), ("A (2)", "A (2)"), ("A (4)", "A")]
    chunks = Chunker(tokenizer, ChunkSettings()).chunk(doc, sections)
    assert len({c.chunk_id for c in chunks}) == len(chunks) == 5
    assert chunks[1].embed_text == chunks[2].embed_text  # the same text, embedded (and cached) once


def test_no_chunk_exceeds_the_model_limit_across_the_shared_corpus(mapping, tokenizer):
    chunker = Chunker(tokenizer, ChunkSettings())
    total = 0
    for path in iter_corpus_files(SHARED_CORPUS):
        for doc in load_file(path, SHARED_CORPUS, "default", 10**7):
            if isinstance(doc, Skipped):
                continue
            sections = {s.name: s for s in flatten(doc, mapping, path.read_text() if doc.format == "yaml" else None)}
            for chunk in chunker.chunk(doc, list(sections.values())):
                total += 1
                assert tokenizer.count(chunk.embed_text) <= tokenizer.limit == 254, chunk.unit_id
                assert chunk.token_count == tokenizer.count(chunk.embed_text)
                # the chunk is an exact span of its section: nothing rewritten or truncated
                section = sections[chunk.section]
                offset = chunk.char_start - section.char_start
                assert section.text[offset:offset + len(chunk.text)] == chunk.text
                assert chunk.embed_text.endswith(chunk.text)
                assert chunk.embed_text.startswith(f"[{doc.doc_type}]")
    assert total > 2500


def test_long_sections_are_covered_completely_with_overlap(tokenizer):
    paragraphs = [f"Paragraph {i}. " + " ".join(f"word{i}x{j}" for j in range(60)) for i in range(12)]
    text = "## Long\n" + "\n\n".join(paragraphs) + "\n"
    doc = Document("c", "long.md", "long.md", "note", "markdown", "h", text)
    sections = flatten_markdown(text)
    chunker = Chunker(tokenizer, ChunkSettings(max_tokens=200, overlap_tokens=120))
    chunks = chunker.chunk(doc, sections)
    assert len(chunks) > 3
    covered = set()
    for c in chunks:
        covered.update(range(c.char_start, c.char_end))
    missing = [i for i, ch in enumerate(text) if not ch.isspace() and i not in covered]
    assert not missing, f"characters not in any chunk: {text[missing[0]:missing[0] + 40]!r}"
    assert any(chunks[i].char_end > chunks[i + 1].char_start for i in range(len(chunks) - 1)), "no overlap"
    assert len({c.chunk_id for c in chunks}) == len(chunks)
    assert [c.chunk_id for c in chunker.chunk(doc, flatten_markdown(text))] == [c.chunk_id for c in chunks]


def test_tables_and_code_blocks_stay_whole_when_they_fit(tokenizer):
    table = "| a | b |\n|---|---|\n" + "".join(f"| r{i} | v{i} |\n" for i in range(20))
    code = "```python\n" + "\n\n".join(f"x{i} = {i}" for i in range(15)) + "\n```\n"
    filler = "\n\n".join("Filler sentence number %d goes here with some words." % i for i in range(30))
    text = f"## Data\n{filler}\n\n{table}\n{filler}\n\n{code}\n{filler}\n"
    doc = Document("c", "t.md", "t.md", "note", "markdown", "h", text)
    chunks = Chunker(tokenizer, ChunkSettings(max_tokens=200)).chunk(doc, flatten_markdown(text))
    assert any(table.strip() in c.text for c in chunks), "table was split"
    assert any(code.strip() in c.text for c in chunks), "code block was split"


def test_oversize_single_line_is_split_by_tokens_not_truncated(tokenizer):
    words = " ".join(f"token{i}" for i in range(900))
    text = f"## One line\n{words}\n"
    doc = Document("c", "w.md", "w.md", "note", "markdown", "h", text)
    chunks = Chunker(tokenizer, ChunkSettings()).chunk(doc, flatten_markdown(text))
    assert all(c.token_count <= tokenizer.limit for c in chunks)
    assert "token0 " in chunks[0].text and chunks[-1].text.rstrip().endswith("token899")


def test_span_counts_equal_each_span_encoded_alone(tokenizer):
    """The chunker counts a section's nested spans from one encoding of it: every span, cut at
    whitespace or inside a word, next to characters BERT deletes or treats as space, CJK and
    accents, must count what encoding it alone would."""
    text = ("Q3 rev +12% y/y;  ÉTÉ naïve\tcafé\n\n  NVDA's H100\u00a0demand\x1cjoined 東京証券 取引所.\r\n"
            "supercalifragilisticexpialidocious-ly (ok)\u3000end. ") * 2
    counter = tokenizer.span_counter(text)
    assert tokenizer.splits_on_whitespace and counter.count(0, len(text)) == tokenizer.count(text)
    for start in range(0, len(text) + 1, 3):
        for end in range(start, len(text) + 1):
            assert counter.count(start, end) == tokenizer.count(text[start:end]), (start, end, text[start:end])


def test_a_heading_and_the_paragraph_after_it_over_the_limit_together_are_chunked(tokenizer):
    """A long title line and the paragraph under it that fit the model only apart: the heading
    rule re-packed them into the same overflowing chunk forever, and ingest hung (found on a
    SciFact abstract under its `# title`). Each must become a chunk within the limit."""
    import signal

    title = "# " + " ".join(f"zinc-finger nuclease {i}" for i in range(12))
    words: list[str] = []
    doc = Document("c", "n.md", "n.md", "note", "markdown", "h", title)
    prefix = tokenizer.count(context_prefix(doc, flatten_markdown(f"{title}\n\nx\n")[0]) + "\n")
    budget = min(ChunkSettings().max_tokens, tokenizer.limit) - prefix
    # a paragraph short enough that the re-split's tighter budget keeps it whole, too long to join the title
    room = (budget + tokenizer.limit - prefix - tokenizer.count(title) - 8) // 2
    while tokenizer.count(" ".join(words + ["gene"]) + ".") <= room:
        words.append("gene")
    text = f"{title}\n\n{' '.join(words)}.\n"
    section = flatten_markdown(text)[0]
    assert prefix + tokenizer.count(section.text) > tokenizer.limit  # but not with the title
    doc = Document("c", "n.md", "n.md", "note", "markdown", "h", text)

    def hung(*_):
        raise TimeoutError("chunking did not finish")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        chunks = Chunker(tokenizer, ChunkSettings()).chunk(doc, flatten_markdown(text))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert [c.text.split("\n")[0] for c in chunks] == [title, " ".join(words) + "."]
    assert all(c.token_count == tokenizer.count(c.embed_text) <= tokenizer.limit for c in chunks)
