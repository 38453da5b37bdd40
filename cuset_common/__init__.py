"""What two or more parts of the project use, one concept per module; import from the module itself
(`from cuset_common.method import sample_threshold`), so that go-to-definition lands on the definition.

  paths         where the project's files are; nvcc flags, prompt levels and modes
  cli           UserError and run_main (one-line errors, exit status 2), the argument parser and its range
                checks
  progress      the one progress display of every long loop
  trackers      --report-to: the figures a stage logs, to TensorBoard, Trackio or wandb too
  figures       the pictures a run draws (matplotlib, optional), written atomically
  device        the device and the precision a stage computes in; nvidia-smi with a time limit
  files         atomic writes, JSONL read with file:line errors, hashes
  artifacts     artifact folders (tensors + meta.json) and the checks on them
  out_dir       the rule for --out folders: what may be replaced, room, the previous artifact kept aside
  out_lock      one run at a time in an --out
  data          SFT records in any supported form, and the tokenization every stage uses
  data_sources  --data as a table, dataset folder or hub id, with --data-fields and --data-where
  models        loading models and tokenizers with one-line errors; the plain-head check
  method        what stages 01-03 compute alike: the per-sample threshold, the chunked gold log-prob head
  tasks         CUDABench tasks and the prompt builder (the SFT data and stage 04 word prompts alike)

Each stage's own helpers live in a folder of their own: profiler/ (stage 01), labeling/ (stage 02),
training/ (stage 03); stage 04's, the evaluation machinery, in harness/.
"""

import sys

# The oldest Python the project runs on (README): 3.11.0; Debian 12's own 3.11.2 and CI's newest 3.11 are
# tested. Older ones would fail somewhere inside with a traceback; here they get one line and exit status 2.
if sys.version_info < (3, 11):  # noqa: UP036 (ruff's target is 3.11: this line is for those who are not)
    print(
        f"error: Python {sys.version.split()[0]} is too old: the project needs 3.11 or newer", file=sys.stderr
    )
    sys.exit(2)
