"""Stage 04's --engine openai against servers that misbehave as real ones do (harness/openai_generation.py):
one that drips its answer a byte at a time (--api-timeout is the whole request's deadline), one that
redirects to another origin (the key's header goes nowhere else), one that echoes the key (no file, line or
log holds it, nor a part of it), answers of the wrong shape (one line naming the field, at the check or as
a failed prompt), and a malformed key (refused without being quoted). The servers are the tests' own, on
127.0.0.1 (tests/test_openai_engine.py's, scripted per request here); each drips for a bounded time.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import sys
import threading
import time

import pytest
from test_openai_engine import (
    MODEL,
    TASKS,
    ReferenceHandler,
    ReferenceServer,
    completion,
    ev,
    read_jsonl,
    reference_server,
    stage_04,
)

from cuset_common import cli
from research.comparison import runner

KEY = "sk-hostile-0123456789abcdefghijKLMNOP"
# A dripping server sends a byte this often, and stops after DRIP_FOR_S (a client it holds is let go then).
DRIP_EVERY_S, DRIP_FOR_S = 0.2, 15.0
# The longest a request cut off by --api-timeout 1 may take here (2 shared cores): well under DRIP_FOR_S.
CUT_OFF_WITHIN_S = 4.0


@pytest.fixture(autouse=True)
def own_secrets(monkeypatch):
    """A secret registry of the test's own (cli.SECRETS): what another test registered does not redact
    here, and what this one registers goes with it."""
    monkeypatch.setattr(cli, "SECRETS", set())


def key_parts(key: str) -> set[str]:
    """Every run of 8 characters of the key, in each form a message could quote it in (as it is, stripped,
    escaped): a text holding none of them holds no recognisable part of it."""
    forms = {key, key.strip(), repr(key)[1:-1]}
    return {form[i : i + 8] for form in forms for i in range(len(form) - 7)}


def assert_no_key(text: str, key: str = KEY) -> None:
    leaked = sorted(part for part in key_parts(key) if part in text)
    assert not leaked, f"parts of the key: {leaked[:3]}"


# ---------------------------------------------------------------------------------------
# A server scripted per request: the models list, the logprobs probe, each prompt
# ---------------------------------------------------------------------------------------


class HostileServer(ReferenceServer):
    """ReferenceServer whose `script` says what to do with a request: "models" (GET /v1/models), "probe"
    (the engine's one-token request), a prompt (task id, level), or "prompts" (every prompt); each an
    action(handler). A request the script does not name gets ReferenceServer's answer."""

    def __init__(self, script: dict):
        super().__init__({}, 0.0)
        self.RequestHandlerClass = HostileHandler
        self.script = script


class HostileHandler(ReferenceHandler):
    server: HostileServer

    def do_GET(self):
        action = self.server.script.get("models")
        if action is None:
            return super().do_GET()
        self.server.authorizations.append(self.headers.get("Authorization"))
        action(self)

    def do_POST(self):
        self.server.authorizations.append(self.headers.get("Authorization"))
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = self.server.prompts.get(request["messages"][-1]["content"])
        if prompt is not None:
            self.server.asked.append((prompt[0]["id"], prompt[1]))
        where = "probe" if prompt is None else (prompt[0]["id"], prompt[1])
        action = self.server.script.get(where) or (prompt and self.server.script.get("prompts"))
        if action is not None:
            return action(self)
        if prompt is None:
            return self.answer(200, json.dumps(completion(["OK"], 1)).encode())
        kernels = prompt[0]["kernel_mode"]["reference_kernels"]
        self.answer(200, json.dumps(completion([f"```cuda\n{kernels}\n```"] * request["n"], 10)).encode())


@contextlib.contextmanager
def hostile_server(script: dict):
    server = HostileServer(script)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def answer_json(value, status: int = 200, headers: dict | None = None):
    return lambda handler: handler.answer(status, json.dumps(value).encode(), headers)


def answer_raw(body: bytes):
    return lambda handler: handler.answer(200, body)


def drip(head: bool):
    """A 200 whose body (head=False: after the status line and headers) or whose header lines (head=True)
    come a byte every DRIP_EVERY_S, for DRIP_FOR_S at most: every socket read gets a byte well within
    --api-timeout, so only a deadline on the whole request ends it."""

    def action(handler: http.server.BaseHTTPRequestHandler) -> None:
        start = b"HTTP/1.1 200 OK\r\nX-Slow: " if head else b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
        with contextlib.suppress(ConnectionError):
            handler.wfile.write(start)
            stop = time.monotonic() + DRIP_FOR_S
            while time.monotonic() < stop:
                handler.wfile.write(b"x" if head else b" ")
                time.sleep(DRIP_EVERY_S)
        handler.close_connection = True

    return action


def check_refused(argv: list[str], capsys) -> str:
    """Stage 04 as the command line runs it: exit 2, one `error:` line and no traceback; returns the line."""
    capsys.readouterr()
    code = ev.run_main(ev.main, argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def generation_errors(out) -> list[str]:
    return [e["error"] for e in json.loads((out / "summary.json").read_text())["generation"]["errors"]]


# ---------------------------------------------------------------------------------------
# 1. --api-timeout is the whole request's deadline
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_server_that_drips_its_answers_gets_generation_error_rows_at_the_deadline(tmp_path):
    """Every prompt's answer drips a byte every 0.2 s: with --api-timeout 1 each request ends after about
    a second, its rows `generation_error` saying so, where a limit per socket read waited for ever."""
    out = tmp_path / "ev"
    with hostile_server({"prompts": drip(head=False)}) as server:
        started = time.monotonic()
        argv = stage_04(out, server.base_url, "--api-timeout", "1", "--api-retries", "0")
        assert ev.main(argv) == 0
        took = time.monotonic() - started
    rows = read_jsonl(out / "results.jsonl")
    assert len(rows) == 6 and all(r["outcome"] == "generation_error" for r in rows)
    assert all("no complete answer from" in r["generation_error"] for r in rows)
    assert all("within --api-timeout" in r["generation_error"] for r in rows)
    generation = json.loads((out / "summary.json").read_text())["generation"]
    assert generation["seconds"] < CUT_OFF_WITHIN_S and took < DRIP_FOR_S, (generation["seconds"], took)


def test_a_server_that_drips_its_header_lines_is_one_line_at_the_deadline(tmp_path, capsys):
    """The logprobs probe's status line comes, then a header line a byte at a time: with --api-timeout 1
    and no retry the run stops in about a second, in one line, before any output."""
    with hostile_server({"probe": drip(head=True)}) as server:
        started = time.monotonic()
        argv = stage_04(tmp_path / "o", server.base_url, "--api-timeout", "1", "--api-retries", "0")
        line = check_refused([*argv, "--generate-only"], capsys)
        took = time.monotonic() - started
    assert f"no complete answer from {server.base_url}/chat/completions within --api-timeout" in line
    assert took < DRIP_FOR_S - 5, took


# ---------------------------------------------------------------------------------------
# 2. The key: refused when malformed, sent nowhere else, in no file, line or log
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "said"),
    [
        (KEY + "\r", "a carriage return (\\r) at its end"),
        (KEY[:10] + "\n" + KEY[10:], f"a line feed (\\n) at character 11 of {len(KEY) + 1}"),
        (" " + KEY, "a space at character 1"),
        (KEY + "\u00e9", "a character outside ASCII at its end"),
        (KEY[:20] + "\u20ac" + KEY[20:], "a character outside ASCII at character 21"),
        (KEY + "\x1b", "a control character at its end"),
    ],
)
def test_a_malformed_key_is_refused_up_front_without_quoting_it(tmp_path, capsys, monkeypatch, key, said):
    """A key with a \\r, a line end, a space or a character outside ASCII: one line naming the variable and
    what is wrong, no part of the key, no request sent, nothing written."""
    monkeypatch.setenv("OPENAI_API_KEY", key)
    with hostile_server({}) as server:
        line = check_refused(stage_04(tmp_path / "o", server.base_url), capsys)
    assert line.startswith(f"error: OPENAI_API_KEY holds {said}"), line
    assert_no_key(line, key)
    assert server.authorizations == [] and not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_redirect_to_another_origin_is_not_followed_and_the_key_goes_nowhere_else(
    tmp_path, capsys, monkeypatch
):
    """A server (127.0.0.1, one port) redirects /models, then every prompt, to a second server (another
    port: another origin) that records the headers it gets: the check is one line naming the redirect, the
    prompts are failed rows, and the second server never sees a request, so never the key."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with reference_server({}) as elsewhere:
        to = {"Location": f"{elsewhere.base_url}/models"}
        with hostile_server({"models": answer_json({}, 302, to)}) as server:
            line = check_refused(stage_04(tmp_path / "o", server.base_url), capsys)
        assert f"HTTP 302 from {server.base_url}/models: redirected to {elsewhere.base_url}/models" in line
        assert "no redirect is followed" in line and not (tmp_path / "o").exists()

        to = {"Location": f"{elsewhere.base_url}/chat/completions"}
        with hostile_server({"prompts": answer_json({}, 302, to)}) as server:
            out = tmp_path / "ev"
            assert ev.main(stage_04(out, server.base_url, "--api-retries", "0", "--generate-only")) == 0
    assert len(server.asked) == 6 and set(server.authorizations) == {f"Bearer {KEY}"}
    errors = generation_errors(out)
    assert len(errors) == 6 and all("HTTP 302" in e and "no redirect is followed" in e for e in errors)
    assert elsewhere.authorizations == []


def test_an_error_quoting_the_key_cut_off_inside_it_holds_no_part_of_it(tmp_path, capsys, monkeypatch):
    """A 401 whose message quotes the key where the error line's quote of it ends (200 characters): the
    line holds neither the key nor the start of it that a cut would leave."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    said = {"error": "e" * 150 + f" Incorrect API key provided: {KEY}"}  # the key from character 190
    with hostile_server({"models": answer_json(said, 401)}) as server:
        line = check_refused(stage_04(tmp_path / "o", server.base_url), capsys)
    assert line.startswith(f"error: --base-url {server.base_url}: HTTP 401 from {server.base_url}/models")
    assert_no_key(line)


