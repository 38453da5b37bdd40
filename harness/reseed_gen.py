"""A task's gen.py under a seed no candidate can know: the script stage 04 runs, as the task author's own
trusted code (harness/programs.py: Runner.task_script), in the folder of a fresh input set
(harness/input_sets.py). That folder holds gen.py, this file and SECRET_FILE, the set's secret.

gen.py is run as its author wrote it; no task file is edited. Only the calls that seed a random generator
are replaced first, by ones that mix the seed gen.py asks for with the set's secret (mixed_seed):
torch.manual_seed (and torch.random's and torch.cuda's), numpy.random.seed, numpy.random.default_rng,
numpy.random.RandomState, random.seed and random.Random. Then gen.py runs as __main__ (runpy), as it does
on its own. Its data are then another draw of its own generators, of the same shapes, sizes and
distributions, with values no candidate has seen. A script that draws nothing at random, or seeds in a way
not replaced here (torch.Generator().manual_seed, a SeedSequence object), writes the same files as
before; stage 04 sees that and judges the task on its own input set alone.

    python reseed_gen.py        # in a folder holding gen.py and reseed.json
"""

from __future__ import annotations

import hashlib
import json
import operator
import random
import re
import runpy
import sys
from pathlib import Path

SECRET_FILE = "reseed.json"  # {"secret": "<hex>"}, written by harness/input_sets.py
GEN_SCRIPT = "gen.py"


def mixed_seed(secret: str, seed, bits: int) -> int:
    """The seed a generator gets instead of `seed`: `bits` bits of sha256(secret, seed). Integers count
    as their value (42 and numpy's int64(42) are the same seed), anything else (a list of ints) as its
    repr. Each API takes its own range: 32 bits for numpy's legacy seeding, 63 for the others."""
    try:
        key = str(operator.index(seed))
    except TypeError:
        key = repr(seed)
    digest = hashlib.sha256(f"{secret}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << bits) - 1)


def reseed_random(secret: str) -> None:
    """random.seed and random.Random (the standard library's); seed None stays unseeded (from the OS)."""
    mix = lambda a: None if a is None else mixed_seed(secret, a, 63)  # noqa: E731
    random.seed = lambda a=None, version=2: random._inst.seed(mix(a), version)

    class Random(random.Random):
        def seed(self, a=None, version=2):
            super().seed(mix(a), version)

    random.Random = Random


def reseed_numpy(secret: str) -> None:
    """numpy.random.seed, numpy.random.default_rng and numpy.random.RandomState. A Generator, BitGenerator
    or SeedSequence handed to default_rng is used as it is (it was seeded elsewhere)."""
    try:
        import numpy.random as npr
    except ImportError:
        return
    seeded = (npr.Generator, npr.BitGenerator, npr.SeedSequence)
    legacy = lambda s: None if s is None else mixed_seed(secret, s, 32)  # noqa: E731
    original_seed, original_rng = npr.seed, npr.default_rng
    npr.seed = lambda seed=None: original_seed(legacy(seed))
    npr.default_rng = lambda seed=None: original_rng(
        seed if seed is None or isinstance(seed, seeded) else mixed_seed(secret, seed, 63)
    )

    class RandomState(npr.RandomState):
        def __init__(self, seed=None):
            super().__init__(legacy(seed))

        def seed(self, seed=None):
            super().seed(legacy(seed))

    npr.RandomState = RandomState


def reseed_torch(secret: str) -> None:
    """torch.manual_seed under each of its names (torch, torch.random, torch.cuda's two)."""
    import torch

    def mixed(original):
        return lambda seed: original(mixed_seed(secret, seed, 63))

    torch.manual_seed = torch.random.manual_seed = mixed(torch.random.manual_seed)
    torch.cuda.manual_seed = mixed(torch.cuda.manual_seed)
    torch.cuda.manual_seed_all = mixed(torch.cuda.manual_seed_all)


def main() -> None:
    """Replace the seeding calls, then run gen.py as __main__ in this folder."""
    secret = json.loads(Path(SECRET_FILE).read_text())["secret"]
    source = Path(GEN_SCRIPT).read_text()
    reseed_random(secret)
    reseed_numpy(secret)
    if re.search(r"^\s*(import|from)\s+torch\b", source, re.M):  # only then: importing torch takes seconds
        reseed_torch(secret)
    sys.argv = [GEN_SCRIPT]
    runpy.run_path(GEN_SCRIPT, run_name="__main__")


if __name__ == "__main__":
    main()
