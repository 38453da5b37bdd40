"""The paper's comparison in one command: every objective x seed through the four stages, then one table.

Runs stages 01 and 02 once with the base model (on the training data, for the regions stage 03 uses, and
on the held-out data, for the "hard tokens" columns), then for each objective and seed: 03 (train), 01
with the checkpoint on the held-out data (token metrics) and 04 once per evaluation (kernel verdicts).
Each stage is called as a subprocess (`python 0N_*.py ...`, output in <run>/log.txt); this file only
decides what to run and aggregates the artifacts: the method lives in the stages.

Evaluations. An evaluation is a name and stage-04 arguments of its own, into <run>/eval-<name>/; its name
begins with its mode (`kernel`, `kernel-sampled`, `standalone`). `--evaluation kernel --evaluation
"kernel-sampled=--num-samples 4 --temperature 0.8 --seed 0"` gives the greedy verdict beside pass@1 and
pass@4 of samples; `--modes kernel,standalone` means one evaluation per mode, named by it.

Variants. An objective may name a variant after a dot (VARIANTS): extra arguments of one stage for its
runs. `cuset.no-snap` trains cuset on regions that stage 02 made with --no-snap-lines (for data whose
snapped regions cover much of each response); `profit.t01` trains profit with --profit-threshold 0.01.
With --eval-base (presets cpu-real, cpu-power) stage 04 also evaluates the untrained base model, a row of
its own.

    python research/compare_objectives.py --preset cpu-quick            # tiny model, 2 CPU cores (see --help)
    python data/build_smollm2.py && python research/compare_objectives.py --preset cpu-real   # real model
    python research/compare_objectives.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --out runs/compare-qwen1.5b
    python research/compare_objectives.py --preset cpu-quick --objectives sft,cuset --seeds 1 # a smaller look
    python research/compare_objectives.py --preset cpu-power --runs sft-seed0,cuset-seed0        # part of one
    python research/compare_objectives.py --help

Outputs in --out: comparison.md (tables, what each column means, the commands), comparison.json (every
number), comparison.png (held-out NLL per CUDA-sensitivity category; only with matplotlib installed), and
base/ and <objective>-seed<k>/ with the stages' artifacts, log.txt (every stage call and its output) and
timings.json (seconds per step).

Resume. A step (one stage call) is finished when its artifact exists (meta.json; stage 04: summary.json)
and matches what would be run now: the arguments the stage records equal those it would be given (stage
04: its fingerprint.json), the data sha256 is the data's, and it is newer than the artifacts it reads (a
retrained checkpoint makes its profile and evaluations stale). Finished steps are skipped; a run whose
steps are all finished is skipped. A step that was interrupted continues: stage 01 with --resume when
<out>.partial/ holds the same run, newer than what it reads (else that folder is removed and it starts
over), stage 03 with --resume when <ckpt>/resume/ does (else --force: it starts over), stage 04 in the same
--out (it keeps finished rows; --force when the folder holds another run). A stage gets SIGTERM when this
command dies (Linux), so a rerun never races one left running. With everything finished a call only
re-aggregates. A finished training's resume state (<ckpt>/resume/) is deleted: the checkpoint stays. A
training that diverges (stage 03 stops on a loss, gradient or weight that is not finite, exit 2) is recorded
in <run>/diverged.json with its arguments: the run's other steps are skipped, the comparison goes on, and
the report names it "diverged" instead of giving numbers of a model that was never made; a call with other
--train-args trains it again.

Split across processes or sessions. `--runs sft-seed1,cuset-seed1` runs the base stages and those runs
only, and writes no table (two processes with one torch thread each share 2 cores; give --no-eval-base to
all but one, so that one evaluates the base model; keep their trainings apart where memory is short:
docs/comparison.md gives what stage 03 holds). `--save-record DIR` copies every finished group (base,
runs) into DIR without checkpoint weights (small enough to commit, and meant to be: a new machine starts
without runs/; docs/comparison.md gives the sizes), and `--report-only --out DIR` makes the table from
such a record as it is, running nothing and checking no freshness (a record restored from git has no
weights, and checkout times for mtimes).

Metrics (comparison.md says what each column means). Token metrics come from stage 01's profile of the
checkpoint on the held-out data, aligned token by token with the base model's (same tokenizer and data,
checked). Paired differences to sft: per objective a matrix [seeds, units] (units: held-out samples for
token metrics, prompts = task x level for pass@1, each prompt's value its share of passing samples); a
bootstrap draws the units with replacement, the same draw for the objective and sft, and each side's
seeds with replacement, independently (seed k of one objective is a training apart from seed k of sft);
95% percentile interval of mean(objective) - mean(sft), its standard error, and the smallest difference
that design resolves at 80% power and a 5% two-sided level: (z_0.975 + z_0.8) x SE.

The code, one idea a module: stages.py (the stage scripts as this command calls them), objectives.py
(objectives, variants, evaluations), presets.py (each preset's options, as data), options.py (the command
line and its checks), plan.py (the stage calls), steps.py (finished or continued), runner.py (the
subprocesses), records.py (--save-record, --report-only), metrics.py (the numbers), bootstrap.py (the
paired statistics), report.py (comparison.md, .json, .png), command.py (main).
"""
