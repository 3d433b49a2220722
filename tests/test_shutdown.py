"""A process that froze its heap for a quick exit still exits as before: same exit code, atexit
handlers run, unclosed files flushed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[1]

PROGRAM = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, flush=True))
from rag_lib.shutdown import skip_final_collections
before = atexit._ncallbacks()
skip_final_collections(); skip_final_collections()
print("handlers added:", atexit._ncallbacks() - before, flush=True)
out = open(sys.argv[1], "w"); out.write("kept")  # never closed
sys.exit(3)
"""


def test_a_frozen_exit_keeps_exit_code_handlers_and_unclosed_files(tmp_path):
    target = tmp_path / "out.txt"
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(target)], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 3, done.stderr
    assert "handlers added: 1" in done.stdout  # once per process, however often it is asked
    assert "frozen at exit: True" in done.stdout  # the heap is frozen before the final collections
    assert target.read_text() == "kept"
