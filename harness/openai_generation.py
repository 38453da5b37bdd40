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

Requests run --api-concurrency at a time, one per prompt, each within --api-timeout seconds from its
connection to the last byte of its answer (a deadline, not a limit per socket read: a server that sends
a byte now and then would hold a read for ever); 429 and 5xx answers, timeouts, broken connections and
malformed answers are tried again --api-retries times, after the server's Retry-After or a doubling wait.
A prompt that still fails is kept as no reply at all, its error in the generation record: stage 04 records
it on the prompt's rows and a resumed run asks again. Once 2 x --api-concurrency prompts in a row have
failed, the server is taken as down and the prompts not yet sent fail at once. Every field read from an
answer's JSON is checked: one that is absent or of another type is an error naming it, a line (exit 2
when checking the server, a failed prompt during generation).

The key comes from the environment (OPENAI_API_KEY) and goes only into the Authorization header of
requests to --base-url's host. It is registered as a secret the moment it is read (cli.register_secret),
and a value no header can carry (a \\r or line end pasted with it, a space, a character outside ASCII) is
refused in one line that does not quote it. No redirect is followed: urllib's would send the header to
whatever host the server names (and turns a redirected POST into a GET without its body). Whatever an
error quotes of an answer, and every reply, has each run of KEY_PART_CHARS characters of the key
replaced (scrub): no record, error or file holds it or a part of it. HTTP is the standard library's
(urllib.request, so the proxy variables hold), so no client package is needed.
"""

from __future__ import annotations

import functools
import http.client
import io
import itertools
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from cuset_common import cli
from cuset_common.cli import UserError, is_utf8_text, register_secret
from cuset_common.tasks import build_messages
from harness.generation import distinct_samples, prompt_seed, stop_rules
from harness.vllm_generation import extend_until_stop

API_KEY_VARIABLE = "OPENAI_API_KEY"
# The first wait before a request is tried again; each further retry waits twice as long.
FIRST_BACKOFF_S = 1.0
# The longest a Retry-After is honoured: a server asking for more is asked again after this long.
MAX_RETRY_AFTER_S = 120.0
# How much of a failed answer's body an error message quotes (one line), and how much of it is read.
ERROR_QUOTE_CHARS = 200
ERROR_BODY_BYTES = 4096
# The shortest run of a key's characters that scrub replaces: long enough that no kernel or message holds
# one by chance, short enough to catch what a server quotes of a key (a masked echo, a quote cut short).
# A key shorter than this (a placeholder such as vLLM's "EMPTY") is left in replies, whole forms of it
# still out of every error line (cli.redact).
KEY_PART_CHARS = 8
# What a request can raise that is the network's or the server's doing: OSError (urllib's URLError and
# HTTPError, timeouts, refused or reset connections), http.client's (an answer cut short) and ValueError
# (an answer that is not JSON, or not of the shape the engine reads: MalformedAnswer).
REQUEST_ERRORS = (OSError, http.client.HTTPException, ValueError)


class RequestFailed(Exception):
    """A request that got no usable answer (after its retries): one line, what the server or network said."""


class MalformedAnswer(ValueError):
    """An answer's JSON without a field the engine reads, or with it of another type: says which, and what
    it held instead, so that a server's bug or an API of another shape reads as such, not as a crash."""


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
        return cls(args.base_url.rstrip("/"), args.api_model, args.api_timeout, args.api_retries, api_key())

    def send(self, path: str, body: dict | None = None) -> dict:
        """One request, GET (no body) or POST of JSON, within `timeout` seconds in all (deadline_opener),
        and its answer's JSON object; raises urllib's HTTPError (its body read: quoted_body) and URLError,
        TimeoutError, and ValueError for an answer that is not a JSON object."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.base_url}{path}", data=data, headers=headers)
        opener = deadline_opener(time.monotonic() + self.timeout)
        try:
            with opener.open(request, timeout=self.timeout) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as e:
            e.quoted = quoted_body(e)  # read now, within the deadline: failure_text quotes it
            raise
        try:
            parsed = json.loads(raw)
        except RecursionError:  # nested deeper than the parser recurses
            raise ValueError("the answer's JSON is nested too deep") from None
        if not isinstance(parsed, dict):
            raise MalformedAnswer(f"the answer is {json_kind(parsed)}, not a JSON object")
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


def quoted_body(error: urllib.error.HTTPError) -> str:
    """The start of a failed answer's body (ERROR_BODY_BYTES at most), "" where it cannot be read within
    the request's deadline; the answer is closed."""
    try:
        return error.read(ERROR_BODY_BYTES).decode("utf-8", "replace") if error.fp else ""
    except REQUEST_ERRORS:
        return ""
    finally:
        error.close()


