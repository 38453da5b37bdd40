"""Stage 04's generation through an OpenAI-compatible server (`--engine openai --base-url URL --api-model
NAME`): `vllm serve`, SGLang, or a hosted model, so that a model another machine serves gets the verdicts
and the report of the other engines (harness/generation.py, harness/vllm_generation.py).

What is sent is what the other engines compute from: the chat messages of cuset_common.tasks.build_messages
(the server applies the model's chat template, as generation.prompt_text does here), --temperature, --top-p
(1 when greedy, as vLLM's engine gets it), max_tokens = --max-new-tokens, n = the prompt's distinct samples
and, when sampling, the prompt's seed (generation.prompt_seed; vLLM gives sample s seed + s). The end of
the turn is the server's own. The other two stops (a closed code block, a loop: generation.stop_rules) no
stop string can say, so the server writes on to its end of turn or max_tokens and the reply is cut here
afterwards, on the token where the own loop would have stopped: the request asks for logprobs, whose
tokens (their bytes) go through the same rules one at a time (cut_reply). A server that refuses logprobs
gets its text cut right after the closing fence of the first complete code block, and no loop cut.

Requests run --api-concurrency at a time, one per prompt, each within --api-timeout seconds; 429 and 5xx
answers, timeouts and broken connections are tried again --api-retries times, after the server's
Retry-After or a doubling wait. A prompt that still fails is kept as no reply at all, its error in the
generation record: stage 04 records it on the prompt's rows and a resumed run asks again. Once
2 x --api-concurrency prompts in a row have failed, the server is taken as down and the prompts not yet
sent fail at once. The key comes from
the environment (OPENAI_API_KEY) and goes only into the Authorization header: no record, error or file
holds it. HTTP is the standard library's (urllib.request), so no client package is needed.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from cuset_common.cli import UserError, register_secret
from cuset_common.tasks import build_messages
from harness.generation import distinct_samples, prompt_seed, stop_rules
from harness.vllm_generation import extend_until_stop

API_KEY_VARIABLE = "OPENAI_API_KEY"
# The first wait before a request is tried again; each further retry waits twice as long.
FIRST_BACKOFF_S = 1.0
# The longest a Retry-After is honoured: a server asking for more is asked again after this long.
MAX_RETRY_AFTER_S = 120.0
# How much of a failed answer's body an error message quotes (one line).
ERROR_QUOTE_CHARS = 200
# What a request can raise that is the network's or the server's doing: OSError (urllib's URLError and
# HTTPError, timeouts, refused or reset connections), http.client's (an answer cut short) and ValueError
# (an answer that is not JSON).
REQUEST_ERRORS = (OSError, http.client.HTTPException, ValueError)


class RequestFailed(Exception):
    """A request that got no usable answer (after its retries): one line, what the server or network said."""


@dataclass(frozen=True)
class Server:
    """The OpenAI-compatible server of --base-url (up to its /v1) serving --api-model; key: OPENAI_API_KEY's
    value or None (kept out of repr, so out of every message and record)."""

    base_url: str
    model: str
    timeout: float
    retries: int
    key: str | None = field(default=None, repr=False)

    @classmethod
    def from_args(cls, args) -> Server:
        register_secret(os.environ.get(API_KEY_VARIABLE))  # no error line or traceback may show the key
        return cls(
            args.base_url.rstrip("/"),
            args.api_model,
            args.api_timeout,
            args.api_retries,
            os.environ.get(API_KEY_VARIABLE) or None,
        )

    def send(self, path: str, body: dict | None = None) -> dict:
        """One request, GET (no body) or POST of JSON, and its answer's JSON object; raises urllib's
        HTTPError and URLError, TimeoutError, and ValueError for an answer that is not a JSON object."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.base_url}{path}", data=data, headers=headers)
        with urllib.request.urlopen(request, timeout=self.timeout) as answer:
            parsed = json.loads(answer.read())
        if not isinstance(parsed, dict):
            raise ValueError(f"the answer is JSON {type(parsed).__name__}, not an object")
        return parsed

    def send_with_retries(self, path: str, body: dict) -> dict:
        """send(), tried again up to `retries` times on what may pass (retry_wait); RequestFailed with the
        last failure once none is left, or at once on one that will not pass (a 400, a 401)."""
        attempt = 0
        while True:
            try:
                return self.send(path, body)
            except REQUEST_ERRORS as e:
                wait = retry_wait(e, attempt)
                if wait is None or attempt == self.retries:
                    tries = f" (after {attempt + 1} attempts)" if attempt else ""
                    raise RequestFailed(f"{failure_text(e, self.base_url + path)}{tries}") from None
            time.sleep(wait)
            attempt += 1


def retry_wait(error: Exception, attempt: int) -> float | None:
    """Seconds to wait before trying a request again after `error` (one of REQUEST_ERRORS) on its
    attempt-th retry (0 the first), None where trying again cannot help. 429 and 5xx: the server's
    Retry-After in seconds where it gives one (at most MAX_RETRY_AFTER_S), else FIRST_BACKOFF_S doubled per
    retry; so too a timeout, a broken connection and a malformed answer (a proxy cut it short). Another HTTP
    status (400, 401, 404) is the request's or the key's fault."""
    backoff = FIRST_BACKOFF_S * 2**attempt
    if not isinstance(error, urllib.error.HTTPError):
        return backoff
    if error.code != 429 and error.code < 500:
        return None
    try:
        return min(float(error.headers.get("Retry-After", "")), MAX_RETRY_AFTER_S)
    except ValueError:  # absent, or an HTTP date
        return backoff


