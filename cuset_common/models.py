"""Models: loading with one-line errors, and the check that logits are a plain linear head."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import math
import os
import struct
from pathlib import Path

import huggingface_hub
import torch
import transformers  # its Auto classes named through it: transformers loads them on first use, not here
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    RepositoryNotFoundError,
    StrictDataclassError,
)
from safetensors import SafetensorError
from transformers.utils import logging as transformers_logging

from .artifacts import check_file_records
from .cli import UserError, path_hint
from .files import exists, is_dir, is_file, read_json_object, stat_error

# What a local model folder must hold, per part: at least one file matching one of the patterns.
MODEL_PARTS = {
    "tokenizer": ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json"),
    "model config": ("config.json",),
    "model weights": ("*.safetensors", "*.bin"),
}


def check_model_source(name: str, parts: tuple[str, ...] = tuple(MODEL_PARTS)) -> None:
    """A local folder must exist, be readable and hold the files of each part (MODEL_PARTS); any other name
    must be a hub id that is in the local Hugging Face cache or can be reached (check_hub_id). The path is
    asked about without raising (cuset_common/files.py: file_mode): a name too long for the file system is
    no folder, and may still be a hub id."""
    path = Path(name).expanduser()
    looks_local = exists(path) or name.startswith((".", "/", "~")) or name.count("/") > 1
    if not looks_local:
        check_hub_id(name)
        return
    if not is_dir(path):
        raise UserError(f"--model {name}: {why_no_folder(path)}")
    if not os.access(path, os.R_OK | os.X_OK):  # its files could not be listed: it would seem empty
        raise UserError(f"--model {name}: this user may not read this folder; {path_hint(errno.EACCES)}")
    for part in parts:
        if not any(any(path.glob(pattern)) for pattern in MODEL_PARTS[part]):
            raise UserError(
                f"--model {name}: this folder holds no {part} (none of "
                f"{', '.join(MODEL_PARTS[part])}); point --model at the folder that "
                f"save_pretrained wrote"
            )


MODEL_FIX = "pass a folder holding a Hugging Face model (config.json, weights, tokenizer) or a hub id"


def why_no_folder(path: Path) -> str:
    """Why a path that looks local is no model folder, and what to do: the file system's reason where it
    is not plainly absent (a name too long, a folder on the way this user may not enter)."""
    error = stat_error(path)
    if error is None:
        return f"is not a folder; {MODEL_FIX}"
    if error.errno in (errno.ENOENT, errno.ENOTDIR):
        return f"no such folder; {MODEL_FIX}"
    return f"{error.strerror}; {path_hint(error.errno)}"


TRAIN_STAGE = "03_train_cuset"  # the stage whose checkpoints load_causal_lm checks (meta.json "stage")


@functools.cache
def check_hub_id(name: str) -> None:
    """Refuse, after one request with a 2-second timeout, a name that is neither a local folder nor a hub id
    we can use: not in the local cache, and the hub unreachable (offline, no network) or without it. A
    reachable hub that has it passes: from_pretrained downloads it. Without this, from_pretrained retries
    at length first (docs/notebook.md gives how long)."""
    start = f"--model {name}: no local folder {name}, and hub id {name}"
    fix = "pass the folder that holds the model, or a hub id that exists (with network access to download it)"
    try:
        files = ("config.json", "tokenizer_config.json")
        cached = (huggingface_hub.try_to_load_from_cache(name, f) for f in files)
        if any(isinstance(path, str) for path in cached):  # a path; else None or a "known missing" marker
            return
        huggingface_hub.model_info(name, timeout=2)
    except HFValidationError as e:
        raise UserError(f"{start} is not a valid hub id ({e}); {fix}") from None
    except GatedRepoError:
        return  # it exists; from_pretrained says how to get access
    except RepositoryNotFoundError:
        raise UserError(
            f"{start} is not found on the hub (or it is private: log in with `hf auth login`); {fix}"
        ) from None
    except HfHubHTTPError:
        return  # the hub answered (an error of its own): leave the verdict to from_pretrained
    except Exception as e:  # the HTTP client's own errors (no network, DNS, timeout), and offline mode
        why = f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__
        raise UserError(
            f"{start} is not in the local cache and the hub cannot be reached ({why}); {fix}"
        ) from None


@contextlib.contextmanager
def quiet_transformers():
    """Within: transformers prints errors only, and no progress bar. Loading a model prints a multi-line
    report of the tensors it could not match and its config's doubts; the loaders here turn what matters
    of them into one line (a refusal), and a refusal must be the only line."""
    verbosity, bars = transformers_logging.get_verbosity(), transformers_logging.is_progress_bar_enabled()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(verbosity)
        if bars:
            transformers_logging.enable_progress_bar()


# What transformers raises for a config.json it cannot build a model from: its config classes' own
# validation (a number written as a string, heads that do not divide the width), or torch on a size < 0.
CONFIG_ERRORS = (StrictDataclassError, TypeError, RuntimeError)


def load_tokenizer(name: str, need_offsets: bool = True, **kwargs):
    """The model's tokenizer, fast when need_offsets (character spans). A failure is one line naming the
    path."""
    check_model_source(name, ("tokenizer",))
    try:
        with quiet_transformers():  # it reads config.json too
            tokenizer = transformers.AutoTokenizer.from_pretrained(name, **kwargs)
    except (OSError, ValueError, ImportError, KeyError) as e:
        raise UserError(
            f"--model {name}: cannot load its tokenizer ({str(e).splitlines()[0] if str(e) else e!r})"
        ) from None
    except CONFIG_ERRORS as e:
        raise UserError(
            f"--model {name}: cannot load its tokenizer: its config.json is refused "
            f"({one_line(e)}); fix config.json, or point --model at the folder save_pretrained "
            f"wrote"
        ) from None
    if need_offsets and not tokenizer.is_fast:
        raise UserError(
            f"--model {name}: its tokenizer is not a fast tokenizer; character offsets are needed"
        )
    return tokenizer


def load_causal_lm(name: str, dtype):
    """AutoModelForCausalLM in `dtype`; a failure is one line naming the path and what is wrong: a file
    missing or damaged, a config.json that transformers refuses (a number written as a string, heads that
    do not divide the width), or one that disagrees with the weights (check_loading_info)."""
    check_model_source(name, ("model config", "model weights"))
    check_trained_weights(Path(name).expanduser())
    try:
        with quiet_transformers():
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                name, dtype=dtype, output_loading_info=True, ignore_mismatched_sizes=True
            )
    except (OSError, ValueError, ImportError, KeyError, SafetensorError) as e:  # Safetensor: a damaged file
        raise UserError(
            f"--model {name}: cannot load the model ({str(e).splitlines()[0] if str(e) else e!r})"
        ) from None
    except CONFIG_ERRORS as e:
        raise UserError(
            f"--model {name}: its config.json cannot describe a model ({one_line(e)}); fix "
            f"config.json, or point --model at the folder save_pretrained wrote"
        ) from None
    check_loading_info(name, info)
    return model


def check_trained_weights(folder: Path) -> None:
    """A stage-03 checkpoint vouches for its weight files (meta.json records their sha256, as every artifact
    does: cuset_common/artifacts.py, check_file_records): refuse weights another run wrote over it."""
    meta_path = folder / "meta.json"
    if not is_file(meta_path):
        return  # a model from elsewhere (the hub, save_pretrained): nothing of ours to check
    meta = read_json_object(meta_path, "rerun the stage that wrote this model, or remove its meta.json")
    if meta.get("stage") != TRAIN_STAGE:
        return
    weights = sorted(f.name for f in folder.glob("*.safetensors"))
    check_file_records(folder, meta, weights, f"python 03_train_cuset.py ... --out {folder}")


def one_line(e: Exception) -> str:
    """An exception's message on one line (transformers' span several), or its repr if it has none."""
    return " ".join(str(e).split()) if str(e).strip() else repr(e)


def check_loading_info(name: str, info: dict) -> None:
    """Refuse a model whose config.json disagrees with its weight files: a tensor of another shape than
    the config makes (a vocab_size edited), one the config needs and the files lack (it would be left
    random), or one they hold and the config has no place for (a layer count edited: it would be dropped).
    from_pretrained only warns of the last two. Leftovers that published checkpoints carry (an older
    Llama's per-layer rotary inv_freq, position_ids, a model class's _keys_to_ignore_on_load_unexpected)
    are not in `info`: transformers removes them from it first."""
    start = f"--model {name}: config.json disagrees with the weight files"
    fix = "make config.json match the weights, or point --model at the folder save_pretrained wrote"
    if info["mismatched_keys"]:
        key, in_file, in_config = sorted(info["mismatched_keys"])[0]
        raise UserError(
            f"{start} ({len(info['mismatched_keys'])} tensor(s) of another shape, e.g. {key}: "
            f"{list(in_file)} in the files, {list(in_config)} by config.json); {fix}"
        )
    for what, keys in (
        ("that they lack", info["missing_keys"]),
        ("that it has no place for", info["unexpected_keys"]),
    ):
        if keys:
            raise UserError(f"{start} ({len(keys)} tensor(s) {what}, e.g. {sorted(keys)[0]}); {fix}")


def output_head(model):
    """(weight [V, d], bias [V] or None) of the model's output layer: logits = h @ weight.T + bias."""
    head = model.get_output_embeddings()
    return head.weight, getattr(head, "bias", None)