@pytest.mark.slow
def test_a_server_echoing_the_key_puts_it_in_no_file_and_no_line(tmp_path, capsys, monkeypatch):
    """Three prompts answered 500 with the request's Authorization header in the message, three with the
    key in the reply: stage 04's results, completions, summaries and printed lines hold no part of it (the
    replies' copies of it redacted)."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    a, b = (t["id"] for t in TASKS)
    echo = answer_json({"error": f"unknown header Authorization: Bearer {KEY}"}, 500)
    reply = answer_json(completion([f"Your key is {KEY}, no code today."], 9))
    script = {(a, 1): echo, (a, 2): echo, (a, 3): echo, "prompts": reply}
    out = tmp_path / "ev"
    with hostile_server(script) as server:
        assert ev.main(stage_04(out, server.base_url, "--api-retries", "0")) == 0
    rows = read_jsonl(out / "results.jsonl")
    assert sum(r["outcome"] == "generation_error" and "HTTP 500" in r["generation_error"] for r in rows) == 3
    completions = read_jsonl(out / "completions.jsonl")
    assert len(completions) == 3 and all(cli.REDACTED in c["completion"] for c in completions)
    for path in [p for p in out.rglob("*") if p.is_file()]:
        assert_no_key(path.read_bytes().decode("utf-8", "replace"))
    assert_no_key("".join(capsys.readouterr()))


def test_the_comparisons_log_of_a_stage_holds_no_key(tmp_path, monkeypatch):
    """research/comparison copies each stage's output into <run>/log.txt: a stage printing the key it
    inherits (here a stand-in that prints it on stdout and stderr) leaves it redacted there."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    printing = "import os, sys; k = os.environ['OPENAI_API_KEY']; print('key', k); print(k, file=sys.stderr)"
    monkeypatch.setattr(runner, "command", lambda step, extra: [sys.executable, "-c", printing])
    monkeypatch.setattr(runner, "continuation", lambda step, log: ())
    cmd, rc = runner.run_step({"stage": "04"}, tmp_path)
    log = (tmp_path / "log.txt").read_text()
    assert rc == 0 and f"key {cli.REDACTED}" in log
    assert_no_key(log)


