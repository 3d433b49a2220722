"""The chunk-size suite's validation process and the caller's own script."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.subprocess

# A user's script without `if __name__ == "__main__"`: what calling the Dagster job from a
# script (materialize_corpus) does to the chunk check. Spawning a validation process would re-run
# this top level in the child, which Python refuses, and the check would fail.
SCRIPT = textwrap.dedent("""
    from rag_lib import quality

    print("top level ran", flush=True)
    quality.preload_great_expectations()
    rows = [{"chunk_id": "a", "token_count": 5, "text_chars": 1}, {"chunk_id": "b", "token_count": 900, "text_chars": 1}]
    results = quality.validate_chunk_frame(rows, 1, 256)
    bad = [r["expectation"] for r in results if not r["success"]]
    print("failed:", ",".join(bad), flush=True)
    print("validation process:", quality._validator is not None, flush=True)
""")


def test_unguarded_script_validates_in_its_own_process(tmp_path):
    script = tmp_path / "my_script.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={"GX_ANALYTICS_ENABLED": "false", "PATH": "/usr/bin:/bin",
                                             "PYTHONPATH": ":".join(sys.path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("top level ran") == 1  # the script's own work was not done twice
    assert "failed: expect_column_values_to_be_between" in done.stdout
    assert "validation process: False" in done.stdout  # validated in the script's own process


def test_a_guarded_script_validates_beside_itself(tmp_path):
    """A script that keeps its work under `if __name__ == "__main__"` may be re-imported by the
    spawned validation process: Great Expectations' import then runs beside the caller."""
    script = tmp_path / "my_script.py"
    body = textwrap.indent(SCRIPT.split("from rag_lib import quality", 1)[1], "    ")
    script.write_text("from rag_lib import quality\n\n\ndef main():\n" + body
                      + "\n\nif __name__ == \"__main__\":\n    main()\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={"GX_ANALYTICS_ENABLED": "false", "PATH": "/usr/bin:/bin",
                                             "PYTHONPATH": ":".join(sys.path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("top level ran") == 1
    assert "failed: expect_column_values_to_be_between" in done.stdout
    assert "validation process: True" in done.stdout


def test_an_unused_validation_process_is_stopped_and_a_used_one_kept():
    """`discard_unused_validator` ends a validation process no frame was validated in, without
    waiting for its import (`rag materialize` starts it before knowing whether a run here needs
    it); one that validated a frame stays for the process's later checks."""
    from rag_lib import quality

    quality._stop_validator()
    quality.preload_great_expectations()
    (worker,) = quality._validator._processes.values()
    quality.discard_unused_validator()
    assert quality._validator is None
    assert worker.exitcode == -9  # killed during its import, not waited for

    rows = [{"chunk_id": "a", "token_count": 5, "text_chars": 1}]
    quality.preload_great_expectations()
    assert all(r["success"] for r in quality.validate_chunk_frame(rows, 1, 256))
    used = quality._validator
    quality.discard_unused_validator()
    assert quality._validator is used
    quality._stop_validator()


def test_an_idle_priority_validation_process_imports_on_spare_cpu_and_is_killed_when_unused():
    """A Dagster run that encodes starts the validation process at idle priority (its import takes
    only CPU nothing else wants); never used, it is killed when stopped, not waited for (on a busy
    machine its import may not end)."""
    import os

    from rag_lib import quality

    if not quality.can_validate_at_idle_priority():
        pytest.skip("needs SCHED_IDLE and leave to undo it")
    quality._stop_validator()
    quality.preload_great_expectations(idle=True)
    (worker,) = quality._validator._processes.values()
    assert os.sched_getscheduler(worker.pid) == os.SCHED_IDLE
    quality._stop_validator()
    assert quality._validator is None
    assert worker.exitcode == -9  # killed during its import, not waited for


def _loaded_scipy(pid: int) -> bool:
    # Great Expectations' import loads scipy's compiled modules (scipy.stats); their shared objects
    # show in the process's memory map, read from outside without asking the process (a task
    # submitted to it would itself wait for the import, whether or not we waited)
    with open(f"/proc/{pid}/maps") as maps:
        return "/scipy/" in maps.read()


def test_waiting_for_the_validation_process_returns_once_it_has_imported():
    """`wait_for_validator` (benchmarks/ingest.py, as `rag materialize` starts) returns when the
    process has imported Great Expectations, and at once when none was started; it validates
    nothing, so the process still counts as unused (`discard_unused_validator` ends it)."""
    from rag_lib import quality

    quality._stop_validator()
    quality.wait_for_validator()  # none started: returns
    assert quality._validator is None
    quality.preload_great_expectations()
    try:
        (worker,) = quality._workers(quality._validator)
        quality.wait_for_validator()
        assert _loaded_scipy(worker.pid)
        assert not quality._validator_used
        quality.discard_unused_validator()
        assert quality._validator is None
    finally:
        quality._stop_validator()


def test_a_long_cell_is_cut_with_an_ellipsis_and_a_pipe_stays_escaped():
    """The UI's tables (checks, warnings): a cut cell says it was cut (a metadata warning read
    "…so ticker |", as if it ended there), and a cut never splits a pipe's escape."""
    from rag_lib.quality import CELL_CHARS, markdown_table

    row = markdown_table([{"warning": "w" * 300, "path": "a|b"}], ["warning", "path"]).splitlines()[2]
    cells = row.split(" | ")
    assert cells[0].endswith("…") and len(cells[0]) == len("| ") + CELL_CHARS
    assert cells[1] == "a\\|b |"
    assert markdown_table([{"w": "|" * 500}], ["w"]).splitlines()[2].count("\\|") == CELL_CHARS - 1


# A Dagster run worker that starts the validation process, reports its pid, then waits to be killed.
KILLED_CALLER = textwrap.dedent("""
    import sys, time
    from rag_lib import quality

    if __name__ == "__main__":
        quality.preload_great_expectations()
        quality.wait_for_validator()
        (worker,) = quality._validator._processes.values()
        print(worker.pid, flush=True)
        time.sleep(600)
""")


def test_the_validation_process_ends_when_its_caller_is_killed(tmp_path):
    """A caller killed outright (SIGKILL: a run worker stopped by the OOM killer or by hand) runs no
    finaliser; its validation process used to sleep on as an orphan holding ~270 MB."""
    import os
    import signal
    import time

    script = tmp_path / "caller.py"
    script.write_text(KILLED_CALLER)
    caller = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={"GX_ANALYTICS_ENABLED": "false", "PATH": "/usr/bin:/bin",
                                   "PYTHONPATH": ":".join(sys.path)})
    try:
        worker = int(caller.stdout.readline())
        os.kill(caller.pid, signal.SIGKILL)
        caller.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(worker):
            time.sleep(0.2)
        assert not _alive(worker), "the validation process outlived its killed caller"
    finally:
        caller.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
