"""SFT data: read any supported JSONL form, tokenize a sample the same way in every stage, and pad samples
into one batch the same way in every stage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from .cli import UserError
from .files import jsonl_records, read_jsonl

# Used when the tokenizer has no chat template (documented in README).
PLAIN_PROMPT_TEMPLATE = "### System:\n{system}\n\n### Instruction:\n{user}\n\n### Response:\n"


def normalize_record(obj: dict, where: str) -> dict:
    """One SFT record -> {"id", "prompt_messages": [...], "response": str}.

    Accepted forms: chat `messages` (last turn is the assistant's), `prompt`/`completion`,
    `instruction`/`input`/`output`, or `text` (no prompt: every token is a response token).
    """
    rid = str(obj.get("id", where))
    if "messages" in obj:
        msgs = obj["messages"]
        ok = (
            isinstance(msgs, list)
            and msgs
            and all(
                isinstance(m, dict)
                and isinstance(m.get("content"), str)
                and m.get("role") in ("system", "user", "assistant")
                for m in msgs
            )
        )
        if not ok or msgs[-1]["role"] != "assistant":
            raise UserError(
                f"{where}: 'messages' must be a list of {{role, content}} turns ending with an assistant turn"
            )
        prompt, response = msgs[:-1], msgs[-1]["content"]  # contents checked above
    elif "prompt" in obj and "completion" in obj:
        user, response = strings(where, obj["prompt"], obj["completion"])
        prompt = [{"role": "user", "content": user}]
    elif "instruction" in obj and "output" in obj:
        instruction, extra, response = strings(where, obj["instruction"], obj.get("input", ""), obj["output"])
        prompt = [{"role": "user", "content": instruction + (f"\n\n{extra}" if extra else "")}]
    elif "text" in obj:
        prompt, (response,) = [], strings(where, obj["text"])
    else:
        raise UserError(
            f"{where}: unknown record form (keys: {', '.join(sorted(obj)) or 'none'}); expected "
            f"'messages', 'prompt'+'completion', 'instruction'+'input'+'output', or 'text'"
        )
    if not response.strip():  # its tokens would be the end-of-turn token alone: nothing to profile or learn
        raise UserError(
            f"{where}: the response (the answer to learn) is empty; write it, or remove the record"
        )
    return {"id": rid, "prompt_messages": prompt, "response": response}


def strings(where: str, *fields) -> tuple[str, ...]:
    """The fields of a record, refused unless all are strings."""
    if not all(isinstance(f, str) for f in fields):
        raise UserError(f"{where}: fields must be strings")
    return fields


def load_sft(path: Path, content: bytes | None = None) -> list[dict]:
    """The SFT records of a JSONL file, each with its line number; content: the file's bytes where they
    were read already (jsonl_lines)."""
    records = [
        normalize_record(obj, f"{path}:{lineno}") | {"line": lineno}
        for lineno, obj in jsonl_lines(path, content)
    ]
    if not records:
        raise UserError(f"{path}: no records")
    return records


def jsonl_lines(path: Path, content: bytes | None = None) -> Iterator[tuple[int, dict]]:
    """read_jsonl of `path`, or of its bytes `content` where they were read already: a pipe (`--data
    <(command)`, /dev/stdin) gives its bytes to its first reader only. Lines are split as a file object
    splits them, at each newline, so both give the same line numbers and the same errors."""
    return read_jsonl(path) if content is None else jsonl_records(content, path)


def render_prompt_and_response(tokenizer, record: dict) -> tuple[str, str]:
    """Text of the prompt (ending where the model starts answering) and of the response.

    With a chat template the response is the assistant content plus whatever the template
    appends to close the turn (the end-of-turn token: the model must learn to stop).
    """
    msgs = record["prompt_messages"]
    if getattr(tokenizer, "chat_template", None) and msgs:
        prompt = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(
            msgs + [{"role": "assistant", "content": record["response"]}], tokenize=False
        )
        if not full.startswith(prompt):
            raise UserError(
                "the chat template does not render the prompt as a prefix of the conversation; "
                "pass a tokenizer whose template does"
            )
        return prompt, close_turn(tokenizer, full[len(prompt) :], record["response"])
    eos = tokenizer.eos_token or ""
    if not msgs:
        return "", record["response"] + eos
    system = "\n".join(m["content"] for m in msgs if m["role"] == "system")
    user = "\n\n".join(m["content"] for m in msgs if m["role"] != "system")
    return PLAIN_PROMPT_TEMPLATE.format(system=system, user=user), record["response"] + eos


def special_token_strings(tokenizer) -> list[str]:
    """Text of every special token: the named ones and the added tokens marked special."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return sorted({*tokenizer.all_special_tokens, *(t.content for t in added.values() if t.special)} - {""})


def close_turn(tokenizer, response: str, content: str) -> str:
    """The response as the model must produce it: the assistant content and the template's text up to and
    including its end-of-turn token, nothing after it.

    ChatML writes `<|im_end|>\n` after a turn; generation stops at `<|im_end|>`, so the `\n` is never
    predicted and must not be trained or profiled either. A template that closes the turn without any
    special token keeps its closing text minus trailing whitespace.
    """
    body = response.find(content) + len(content) if content and content in response else 0
    tail = response[body:]
    ends = [tail.find(s) + len(s) for s in special_token_strings(tokenizer) if s in tail]
    return response[:body] + (tail[: min(ends)] if ends else tail.rstrip())


def end_of_turn_ids(tokenizer) -> list[int]:
    """Token ids that end an assistant turn: eos, and the special token the chat template closes a turn
    with (ChatML's `<|im_end|>` in a tokenizer whose eos is another token). Generation stops at any."""
    probe = {"prompt_messages": [{"role": "user", "content": "?"}], "response": "x"}
    _, response = render_prompt_and_response(tokenizer, probe)
    ids = {tokenizer.eos_token_id} - {None}
    ids |= {
        tokenizer.convert_tokens_to_ids(s) for s in special_token_strings(tokenizer) if response.endswith(s)
    }
    return sorted(i for i in ids if i is not None and i != tokenizer.unk_token_id)


def encode_sample(tokenizer, record: dict, max_length: int) -> dict:
    """Token ids of prompt + response, with the response tokens' character spans.

    Prompt and response are tokenized separately so that the boundary is a token boundary
    and the spans index into the response text. Returns input_ids (list), response_start
    (index of the first response token, i.e. of the first predicted one), spans [(start, end)]
    per response token from response_start on,
    response_text, truncated (the response lost its tail to max_length).
    """
    prompt_text, response_text = render_prompt_and_response(tokenizer, record)
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"] if prompt_text else []
    enc = tokenizer(response_text, add_special_tokens=False, return_offsets_mapping=True)
    resp_ids, spans = enc["input_ids"], [tuple(s) for s in enc["offset_mapping"]]
    room = max(0, max_length - len(prompt_ids))
    truncated = len(resp_ids) > room
    start, spans = len(prompt_ids), spans[:room]
    # `text` form: nothing predicts the first token, it is context only (assumption)
    if start == 0 and spans:
        start, spans = 1, spans[1:]
    # a prompt that alone fills max_length leaves no response token: nothing of it is worth a forward
    # pass, so it is cut to max_length too and the stages skip and count the sample
    return {
        "input_ids": (prompt_ids + resp_ids[:room])[:max_length],
        "response_start": min(start, max_length),
        "spans": spans,
        "response_text": response_text,
        "truncated": truncated,
    }


def right_pad(token_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [B, L] right-padded with pad_id, and their attention mask [B, L] (1 on real tokens), L the
    longest sample. Right padding keeps every sample's positions as encode_sample made them."""
    length = max(len(ids) for ids in token_ids)
    ids = torch.full((len(token_ids), length), pad_id, dtype=torch.long)  # [B, L]
    mask = torch.zeros_like(ids)  # [B, L]
    for b, sample in enumerate(token_ids):
        ids[b, : len(sample)] = torch.tensor(sample)
        mask[b, : len(sample)] = 1
    return ids, mask
