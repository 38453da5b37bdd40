"""Stage 03's helpers, beside 03_train_cuset.py as harness/ serves stage 04.

scale       distributed setup (one process, DDP or FSDP2 under torchrun), FSDP2 sharding, the memory plan
checkpoint  the resume state a killed run continues from (<out>/resume/), and the final checkpoint
"""