# ---------------------------------------------------------------------------------------
# The key: read once, refused when malformed, kept out of every message and reply
# ---------------------------------------------------------------------------------------

# What an Authorization header cannot carry, named in the refusal instead of the key itself.
KEY_CHARACTER_NAMES = {
    "\r": "a carriage return (\\r)",
    "\n": "a line feed (\\n)",
    "\t": "a tab",
    " ": "a space",
}


def api_key() -> str | None:
    """OPENAI_API_KEY's value, None where it is unset or empty. It is registered as a secret before anything
    else (no closing line or traceback shows it, cli.register_secret); a value that is not one word of
    printable ASCII (RFC 6750's Bearer token) is refused, naming the variable and the character at fault but
    never quoting the key: http.client refuses a \\r or line end in a header and quotes the header in its
    error, and a character outside latin-1 fails deep inside it. A key pasted from a file saved with Windows
    line ends is the usual cause."""
    value = os.environ.get(API_KEY_VARIABLE)
    register_secret(value)
    if not value:
        return None
    for position, char in enumerate(value, 1):
        if not "!" <= char <= "~":
            name = KEY_CHARACTER_NAMES.get(char) or (
                "a character outside ASCII" if ord(char) > 0x7F else "a control character"
            )
            where = "at its end" if position == len(value) else f"at character {position} of {len(value)}"
            raise UserError(
                f"{API_KEY_VARIABLE} holds {name} {where}: a key is one word of printable ASCII; set it "
                f"again without it (a key file saved with Windows line ends leaves a \\r)"
            )
    return value


def scrub(text: str) -> str:
    """`text` with every registered secret (the key) in each form redacted (cli.redact), then every run of
    KEY_PART_CHARS or more characters of one: what a message quotes of a server's answer may hold part of
    the key (a server echoing it masked, or a quote cut off inside it)."""
    return key_runs_redacted(cli.redact(text))


def key_runs_redacted(text: str) -> str:
    """`text` with each run of KEY_PART_CHARS or more characters that a registered secret holds replaced by
    cli.REDACTED; the text itself where none is (a reply, which a short placeholder key must not change)."""
    grams = {s[i : i + KEY_PART_CHARS] for s in cli.SECRETS for i in range(len(s) - KEY_PART_CHARS + 1)}
    hits = [False] * len(text)
    for i in range(len(text) - KEY_PART_CHARS + 1):
        if text[i : i + KEY_PART_CHARS] in grams:
            hits[i : i + KEY_PART_CHARS] = [True] * KEY_PART_CHARS
    if not any(hits):
        return text
    runs = itertools.groupby(zip(hits, text), key=lambda pair: pair[0])
    return "".join(cli.REDACTED if hit else "".join(c for _, c in run) for hit, run in runs)


# ---------------------------------------------------------------------------------------
# One request within its deadline, no redirect followed
# ---------------------------------------------------------------------------------------


