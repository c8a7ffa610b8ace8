"""kv-canary-buffers: the buffers of a KV-cache canary's plan stage, sized by construction.

Public names:

- :class:`PlanBuffers`: owns every output and scratch tensor of the plan.
- :class:`GraphInputs`: capacity-sized per-row inputs for a captured (CUDA-graph) plan.
- :func:`plan_reference`: the torch plan (CPU path and the kernels' oracle).
- :func:`validate_plan_args`: the host-side checks both plan paths run first.
- :class:`PlanStatus`: the bits of the device-side status word.
- :func:`plans_equal`: whether two buffers hold the same plan (for tests and ports).

The Triton kernels live in the separate package ``kv_canary_kernels`` so that this one
never imports Triton.
"""

from .buffers import PlanBuffers
from .compare import plans_equal
from .plan_reference import plan_reference
from .staging import GraphInputs
from .status import PlanStatus
from .validation import PlanArgs, validate_plan_args

__all__ = [
    "GraphInputs",
    "PlanArgs",
    "PlanBuffers",
    "PlanStatus",
    "plan_reference",
    "plans_equal",
    "validate_plan_args",
]
__version__ = "0.1.0"
