"""Stage 03's helpers, beside 03_train_cuset.py as harness/ serves stage 04: the run's plumbing, so that the
stage file holds the method (its objectives, the loss, the step).

options     the command line: argument groups, RANGES, what --resume may change
samples     the samples, tokenized and aligned with stage 02's regions artifact; collate
schedule    the number of steps, the learning rate of each (lr_at), the global batches (batch_order)
run         the run's setup and end: processes, the model checked and placed, the optimizer, Training
step_log    the log of each optimizer step (log.jsonl, the progress line, the trackers) and curves.png
mfu         model FLOPs and MFU: the peak table of GPUs
scale       distributed setup (one process, DDP or FSDP2 under torchrun), FSDP2 sharding, the memory plan
checkpoint  the resume state a killed run continues from (<out>/resume/), and the final checkpoint
divergence  what a loss, gradient or weight that is not finite stops, and how a run goes on
trace       the worked trace of one sample (--trace)
"""