class DeadlineSocket:
    """A connected socket whose every send and read ends by `deadline` (time.monotonic()): each waits at
    most the time left, and none starts after it (TimeoutError). A socket's own timeout bounds one wait
    only, and http.client reads an answer through buffered reads that wait again until they have a line
    or the bytes asked for: a server sending a byte now and then holds such a read for ever. The socket is
    closed once its owner and every reader of it (makefile) have let go, as a socket's makefile does."""

    def __init__(self, sock, deadline: float):
        self.sock, self.deadline, self.readers, self.released = sock, deadline, 0, False

    def time_left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline (--api-timeout) passed")
        return left

    def sendall(self, data) -> None:
        self.sock.settimeout(self.time_left())
        self.sock.sendall(data)

    def recv_into(self, buffer) -> int:
        self.sock.settimeout(self.time_left())
        return self.sock.recv_into(buffer)

    def makefile(self, mode: str = "rb", *_, **__) -> io.BufferedReader:
        self.readers += 1
        return io.BufferedReader(DeadlineReader(self))

    def close(self) -> None:
        self.released = True
        self.let_go()

    def let_go(self) -> None:
        if self.released and not self.readers:
            self.sock.close()

    def __getattr__(self, name: str):
        return getattr(self.sock, name)


class DeadlineReader(io.RawIOBase):
    """The raw stream under a DeadlineSocket's makefile: each read within the deadline."""

    def __init__(self, owner: DeadlineSocket):
        self.owner = owner

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self.owner.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self.owner.readers -= 1
            self.owner.let_go()
        super().close()