def failure_text(error: Exception, url: str) -> str:
    """One line saying how a request to `url` failed: the HTTP status and the start of the server's
    answer, the network's reason, or what was malformed in the answer."""
    if isinstance(error, urllib.error.HTTPError):
        body = error.read().decode("utf-8", "replace") if error.fp else ""
        return f"HTTP {error.code} from {url}: {one_line(body) or error.reason}"
    if isinstance(error, urllib.error.URLError):
        return f"no answer from {url}: {error.reason}"
    if isinstance(error, TimeoutError):
        return f"no answer from {url} within --api-timeout"
    return f"a malformed answer from {url}: {one_line(str(error))}"


def one_line(text: str) -> str:
    """`text` on one line, at most ERROR_QUOTE_CHARS characters of it."""
    return " ".join(text.split())[:ERROR_QUOTE_CHARS]


# ---------------------------------------------------------------------------------------
# Before any work: the arguments, and a server that answers
# ---------------------------------------------------------------------------------------


def check_server(args) -> None:
    """Refuse, in one line, --engine openai without --base-url or --api-model, and a server that does not
    answer GET {base}/models (within --api-timeout, no retries) or does not list --api-model there."""
    if not (args.base_url and args.api_model):
        raise UserError("--engine openai needs --base-url (e.g. http://127.0.0.1:8000/v1) and --api-model")
    server = Server.from_args(args)
    try:
        listing = server.send("/models")
    except REQUEST_ERRORS as e:
        hint = " (the base URL ends where the API's paths begin, often /v1)" if "HTTP 404" in str(e) else ""
        raise UserError(
            f"--base-url {server.base_url}: {failure_text(e, server.base_url + '/models')}{hint}; start the "
            f"server, or fix --base-url (a key goes in {API_KEY_VARIABLE})"
        ) from None
    served = [m.get("id") for m in listing.get("data", []) if isinstance(m, dict)]
    if served and server.model not in served:
        raise UserError(
            f"--api-model {server.model}: {server.base_url} serves {', '.join(map(str, served[:5]))}; "
            f"pass one of those"
        )


