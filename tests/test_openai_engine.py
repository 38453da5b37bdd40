"""Stage 04 against an OpenAI-compatible server (--engine openai, harness/openai_generation.py).

A small server of the tests' own (http.server on 127.0.0.1) answers each prompt with its task's reference
kernels, or, for chosen prompts, with a 500, a 429, malformed JSON or too late: the references pass, the
failed rows are recorded as such and a rerun completes them, and the key reaches the server but no file.
Against a real `vllm serve` of the bundled tiny model (skipped where vllm does not import, unless
CUSET_REQUIRE_VLLM=1), the engine writes the greedy replies vLLM's offline engine writes, cut alike, and
draws its seeded samples. The server starts once for the module (about 20 s on 2 cores).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from conftest import load_script

from cuset_common.paths import ROOT, TASKS_FILE, TINY_MODEL
from cuset_common.tasks import build_messages, load_tasks
from harness.eval_options import parse_args
from harness.generation import prompt_seed
from harness.openai_generation import chat_body, cut_reply
from harness.vllm_generation import engine_environment, vllm_platform

ev = load_script("04_eval_kernels.py")
KEY = "sk-test-secret"
MODEL = "reference-kernels"
# Two kernel-mode eval tasks at three levels: six prompts, two programs (a task's reference at every level).
TASKS = [t for t in load_tasks(TASKS_FILE) if t.get("split") == "eval"][:2]
LEVELS = (1, 2, 3)


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def free_port() -> int:
    """A port no one listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------
# The tests' own server: the reference kernels, or a chosen failure
# ---------------------------------------------------------------------------------------


class ReferenceServer(http.server.ThreadingHTTPServer):
    """Answers /v1/models and /v1/chat/completions: each prompt of TASKS gets its task's reference kernels
    with prose after the code block (which the cut leaves out); `failures` {(task id, level): kind} makes
    that prompt's every request fail: "500", "429" (Retry-After: 0), "malformed" (not JSON) or "slow"
    (answered after `slow_s`). It keeps each request's Authorization header and the prompts asked."""

    def __init__(self, failures: dict, slow_s: float):
        super().__init__(("127.0.0.1", 0), ReferenceHandler)
        self.failures, self.slow_s = failures, slow_s
        self.authorizations, self.asked = [], []
        self.prompts = {
            build_messages(t, lv, "kernel")[1]["content"]: (t, lv) for t in TASKS for lv in LEVELS
        }

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class ReferenceHandler(http.server.BaseHTTPRequestHandler):
    server: ReferenceServer

    def log_message(self, *_):  # keep the test's output clean
        pass

    def answer(self, status: int, body: bytes, headers: dict | None = None) -> None:
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(ConnectionError):  # a client that stopped waiting (--api-timeout)
            self.wfile.write(body)

    def do_GET(self):
        self.server.authorizations.append(self.headers.get("Authorization"))
        self.answer(200, json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode())

    def do_POST(self):
        self.server.authorizations.append(self.headers.get("Authorization"))
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = self.server.prompts.get(request["messages"][-1]["content"])
        if prompt is None:  # the engine's one-token probe
            return self.answer(200, json.dumps(completion(["OK"], 1)).encode())
        task, level = prompt
        self.server.asked.append((task["id"], level))
        kind = self.server.failures.get((task["id"], level))
        if kind == "500":
            return self.answer(500, b'{"error": "overloaded"}')
        if kind == "429":
            return self.answer(429, b'{"error": "rate limited"}', {"Retry-After": "0"})
        if kind == "malformed":
            return self.answer(200, b'{"choices": [{"message": ')
        if kind == "slow":
            time.sleep(self.server.slow_s)
        kernels = task["kernel_mode"]["reference_kernels"]
        reply = f"Here it is.\n```cuda\n{kernels}\n```\nEach thread takes one element."
        self.answer(200, json.dumps(completion([reply] * request["n"], 100)).encode())


