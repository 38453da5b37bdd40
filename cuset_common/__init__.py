"""What two or more parts of the project use, one concept per module; import from the module itself
(`from cuset_common.method import sample_threshold`), so that go-to-definition lands on the definition.

  paths         where the project's files are; nvcc flags, prompt levels and modes
  cli           UserError and run_main (one-line errors, exit status 2), the argument parser and its range
                checks, the device, the precision
  files         atomic writes, JSONL read with file:line errors, hashes
  artifacts     artifact folders (tensors + meta.json), the checks on them, the rule for --out folders
  data          SFT records in any supported form, and the tokenization every stage uses
  data_sources  --data as a table, dataset folder or hub id, with --data-fields and --data-where
  models        loading models and tokenizers with one-line errors; the plain-head check
  method        what stages 01-03 compute alike: the per-sample threshold, the chunked gold log-prob head
  tasks         CUDABench tasks and the prompt builder (the SFT data and stage 04 word prompts alike)

Each stage's own helpers live beside it: profiler/ (stage 01), labeling/ (stage 02), training/ (stage 03),
harness/ (stage 04).
"""