class DeadlineConnection:
    """Mixed into http.client's connections: the socket, once connected (through a proxy's tunnel and TLS
    where there are), keeps to `deadline`; connecting waits at most the request's timeout."""

    def __init__(self, *args, deadline: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.deadline = deadline

    def connect(self) -> None:
        super().connect()
        self.sock = DeadlineSocket(self.sock, self.deadline)


class DeadlineHTTPConnection(DeadlineConnection, http.client.HTTPConnection):
    pass


class DeadlineHTTPSConnection(DeadlineConnection, http.client.HTTPSConnection):
    pass


class DeadlineHTTPHandler(urllib.request.HTTPHandler):
    """urllib's http:// handler, its connections keeping to one request's deadline."""

    def __init__(self, deadline: float):
        super().__init__()
        self.deadline = deadline

    def http_open(self, req):
        return self.do_open(functools.partial(DeadlineHTTPConnection, deadline=self.deadline), req)


class DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
    """urllib's https:// handler (its default TLS context), its connections keeping to the deadline."""

    def __init__(self, deadline: float):
        super().__init__()
        self.deadline = deadline

    def https_open(self, req):
        connection = functools.partial(DeadlineHTTPSConnection, deadline=self.deadline)
        return self.do_open(connection, req, context=self._context)


class RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """No redirect is followed: the 3xx is an HTTPError (failure_text names where it pointed). urllib's
    handler sends the request's headers, the key's Authorization among them, to whatever host the server
    names, and turns a redirected POST into a GET without its body, which no chat completion survives; a
    --base-url that redirects (http to https, a moved host) is one the user fixes once."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def deadline_opener(deadline: float) -> urllib.request.OpenerDirector:
    """urllib's opener (the proxy variables hold) whose requests end by `deadline` and follow no redirect."""
    return urllib.request.build_opener(
        RefuseRedirects(), DeadlineHTTPHandler(deadline), DeadlineHTTPSHandler(deadline)
    )


# ---------------------------------------------------------------------------------------
# A failed request: try again, or say why in one line
# ---------------------------------------------------------------------------------------


def retry_wait(error: Exception, attempt: int) -> float | None:
    """Seconds to wait before trying a request again after `error` (one of REQUEST_ERRORS) on its
    attempt-th retry (0 the first), None where trying again cannot help. 429 and 5xx: the server's
    Retry-After in seconds where it gives one (at most MAX_RETRY_AFTER_S), else FIRST_BACKOFF_S doubled per
    retry; so too a timeout, a broken connection and a malformed answer (a proxy cut it short). Another HTTP
    status (a redirect, 400, 401, 404) is the request's, the URL's or the key's fault."""
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
    answer (where a redirect pointed), the network's reason, or what was malformed in the answer; every
    part of the key scrubbed, before the quote is cut (a cut inside the key would leave its start)."""
    reason = error.reason if isinstance(error, urllib.error.URLError) else error
    if isinstance(error, urllib.error.HTTPError) and 300 <= error.code < 400:
        where = one_line(scrub(str(error.headers.get("Location"))))
        text = (
            f"HTTP {error.code} from {url}: redirected to {where}; no redirect is followed (it would take "
            "the key along): pass the URL that answers as --base-url"
        )
    elif isinstance(error, urllib.error.HTTPError):
        text = (
            f"HTTP {error.code} from {url}: {one_line(scrub(getattr(error, 'quoted', ''))) or error.reason}"
        )
    elif isinstance(reason, TimeoutError):
        text = f"no complete answer from {url} within --api-timeout"
    elif isinstance(error, (urllib.error.URLError, ConnectionError)):
        text = f"no answer from {url}: {reason}"
    else:
        text = f"a malformed answer from {url}: {one_line(scrub(str(error)))}"
    return scrub(text)


def one_line(text: str) -> str:
    """`text` on one line, at most ERROR_QUOTE_CHARS characters of it."""
    return " ".join(text.split())[:ERROR_QUOTE_CHARS]


def json_kind(value) -> str:
    """A JSON value's kind in words, for a message saying what a field held."""
    if value is None:
        return "null"
    if value == []:
        return "an empty list"
    kinds = {
        bool: "a boolean",
        dict: "an object",
        list: "a list",
        str: "text",
        int: "a number",
        float: "a number",
    }
    return kinds.get(type(value), type(value).__name__)


# ---------------------------------------------------------------------------------------
# Before any work: the arguments, and a server that answers
# ---------------------------------------------------------------------------------------


def check_server(args) -> None:
    """Refuse, in one line, --engine openai without --base-url or --api-model, a --base-url that is no http
    URL, a malformed key (api_key), and a server that does not answer GET {base}/models (within
    --api-timeout, no retries), answers it with no list of models, or does not list --api-model there."""
    if not (args.base_url and args.api_model):
        raise UserError("--engine openai needs --base-url (e.g. http://127.0.0.1:8000/v1) and --api-model")
    check_base_url(args.base_url)
    server = Server.from_args(args)
    try:
        served = served_models(server.send("/models"))
    except REQUEST_ERRORS as e:
        said = failure_text(e, server.base_url + "/models")
        if isinstance(e, ValueError):
            fix = "; is it the root of an OpenAI-compatible API (e.g. http://127.0.0.1:8000/v1)?"
        else:
            hint = " (the base URL ends where the API's paths begin, often /v1)" if "HTTP 404" in said else ""
            fix = f"{hint}; start the server, or fix --base-url (a key goes in {API_KEY_VARIABLE})"
        raise UserError(f"--base-url {server.base_url}: {said}{fix}") from None
    if served and server.model not in served:
        raise UserError(
            f"--api-model {server.model}: {server.base_url} serves {scrub(', '.join(served[:5]))}; "
            f"pass one of those"
        )


def check_base_url(base_url: str) -> None:
    """Refuse a --base-url that is not http(s)://host...: urllib would read a file:// one from the disk, and
    one without a scheme fails as a malformed answer. A user name or password in it is refused without
    quoting it: no request would send them, and the key has its variable."""
    try:
        parts = urllib.parse.urlsplit(base_url)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number up to 65535)
    except ValueError as e:
        raise UserError(f"--base-url: not a URL ({e}); e.g. http://127.0.0.1:8000/v1") from None
    if parts.username is not None or parts.password is not None:
        raise UserError(
            f"--base-url holds a user name or password (user:pass@host); put the key in {API_KEY_VARIABLE}"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(
            f"--base-url {base_url}: not an http:// or https:// URL; e.g. http://127.0.0.1:8000/v1"
        )


def served_models(listing: dict) -> list[str]:
    """The model names of a /models answer (its `data`, a list of objects each with a text `id`), every one
    checked: MalformedAnswer names the first field that is not so."""
    data = listing.get("data")
    if not isinstance(data, list):
        raise MalformedAnswer(f"`data` is {kind_of(listing, 'data')}, not a list of models")
    for i, model in enumerate(data):
        if not isinstance(model, dict):
            raise MalformedAnswer(f"`data[{i}]` is {json_kind(model)}, not an object with a text `id`")
        if not isinstance(model.get("id"), str):
            raise MalformedAnswer(f"`data[{i}].id` is {kind_of(model, 'id')}, not text")
    return [model["id"] for model in data]


def token_cut_available(server: Server) -> bool:
    """Whether the server gives each reply token's bytes (logprobs), asked with a one-token request: the
    reply is then cut token by token. A 400 is a server that refuses logprobs; any other failure after the
    retries stops the run in one line (the server went away since check_server), as does an answer of
    another shape than a chat completion's (the replies would be too)."""
    probe = {"model": server.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    try:
        answer = server.send_with_retries("/chat/completions", probe | {"logprobs": True})
        return logprob_pieces(answer_choices(answer)[0], "choices[0]") is not None
    except RequestFailed as e:
        if "HTTP 400" not in str(e):
            raise UserError(f"--base-url {server.base_url}: {e}") from None
        return False
    except MalformedAnswer as e:
        url = f"{server.base_url}/chat/completions"
        raise UserError(
            f"--base-url {server.base_url}: a malformed answer from {url}: {scrub(str(e))}"
        ) from None


# ---------------------------------------------------------------------------------------
# The fields of a chat completion, each checked
# ---------------------------------------------------------------------------------------


def kind_of(container: dict, name: str) -> str:
    """What `container` holds under `name`, in words ("absent" where it has no such field)."""
    return json_kind(container[name]) if name in container else "absent"


def answer_choices(answer: dict) -> list[dict]:
    """A chat completion's `choices`: a list of objects, not empty."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedAnswer(f"`choices` is {kind_of(answer, 'choices')}, not a list of choices")
    for i, choice in enumerate(choices):
        if not isinstance(choice, dict):
            raise MalformedAnswer(f"`choices[{i}]` is {json_kind(choice)}, not an object")
    return choices


def choice_text(choice: dict, where: str) -> str:
    """A choice's reply: `message.content`, UTF-8 text (null is a reply without text: a tool call)."""
    message = choice.get("message")
    if not isinstance(message, dict):
        raise MalformedAnswer(f"`{where}.message` is {kind_of(choice, 'message')}, not an object")
    text = message.get("content")
    if not isinstance(text, str) or not is_utf8_text(text):
        what = "text with lone surrogates" if isinstance(text, str) else kind_of(message, "content")
        raise MalformedAnswer(f"`{where}.message.content` is {what}, not text")
    return text


def logprob_pieces(choice: dict, where: str) -> list[bytes] | None:
    """The bytes of each token of a choice (`logprobs.content`, each token's `bytes` or else its text
    `token`), None where it has none; MalformedAnswer where a field of it is of another type."""
    logprobs = choice.get("logprobs")
    if logprobs is None:
        return None
    if not isinstance(logprobs, dict):
        raise MalformedAnswer(f"`{where}.logprobs` is {json_kind(logprobs)}, not an object")
    tokens = logprobs.get("content")
    if tokens is None:
        return None
    if not isinstance(tokens, list):
        raise MalformedAnswer(f"`{where}.logprobs.content` is {json_kind(tokens)}, not a list of tokens")
    return [token_bytes(token, f"{where}.logprobs.content[{i}]") for i, token in enumerate(tokens)] or None


def token_bytes(token, where: str) -> bytes:
    """One logprobs token's bytes: its `bytes` (a list of byte values) or, where null, its text `token`."""
    if not isinstance(token, dict):
        raise MalformedAnswer(f"`{where}` is {json_kind(token)}, not an object")
    values = token.get("bytes")
    if values is None:
        text = token.get("token")
        if not isinstance(text, str) or not is_utf8_text(text):
            raise MalformedAnswer(
                f"`{where}` has no `bytes` and its `token` is {kind_of(token, 'token')}, not text"
            )
        return text.encode()
    if not isinstance(values, list) or not all(type(b) is int and 0 <= b <= 255 for b in values):
        what = "a list of other values" if isinstance(values, list) else json_kind(values)
        raise MalformedAnswer(f"`{where}.bytes` is {what}, not a list of byte values (0 to 255)")
    return bytes(values)


def choice_order(choice: dict, where: str) -> int:
    """A choice's `index` (0 where absent), by which the samples are ordered."""
    index = choice.get("index", 0)
    if type(index) is not int:
        raise MalformedAnswer(f"`{where}.index` is {json_kind(index)}, not a whole number")
    return index


def completion_tokens(answer: dict) -> int:
    """The tokens the server wrote (`usage.completion_tokens`), 0 where it does not say."""
    usage = answer.get("usage")
    if usage is None:
        return 0
    if not isinstance(usage, dict):
        raise MalformedAnswer(f"`usage` is {json_kind(usage)}, not an object")
    tokens = usage.get("completion_tokens")
    if tokens is None:
        return 0
    if type(tokens) is not int or tokens < 0:
        raise MalformedAnswer(f"`usage.completion_tokens` is {json_kind(tokens)}, not a count")
    return tokens


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


def reply_pieces(choice: dict, text: str, where: str) -> list[bytes] | None:
    """The bytes of each token of a choice's reply (its logprobs: logprob_pieces), less the end-of-turn
    token a server lists after the text (vLLM does; the text leaves it out, as decoding skips it here);
    None without logprobs, or where the tokens do not spell the text."""
    pieces = logprob_pieces(choice, where)
    if pieces is None:
        return None
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
    """(the cut reply of each sample, the tokens the server wrote) of a chat completion answer, each field
    checked (MalformedAnswer names the first that is absent or of another type). A reply keeps no run of
    the key's characters (key_runs_redacted): a server echoing the request must not put it in a file."""
    choices = answer_choices(answer)
    if len(choices) != samples:
        raise MalformedAnswer(f"{len(choices)} choices where {samples} were asked for")
    places = sorted(range(len(choices)), key=lambda i: choice_order(choices[i], f"choices[{i}]"))
    texts = []
    for i in places:
        text = choice_text(choices[i], f"choices[{i}]")
        reply = cut_reply(text, reply_pieces(choices[i], text, f"choices[{i}]"), complete, args)
        texts.append(key_runs_redacted(reply))
    return texts, completion_tokens(answer)


def ask(server: Server, args, task: dict, level: int, logprobs: bool, complete) -> tuple[list[str], int]:
    """One prompt's replies and the tokens written (replies), tried again as send_with_retries does, a
    malformed answer too; RequestFailed after the last try."""
    samples, body = distinct_samples(args), chat_body(args, task, level, logprobs)
    attempt = 0
    while True:
        answer = server.send_with_retries("/chat/completions", body)
        try:
            return replies(answer, samples, complete, args)
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # MalformedAnswer; the rest a bug's
            if attempt == server.retries:
                url = f"{server.base_url}/chat/completions"
                said = str(e) if isinstance(e, MalformedAnswer) else f"{type(e).__name__}: {e}"
                raise RequestFailed(scrub(f"a malformed answer from {url}: {one_line(said)}")) from None
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