def check_head_is_plain(model, input_ids, stage: str) -> None:
    """Refuse a model whose logits are not `last_hidden_state @ W.T + b`.

    The stages apply the output layer themselves, in chunks over response positions only, so a model
    that scales (Granite's logits_scaling) or soft-caps (Gemma 2) its logits would be scored and trained
    on the wrong distribution. Checked on one forward pass in eval mode, on up to 64 tokens: a hook
    takes the base model's output on its way to the head. (Two passes need not agree to the last bit:
    on CPU the first forward pass of a process can take other kernels, 1e-3 apart in the logits here.)
    Tolerance: what rounding allows, not a guess. Each side's float32 dot product of length d (+ bias)
    is within gamma * (|h| @ |W|.T + |b|) of the exact value, gamma = (d+1)u / (1 - (d+1)u), u = 2^-24
    (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 3.1), plus the rounding
    of the model's logits to their own dtype.
    """
    captured = {}

    def keep(_module, _inputs, out):
        captured["hidden"] = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    was_training = model.training
    model.eval()
    hook = model.base_model.register_forward_hook(keep)
    try:
        with torch.no_grad():
            theirs = model(input_ids=input_ids[:, :64], use_cache=False).logits  # [1, L, V]
    finally:
        hook.remove()
        model.train(was_training)
    with torch.no_grad():
        hidden = captured["hidden"].float()  # [1, L, d]
        weight, bias = output_head(model)
        w = weight.float()  # [V, d]
        b = bias.float() if bias is not None else torch.zeros(w.shape[0], device=w.device)  # [V]
        ours = hidden @ w.t() + b  # [1, L, V]
        d, u = hidden.shape[-1], 2.0**-24
        gamma = (d + 1) * u / (1 - (d + 1) * u)
        allowed = (
            2 * gamma * (hidden.abs() @ w.abs().t() + b.abs()) + torch.finfo(theirs.dtype).eps * theirs.abs()
        )
        err = (ours - theirs.float()).abs().flatten()
        allowed = allowed.flatten()
        worst = torch.argmax(err - allowed)  # the logit furthest past what rounding allows
        diff, room = err[worst].item(), allowed[worst].item()
    if diff > room:
        raise UserError(
            f"model type {model.config.model_type!r} ({type(model).__name__}): its logits are "
            "not last_hidden_state @ lm_head.weight.T (+ bias): they differ by up to "
            f"{diff:.2g}, where rounding allows {room:.2g} (logit scaling or soft-capping?); "
            f"{stage} applies the output layer itself and does not support this model"
        )


def model_parameters(name: str) -> int | None:
    """Parameters in a local model folder's safetensors files, read from their headers (no weights are
    loaded); None where there are none or they cannot be read (a hub id, other weight formats, damage)."""
    folder = Path(name).expanduser()
    files = sorted(folder.glob("*.safetensors")) if is_dir(folder) else []
    try:
        return sum(tensor_sizes(path) for path in files) if files else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, struct.error):
        return None  # a damaged header: the loader will say what is wrong


def tensor_sizes(path: Path) -> int:
    """The elements of all tensors in a safetensors file: its header is a little-endian u64 byte count, then
    that much JSON, {name: {"shape": [...], ...}} beside "__metadata__"."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return sum(math.prod(entry["shape"]) for key, entry in header.items() if key != "__metadata__")
