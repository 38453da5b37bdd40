"""RegionLabels: what stage 02 knows about each token, sample and region once the region rule has run.

02_label_regions.py builds it (docs/method.md "Regions" for the notation); the tests of the paper's
observation (observation.py) and the report and page (report.py) read it. T response tokens in S samples,
flat in sample order; R regions, sorted and disjoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RegionLabels:
    sample_offsets: np.ndarray  # int64 [S+1]: sample i's tokens are sample_offsets[i]:sample_offsets[i+1]
    n: np.ndarray  # n_i, int64 [S]
    sample_of: np.ndarray  # int [T]: the sample i of each token
    p0: np.ndarray  # p0_it, float64 [T]: the base model's probability of the gold token
    entropy: np.ndarray  # float64 [T]: entropy of the base model's next-token distribution, in nats
    c: np.ndarray  # c_it, uint8 [T]: CUDA-sensitivity category code, 0 = not sensitive
    line_index: np.ndarray  # int64 [T]: source line of the token's first character, within its response
    char_start: np.ndarray  # int32 [T]: the token's characters in its response text, start ...
    char_end: np.ndarray  # int32 [T]: ... and end (exclusive)
    tau: np.ndarray  # tau_i, float64 [S]: the sample's confidence threshold
    low: np.ndarray  # bool [T]: low confidence, p0_it < tau_i
    region_id: np.ndarray  # int32 [T]: the region r of each token, -1 outside every region (r_it = 1: >= 0)
    region_start: np.ndarray  # int64 [R]: first token of each region (flat index)
    region_end: np.ndarray  # int64 [R]: one past its last token
    region_category: np.ndarray  # uint8 [R]: majority category of the region's sensitive tokens
    m: np.ndarray  # m_i, float64 [S]: region mass
    w: np.ndarray  # w_i, float64 [S]: sample weight