def completion(texts: list[str], tokens: int) -> dict:
    """A chat completion answer holding `texts`, without logprobs (the engine then cuts by text)."""
    choices = [
        {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}
        for i, t in enumerate(texts)
    ]
    return {"object": "chat.completion", "choices": choices, "usage": {"completion_tokens": tokens}}


@contextlib.contextmanager
def reference_server(failures: dict, slow_s: float = 0.0):
    server = ReferenceServer(failures, slow_s)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def stage_04(out, base_url: str, *extra: str) -> list[str]:
    return [
        "--engine",
        "openai",
        "--base-url",
        base_url,
        "--api-model",
        MODEL,
        "--mode",
        "kernel",
        "--limit",
        str(len(TASKS)),
        "--backend",
        "emulate",
        "--out",
        str(out),
        *extra,
    ]


# ---------------------------------------------------------------------------------------
# The tests' own server
# ---------------------------------------------------------------------------------------


def test_failed_requests_are_recorded_on_their_rows_and_a_rerun_completes_them(tmp_path, monkeypatch, capsys):
    """Six prompts, four of which fail on every try of the first run (a 500, a 429, malformed JSON, an
    answer later than --api-timeout): the run finishes, the other two rows pass, the four are
    `generation_error` rows (outside pass@k) saying why, and the summary counts them. The same command
    again asks only for those four, and every row passes. The key went to the server on every request
    and into no file of --out."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    a, b = (t["id"] for t in TASKS)
    failures = {(a, 2): "500", (a, 3): "429", (b, 2): "malformed", (b, 3): "slow"}
    out = tmp_path / "ev"
    with reference_server(failures, slow_s=2.0) as server:
        argv = stage_04(out, server.base_url, "--api-timeout", "1", "--api-retries", "1")
        assert ev.main(argv) == 0
        rows = {(r["task_id"], r["level"]): r for r in read_jsonl(out / "results.jsonl")}
        assert {k for k, r in rows.items() if r["outcome"] == "pass"} == {(a, 1), (b, 1)}
        for prompt in failures:
            assert rows[prompt]["outcome"] == "generation_error" and "generation_error" in rows[prompt], (
                prompt
            )
        assert "HTTP 500" in rows[a, 2]["generation_error"] and "HTTP 429" in rows[a, 3]["generation_error"]
        assert "malformed" in rows[b, 2]["generation_error"] and "within --api-timeout" in rows[b, 3]["log"]
        assert all(server.asked.count(p) == 2 for p in failures)  # the first try and one retry
        summary = json.loads((out / "summary.json").read_text())
        assert summary["generation_errors"] == 4 and len(summary["generation"]["errors"]) == 4
        overall = summary["overall"]  # no reply is no verdict: outside pass@1 and the compile rate
        assert (
            overall["generation_error"] == 4 and overall["pass@1"] == 1.0 and overall["compile_rate"] == 1.0
        )
        assert summary["generation"]["server"] == server.base_url and summary["model"] == MODEL
        assert "4 rows got no reply from the server" in (out / "summary.md").read_text()

        server.failures = {}
        server.asked.clear()
        assert ev.main(argv) == 0
        assert sorted(server.asked) == sorted(failures)  # only the failed prompts, asked again
    rows = read_jsonl(out / "results.jsonl")
    assert len(rows) == 6 and all(r["outcome"] == "pass" and "generation_error" not in r for r in rows)
    assert json.loads((out / "summary.json").read_text())["generation_errors"] == 0
    assert all(c["completion"].endswith("```") for c in read_jsonl(out / "completions.jsonl"))  # prose cut

    assert server.authorizations and set(server.authorizations) == {f"Bearer {KEY}"}
    leaks = [p for p in out.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert not leaks and KEY not in "".join(capsys.readouterr())


def test_a_server_that_fails_every_prompt_is_given_up_on_after_two_rounds_of_requests(tmp_path):
    """Every prompt answered 500, one request at a time: after 2 x --api-concurrency failed prompts the
    other four are not sent; all six are left without a reply, each saying why (no rows: --generate-only)."""
    failing = {(t["id"], lv): "500" for t in TASKS for lv in LEVELS}
    out = tmp_path / "ev"
    with reference_server(failing) as server:
        argv = stage_04(
            out, server.base_url, "--api-concurrency", "1", "--api-retries", "0", "--generate-only"
        )
        assert ev.main(argv) == 0
    assert len(server.asked) == 2 and not (out / "completions.jsonl").exists()
    errors = json.loads((out / "summary.json").read_text())["generation"]["errors"]
    assert [e["error"].split(":")[0] for e in errors].count("not sent") == 4 and len(errors) == 6


def test_a_server_that_does_not_answer_is_one_line_and_exit_2(tmp_path, capsys):
    """No server on the port: one line naming --base-url, exit status 2, nothing written."""
    base = f"http://127.0.0.1:{free_port()}/v1"
    code = ev.run_main(ev.main, stage_04(tmp_path / "o", base))
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: --base-url {base}: no answer from {base}/models")
    assert not (tmp_path / "o").exists()


def test_a_model_the_server_does_not_serve_is_one_line_and_exit_2(tmp_path, capsys):
    with reference_server({}) as server:
        argv = stage_04(tmp_path / "o", server.base_url)
        code = ev.run_main(ev.main, [*argv, "--api-model", "gpt-none"])
    err = capsys.readouterr().err.strip()
    assert (
        code == 2
        and err == f"error: --api-model gpt-none: {server.base_url} serves {MODEL}; pass one of those"
    )


def test_without_base_url_or_api_model_it_is_one_line_and_exit_2(tmp_path, capsys):
    code = ev.run_main(ev.main, ["--engine", "openai", "--api-model", MODEL, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: --engine openai needs --base-url") and "\n" not in err


def test_a_request_asks_for_the_prompts_samples_with_its_seed_and_the_sampling_settings():
    """Sampled: n = --num-samples, the prompt's seed (vLLM gives sample s seed + s), temperature, top-p and
    max_tokens as given. Greedy: one sample (every sample's), top-p 1 and no seed, as vLLM's engine gets
    them. The messages are those the other engines render."""
    task = TASKS[0]
    sampled = parse_args(["--num-samples", "3", "--temperature", "0.7", "--top-p", "0.9", "--seed", "5"])
    sampled.api_model = MODEL
    body = chat_body(sampled, task, 2, logprobs=True)
    assert body == {
        "model": MODEL,
        "messages": build_messages(task, 2, "standalone"),
        "n": 3,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 1024,
        "seed": prompt_seed(5, task["id"], 2),
        "logprobs": True,
    }
    greedy = parse_args(["--num-samples", "3", "--max-new-tokens", "64"])
    greedy.api_model = MODEL
    body = chat_body(greedy, task, 1, logprobs=False)
    assert (body["n"], body["temperature"], body["top_p"], body["max_tokens"]) == (1, 0.0, 1.0, 64)
    assert "seed" not in body and "logprobs" not in body


def test_a_reply_without_tokens_is_cut_after_the_first_complete_code_block():
    """The text cut (a server without logprobs): right after the closing fence of the first block the mode
    asks for; a block without a kernel does not end the reply."""
    complete = lambda reply: ev.reply_complete(reply, "kernel")  # noqa: E731
    args = parse_args([])
    kernel = "```cuda\n__global__ void k() {}\n```"
    text = f"```\nmake\n```\nthen\n{kernel}\nmore {kernel}"
    assert cut_reply(text, None, complete, args) == f"```\nmake\n```\nthen\n{kernel}"
    assert cut_reply("no code", None, complete, args) == "no code"


# ---------------------------------------------------------------------------------------
# A real `vllm serve`, against vLLM's offline engine
# ---------------------------------------------------------------------------------------

# The six kernel-mode prompts of tests/test_engines.py whose greedy replies end in every way a reply can
# end (a complete code block, a loop of --loop-stop 9 tokens, the end of the turn, --max-new-tokens).
GREEDY = ["--mode", "kernel", "--levels", "1", "--limit", "6", "--max-new-tokens", "800", "--loop-stop", "9"]
GREEDY += ["--num-samples", "2"]
# Three prompts, two seeded samples each, a few tokens.
SAMPLED = [
    "--mode",
    "kernel",
    "--levels",
    "1",
    "--limit",
    "3",
    "--max-new-tokens",
    "24",
    "--num-samples",
    "2",
]
SAMPLED += ["--temperature", "0.8", "--seed", "3"]


@pytest.fixture(scope="module")
def served_tiny_model():
    """The base URL of `vllm serve` of the tiny model on 127.0.0.1, with the offline engine's settings on a
    CPU (start_engine in harness/vllm_generation.py: fp32, seed 0, eager, vLLM's own generation defaults
    rather than the model's generation_config, a small KV cache, its environment), once /v1/models answers;
    its process group is stopped however the tests end. Skipped where vllm does not import (failed under
    CUSET_REQUIRE_VLLM=1) or runs on a GPU only."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        if os.environ.get("CUSET_REQUIRE_VLLM") == "1":
            pytest.fail(f"CUSET_REQUIRE_VLLM=1 but vllm does not import: {e}")
        pytest.skip(f"vllm does not import ({e})")
    if vllm_platform() != "cpu":
        pytest.skip("compares the engines on a CPU; the vLLM installed here runs on a GPU only")
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(TINY_MODEL)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--seed", "0"]
    command += ["--enforce-eager", "--generation-config", "vllm", "--max-model-len", "2048"]
    command += ["--kv-cache-memory-bytes", str(64 << 20)]
    with engine_environment(1, cpu=True):
        server = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        base = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 600
        while not answers(f"{base}/models"):
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not start:\n{server.stdout.read().decode()[-3000:]}")
            time.sleep(1)
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False


def offline_and_served(tmp_path, base: str, argv: list[str]) -> tuple[dict, dict, dict]:
    """Stage 04 --generate-only in fp32 on one thread with `argv`, through vLLM's offline engine and through
    the server at `base`: (the offline completions, the served ones, the served run's generation record)."""
    argv = [*argv, "--precision", "fp32", "--threads", "1", "--generate-only"]
    offline, served = tmp_path / "vllm", tmp_path / "served"
    assert ev.main([*argv, "--engine", "vllm", "--device", "cpu", "--out", str(offline)]) == 0
    model = ["--api-model", str(TINY_MODEL)]
    assert ev.main([*argv, "--engine", "openai", "--base-url", base, *model, "--out", str(served)]) == 0
    texts = [
        {
            (c["task_id"], c["level"], c["sample"]): c["completion"]
            for c in read_jsonl(out / "completions.jsonl")
        }
        for out in (offline, served)
    ]
    return *texts, json.loads((served / "summary.json").read_text())["generation"]


def test_vllm_serve_gives_the_offline_engines_greedy_replies(tmp_path, monkeypatch, served_tiny_model):
    """Six prompts, greedy fp32, through `vllm serve` (--engine openai) and through vLLM's offline engine
    (--engine vllm): the same replies, each cut on the same token (the server's logprobs give the tokens;
    the prompts' replies end in all four ways)."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    offline, served, record = offline_and_served(tmp_path, served_tiny_model, GREEDY)
    assert len(offline) == 12 and served == offline
    assert record["cut"] == "by token (logprobs)" and record["errors"] == []
    assert record["server"] == served_tiny_model


def test_vllm_serve_draws_the_offline_engines_seeded_samples(tmp_path, monkeypatch, served_tiny_model):
    """Three prompts, two samples each at --temperature 0.8: the server, given each prompt's seed and n,
    draws the samples the offline engine draws."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    offline, served, _ = offline_and_served(tmp_path, served_tiny_model, SAMPLED)
    assert len(offline) == 6 and served == offline
    assert sum(offline[t, lv, 0] != offline[t, lv, 1] for t, lv, _ in offline) >= 2  # it sampled
