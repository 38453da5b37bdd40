"""Stage 01's helpers, beside 01_profile.py as harness/ serves stage 04.

options      the command line: arguments, their ranges, what --resume may change
tagger       CUDA sensitivity: the categories, their priority, the lexemes and the structural rules
cuda_source  reading CUDA C++: the code view, brackets, expression edges, device functions
batching     auto sizes per device, the batch plan, the progress lines, line indices, the closing summary
shards       <out>.partial/ shards of finished batches, for --resume
inputs       --data read once (its sha256 is of the bytes profiled), the check that scores are finite
"""
