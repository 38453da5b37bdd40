"""Stage 02's helpers, beside 02_label_regions.py as harness/ serves stage 04.

options      the command line: arguments and their ranges
inputs       the stage-01 profile, read once and checked (refused when foreign or inconsistent)
labels       RegionLabels: the profile's tokens with their thresholds, regions, masses and weights
observation  the paper's observation tested on the labels: the run statistic, three permutation nulls, Holm,
             the plain sentence
report       report.md (the finding) and regions.html (samples drawn token by token)
artifact     the regions artifact: its tensors, meta.json, the room it needs
"""
