"""Ctrl-C in the middle of an LLM search loses nothing and prints no traceback (issue 37, item 2):
``kerngen generate --dry-run`` in a subprocess against the local chat server, SIGINT while
requests are in flight; every request the endpoint saw is in the journal (those in flight with
their tokens estimated), and the run says it was interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from kerngen.agent.tree import load_run
from tests.fakes.llm_server import ChatServer, Reply, softmax_spec_dict

IDEAS = {"analysis": "-", "ideas": [{"text": f"idea {i}", "category": "memory_access"} for i in range(3)]}


def model(req) -> Reply:
    user = next(m["content"] for m in req.body["messages"] if m["role"] == "user")
    if "single word OK" in user:
        return Reply.completion("OK")
    if user.startswith("# Round"):
        return Reply.completion(json.dumps(IDEAS))
    return Reply.completion(json.dumps(softmax_spec_dict()), delay_s=20.0, prompt_tokens=3000, completion_tokens=800)


def test_sigint_mid_llm_search_journals_every_request_and_prints_no_traceback(tmp_path):
    env = {**os.environ, "KERNGEN_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "200"}
    with ChatServer() as server:
        server.default = model
        proc = subprocess.Popen(
            [sys.executable, "-m", "kerngen", "generate", "softmax", "--dry-run", "--proposer", "llm", "--model", "m",
             "--base-url", server.url, "--rounds", "1", "--ideas", "3", "--branches", "2", "--repairs", "0",
             "--no-playbook-seed", "--llm-concurrency", "4", "--price-in", "1", "--price-out", "2",
             "--runs-dir", str(tmp_path / "runs")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            deadline = time.monotonic() + 120
            while server.in_flight < 4 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
            assert server.in_flight == 4, "the implement requests never got in flight"
            t0 = time.monotonic()
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
            waited = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
        seen = len(server.chat_requests)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err + out and "hook failed" not in err and "JournalError" not in err, err
    assert "interrupted: run" in err and "--resume" in err
    assert waited < 10, waited  # the 20 s answers in flight were not waited for
    (journal,) = list((tmp_path / "runs").rglob("events.jsonl"))
    run = load_run(journal.parent)
    records = [e.record for e in run.events if e.type == "llm_call"]
    assert sum(r["attempts"] for r in records) == seen  # every request the endpoint saw, the check included
    interrupted = [r for r in records if r["cause"] == "interrupted"]
    assert len(interrupted) == 4 and all(r["usage"]["estimated_tokens"] > 0 for r in interrupted)
    assert run.finished is not None and run.finished.stop.value == "interrupted"
    assert run.finished.usage["llm_calls"] == seen and run.finished.usage["cost_usd"] > 0
