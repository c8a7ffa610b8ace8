"""What the tests share: the device they run on and the plan's kernel paths (this module),
input generators and comparisons of the plan (:mod:`.plan`), of write and verify
(:mod:`.canary`), and the plain-Python oracle of the plan contract (:mod:`.oracle`)."""

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
"""Where the tests run: CUDA when there is one, else the CPU (kernels interpreted)."""

LARGE_PATHS = {"large-one-launch": {}, "large-three-launches": {"one_launch_max_rows": 0}}
"""The two kernel paths of a batch of at least SCAN_BLOCK rows: one launch (eager, below
``one_launch_max_rows``) and three (captured graphs and larger batches), as
``launch_config`` changes."""
