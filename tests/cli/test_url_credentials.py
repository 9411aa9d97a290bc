"""A password inside ``--base-url`` (``http://user:password@host/v1``) lands nowhere (issue #31):
not in the journal, the tree, the report, the terminal, a log line or an error message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

import kerngen.cli.app
from kerngen import redact
from tests.cli_output import stderr_of
from tests.fakes.llm_server import ChatServer, Reply, closed_port, softmax_spec_dict

PASSWORD = "hunter2-url-password-77"
ENCODED = "p%40ss-w0rd-encoded-99"  # percent-encoded in the URL: 'p@ss-w0rd-encoded-99' decoded


def _leaks(text: str) -> list[str]:
    return [s for s in (PASSWORD, ENCODED, "p@ss-w0rd-encoded-99", "kuser:") if s in text]


def test_redact_takes_the_userinfo_out_of_every_url():
    text = f"GET http://kuser:{PASSWORD}@h:1/v1 and https://{ENCODED}@h/v1, not https://h/a@b"
    out = redact.redact(text)
    assert not _leaks(out) and "http://[redacted]@h:1/v1" in out and "https://h/a@b" in out
    redact.register_url(f"https://kuser:{PASSWORD}@example.test/v1")
    assert redact.redact(f"the password {PASSWORD} alone") == "the password [redacted] alone"


def test_a_search_with_credentials_in_the_base_url_leaves_them_nowhere(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key-0123456789")
    runner = CliRunner()

    def answer(req):
        fmt = (req.body or {}).get("response_format") or {}
        if fmt.get("json_schema", {}).get("name") == "IdeaList":
            return Reply.completion(json.dumps({"ideas": [{"text": "one block per row", "category": "memory_access"}]}))
        return Reply.completion(json.dumps(softmax_spec_dict()))

    outputs = []
    with ChatServer() as server:
        server.default = answer
        url = server.url.replace("http://", f"http://kuser:{PASSWORD}@")
        args = ["generate", "softmax", "--shape", "8x64", "--model", "m", "--base-url", url, "--evaluator", "scripted",
                "--rounds", "1", "--beam", "1", "--ideas", "1", "--branches", "1", "--runs-dir", str(tmp_path / "runs")]
        monkeypatch.setattr(sys, "argv", ["kerngen", *args])  # what the journal records as the command line
        res = runner.invoke(kerngen.cli.app.app, args)
        outputs.append(res.output + stderr_of(res))
        assert res.exit_code == 0, outputs[-1]
        assert server.chat_requests  # the endpoint was used
    (run,) = (tmp_path / "runs").iterdir()
    for args in (["show", str(run)], ["report", str(run), "-o", str(tmp_path / "r.html")], ["runs", "--runs-dir",
                                                                                             str(tmp_path / "runs")]):
        res = runner.invoke(kerngen.cli.app.app, args)
        assert res.exit_code == 0, res.output
        outputs.append(res.output + stderr_of(res))
    journal = (run / "events.jsonl").read_text()
    assert "--base-url" in journal and "[redacted]@" in journal  # the argv is recorded, without the password
    files = [p for p in [*run.rglob("*"), tmp_path / "r.html", *(tmp_path / "cache").rglob("*")] if p.is_file()]
    for p in files:
        assert not _leaks(p.read_bytes().decode("utf-8", "replace")), p
    for out in outputs:
        assert not _leaks(out), out


def test_an_unreachable_endpoint_with_credentials_fails_in_one_clean_line(tmp_path):
    url = f"http://kuser:{ENCODED}@127.0.0.1:{closed_port()}/v1"
    env = {**os.environ, "KERNGEN_CACHE_DIR": str(tmp_path / "cache"), "KERNGEN_LOG_LEVEL": "INFO",
           "OPENAI_API_KEY": "sk-test-key-0123456789", "OPENAI_BASE_URL": f"http://kuser:{PASSWORD}@127.0.0.1:9/v1"}
    proc = subprocess.run([sys.executable, "-m", "kerngen", "generate", "softmax", "--model", "m", "--base-url", url,
                           "--evaluator", "scripted", "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=300, env=env, cwd=Path(__file__).parents[2])
    assert proc.returncode != 0 and "error:" in proc.stderr, proc.stderr
    assert not _leaks(proc.stdout + proc.stderr), proc.stderr