# ---------------------------------------------------------------------------------------
# 3. Answers of the wrong shape: one line naming what was wrong
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listing", "said"),
    [
        ({"data": None}, "`data` is null, not a list of models"),
        ({"object": "list"}, "`data` is absent, not a list of models"),
        ({"data": [1]}, "`data[0]` is a number, not an object with a text `id`"),
        ({"data": [{"id": 5}]}, "`data[0].id` is a number, not text"),
        ([{"id": MODEL}], "the answer is a list, not a JSON object"),
    ],
)
def test_a_malformed_models_list_is_one_line_naming_the_field(tmp_path, capsys, listing, said):
    with hostile_server({"models": answer_json(listing)}) as server:
        line = check_refused(stage_04(tmp_path / "o", server.base_url), capsys)
    assert line.startswith(f"error: --base-url {server.base_url}: a malformed answer from {server.base_url}")
    assert f"/models: {said}" in line and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ({"choices": "no"}, "`choices` is text, not a list of choices"),
        ({"choices": []}, "`choices` is an empty list, not a list of choices"),
        ({"choices": [1]}, "`choices[0]` is a number, not an object"),
        ({"choices": [{"logprobs": []}]}, "`choices[0].logprobs` is an empty list, not an object"),
        ({"choices": [{"logprobs": {"content": "OK"}}]}, "`choices[0].logprobs.content` is text, not a list"),
        (
            {"choices": [{"logprobs": {"content": [{"bytes": [300]}]}}]},
            "content[0].bytes` is a list of other values",
        ),
        ({"choices": [{"logprobs": {"content": [{"token": None}]}}]}, "content[0]` has no `bytes` and its"),
    ],
)
def test_a_malformed_logprobs_probe_answer_is_one_line_naming_the_field(tmp_path, capsys, answer, said):
    """The one-token probe (logprobs) answered in another shape: one line naming the path and field."""
    with hostile_server({"probe": answer_json(answer)}) as server:
        argv = stage_04(tmp_path / "o", server.base_url, "--generate-only")
        line = check_refused(argv, capsys)
    assert f"a malformed answer from {server.base_url}/chat/completions: " in line and said in line, line