def token_cut_available(server: Server) -> bool:
    """Whether the server gives each reply token's bytes (logprobs), asked with a one-token request: the
    reply is then cut token by token. A 400 is a server that refuses logprobs; any other failure after the
    retries stops the run in one line (the server went away since check_server)."""
    probe = {"model": server.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    try:
        answer = server.send_with_retries("/chat/completions", probe | {"logprobs": True})
    except RequestFailed as e:
        if "HTTP 400" not in str(e):
            raise UserError(f"--base-url {server.base_url}: {e}") from None
        return False
    choices = answer.get("choices") or [{}]
    return bool((choices[0].get("logprobs") or {}).get("content"))


# ---------------------------------------------------------------------------------------
# The requests, and the cut of what comes back
# ---------------------------------------------------------------------------------------


def chat_body(args, task: dict, level: int, logprobs: bool) -> dict:
    """The chat completion request of one prompt: its messages, its distinct samples (n) and the sampling
    settings (module docstring)."""
    sampled = args.temperature > 0
    body = {
        "model": args.api_model,
        "messages": build_messages(task, level, args.mode),
        "n": distinct_samples(args),
        "temperature": args.temperature,
        "top_p": args.top_p if sampled else 1.0,
        "max_tokens": args.max_new_tokens,
    }
    if sampled:
        body["seed"] = prompt_seed(args.seed, str(task["id"]), level)
    return body | ({"logprobs": True} if logprobs else {})


class PieceTokenizer:
    """The one method of a tokenizer that generation.stop_rules calls, decode, over the reply tokens a
    server sent: an id is the index of a token's bytes in `pieces`."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return b"".join(self.pieces[int(i)] for i in ids).decode("utf-8", "replace")


def reply_pieces(choice: dict, text: str) -> list[bytes] | None:
    """The bytes of each token of a choice's reply (its logprobs), less the end-of-turn token a server lists
    after the text (vLLM does; the text leaves it out, as decoding skips it here); None without logprobs,
    or where the tokens do not spell the text."""
    tokens = (choice.get("logprobs") or {}).get("content")
    if not tokens:
        return None
    pieces = [bytes(t["bytes"]) if t.get("bytes") is not None else t["token"].encode() for t in tokens]
    wanted = text.encode()
    while pieces and not wanted.startswith(b"".join(pieces)):
        pieces.pop()
    return pieces if b"".join(pieces) == wanted else None


def cut_reply(text: str, pieces: list[bytes] | None, complete: Callable[[str], bool], args) -> str:
    """The reply as the own loop would have ended it: with its tokens, on the first token where a rule of
    generation.stop_rules holds (vllm_generation.extend_until_stop, the cut vLLM's replies get); with text
    alone, right after the closing fence of the first complete code block."""
    if pieces is not None:
        vocabulary: dict[bytes, int] = {}
        ids = [vocabulary.setdefault(p, len(vocabulary)) for p in pieces]
        tok = PieceTokenizer(list(vocabulary))
        reply: list[int] = []
        extend_until_stop(reply, ids, stop_rules(tok, complete, args.loop_stop), [], args.max_new_tokens)
        return tok.decode(reply)
    fence = text.find("```")
    while fence >= 0:
        if complete(text[: fence + 3]):
            return text[: fence + 3]
        fence = text.find("```", fence + 3)
    return text


def replies(answer: dict, samples: int, complete: Callable[[str], bool], args) -> tuple[list[str], int]:
    """(the cut reply of each sample, the tokens the server wrote) of a chat completion answer; ValueError
    or KeyError where it lacks a sample's text."""
    choices = sorted(answer["choices"], key=lambda c: c.get("index", 0))
    if len(choices) != samples:
        raise ValueError(f"{len(choices)} choices where {samples} were asked for")
    texts = []
    for choice in choices:
        text = choice["message"]["content"]
        if not isinstance(text, str):
            raise ValueError("a choice's message has no text content")
        texts.append(cut_reply(text, reply_pieces(choice, text), complete, args))
    return texts, int((answer.get("usage") or {}).get("completion_tokens") or 0)


def ask(server: Server, args, task: dict, level: int, logprobs: bool, complete) -> tuple[list[str], int]:
    """One prompt's replies and the tokens written (replies), tried again as send_with_retries does, a
    malformed answer too; RequestFailed after the last try."""
    samples, body = distinct_samples(args), chat_body(args, task, level, logprobs)
    attempt = 0
    while True:
        answer = server.send_with_retries("/chat/completions", body)
        try:
            return replies(answer, samples, complete, args)
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # a field absent or of another type
            if attempt == server.retries:
                url = f"{server.base_url}/chat/completions"
                raise RequestFailed(f"a malformed answer from {url}: {e!r}") from None
        time.sleep(FIRST_BACKOFF_S * 2**attempt)
        attempt += 1


# ---------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------


def generate_openai(
    args, tasks_by_id: dict, jobs: list[tuple], complete: Callable[[str], bool], progress, on_batch
) -> dict:
    """generation.generate's contract through the server of --base-url: replies for `jobs`, on_batch({job:
    reply}) as each prompt's samples come back; returns the generation record (generation_record's fields;
    the dtype and device are the server's own, unknown here) with the server, the model, how replies were
    cut, and `errors`: each job whose prompt got no usable answer (task_id, level, sample, error), kept as
    no reply at all."""
    server = Server.from_args(args)
    started = time.perf_counter()
    logprobs = token_cut_available(server)
    ready = time.perf_counter()
    prompts = sorted({(tid, level) for tid, level, _ in jobs})
    wanted, written, errors = set(jobs), 0, []
    # A server that failed this many prompts in a row (each after its retries) is down or refusing: the
    # prompts not yet sent are not sent (their rows fail at once) rather than each waiting out its retries.
    give_up_after, in_a_row, counting = 2 * args.api_concurrency, 0, threading.Lock()

    def ask_unless_given_up(task: dict, level: int) -> tuple[list[str], int]:
        nonlocal in_a_row
        if in_a_row >= give_up_after:
            raise RequestFailed(f"not sent: the server had failed {give_up_after} prompts in a row")
        try:
            answer = ask(server, args, task, level, logprobs, complete)
        except RequestFailed:
            with counting:
                in_a_row += 1
            raise
        with counting:
            in_a_row = 0
        return answer

    pool = ThreadPoolExecutor(max_workers=args.api_concurrency)
    try:
        asked = {pool.submit(ask_unless_given_up, tasks_by_id[t], lv): (t, lv) for t, lv in prompts}
        for future in as_completed(asked):
            prompt_jobs = [j for j in ((*asked[future], s) for s in range(args.num_samples)) if j in wanted]
            try:
                texts, tokens = future.result()
            except RequestFailed as e:
                errors += [
                    {"task_id": t, "level": lv, "sample": s, "error": str(e)} for t, lv, s in prompt_jobs
                ]
            else:
                written += tokens
                on_batch({j: texts[j[2] % len(texts)] for j in prompt_jobs})
            progress(1)
    finally:
        pool.shutdown(cancel_futures=True)  # stopped (Ctrl-C): only the requests in flight are waited for
    seconds = time.perf_counter() - ready
    return {
        "engine": "openai",
        "version": f"{server.model} at {server.base_url}",
        "dtype": "as served",
        "device": "the server",
        "server": server.base_url,
        "api_model": server.model,
        "cut": "by token (logprobs)" if logprobs else "by text (the server gives no logprobs; no loop cut)",
        "load_s": round(ready - started, 2),
        "tokens": written,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(written / seconds, 2) if seconds > 0 else None,
        "errors": sorted(errors, key=lambda e: (e["task_id"], e["level"], e["sample"])),
    }