@pytest.mark.slow
def test_malformed_chat_completions_are_failed_prompts_naming_the_field(tmp_path):
    """Six prompts, each answered in another wrong shape (tried twice): each a failed prompt whose error
    names the path and the field; a count that is not a number (1e400) no longer stops the run."""
    a, b = (t["id"] for t in TASKS)
    fine = {"message": {"role": "assistant", "content": "text"}}
    script = {
        (a, 1): answer_json({"choices": [{"message": {"content": None}}]}),
        (a, 2): answer_json({"choices": [1]}),
        (a, 3): answer_raw(
            b'{"choices": [{"message": {"content": "x"}}], "usage": {"completion_tokens": 1e400}}'
        ),
        (b, 1): answer_json({"choices": [fine | {"logprobs": {"content": [{"bytes": "x"}]}}]}),
        (b, 2): answer_json({"choices": [fine | {"index": "first"}]}),
        (b, 3): answer_json({"choices": [fine, fine]}),
    }
    said = {
        (a, 1): "`choices[0].message.content` is null, not text",
        (a, 2): "`choices[0]` is a number, not an object",
        (a, 3): "`usage.completion_tokens` is a number, not a count",
        (b, 1): "`choices[0].logprobs.content[0].bytes` is text, not a list of byte values",
        (b, 2): "`choices[0].index` is text, not a whole number",
        (b, 3): "2 choices where 1 were asked for",
    }
    out = tmp_path / "ev"
    with hostile_server(script) as server:
        argv = stage_04(out, server.base_url, "--api-retries", "1", "--generate-only")
        assert ev.main(argv) == 0
    assert all(server.asked.count(p) == 2 for p in script)
    errors = json.loads((out / "summary.json").read_text())["generation"]["errors"]
    assert len(errors) == 6
    for error in errors:
        expected = f"a malformed answer from {server.base_url}/chat/completions: "
        expected += said[error["task_id"], error["level"]]
        assert error["error"].startswith(expected), error
