"""kv-canary-buffers: a KV-cache canary whose every buffer is owned by construction.

Public names:

- :class:`PlanBuffers`: owns every output and scratch tensor of the plan.
- :class:`CanaryStore`: owns a KV pool's records, violation ring, counters and flags.
- :class:`RealKV`, :class:`RealKVSource`, :class:`RealKVMode`: KV layers whose bytes the
  records fingerprint, each source with its own geometry.
- :func:`write_reference`, :func:`verify_reference`: the torch write and verify stages.
- :func:`write_pair_reference`: a step's HEAD and TAIL writes (two stores, one call).
- :class:`WriteWorkspace`, :func:`write_chain_reference`, :func:`write_stamp_reference`:
  the split write (the chain before the forward, the stamp after it), in torch.
- :class:`ViolationReport`, :class:`Violation`, :class:`FailBits`: decoded violations.
- :class:`CanaryStatus`: the bits of a store's status word.
- :func:`gather_violation_reports`: every rank's report, gathered (tensor parallelism).
- :class:`GraphInputs`: capacity-sized per-row inputs for a captured (CUDA-graph) plan.
- :func:`plan_reference`: the torch plan (CPU path and the kernels' oracle).
- :func:`load_token_slots_reference`: per-token slot lists into ``req_to_token`` (the
  engines runtime's table load; ``kv_canary_kernels.launch_load_token_slots``).
- :class:`PlanInputs`, :class:`WriteInputs`, :class:`VerifyInputs`,
  :class:`WriteChainInputs`, :class:`WriteStampInputs`: each stage's keyword arguments
  (``TypedDict``), shared by its torch reference and its Triton launcher.
- :func:`validate_plan_args`: the host-side checks both plan paths run first.
- :class:`PlanStatus`: the bits of the device-side status word.
- :func:`plans_equal`: whether two buffers hold the same plan (for tests and ports).
- :func:`verify_entries_needed`: the verify entries a batch's plan emits (host-side), to
  size ``verify_capacity`` before the launch.

The Triton kernels live in the separate package ``kv_canary_kernels`` so that this one
never imports Triton.
"""

from ._version import __version__
from .buffers import PlanBuffers
from .compare import plans_equal
from .distributed import GatheredReport, RankedViolation, gather_violation_reports
from .plan import PlanArgs, PlanInputs, plan_reference, validate_plan_args
from .real_kv import RealKV, RealKVMode, RealKVSource
from .report import Violation, ViolationReport
from .sizing import verify_entries_needed
from .staging import GraphInputs
from .status import CanaryStatus, FailBits, PlanStatus
from .store import CanaryStore
from .tables import load_token_slots_reference
from .verify import VerifyInputs, verify_reference
from .workspace import WriteWorkspace
from .write import (
    WriteChainInputs,
    WriteInputs,
    WriteStampInputs,
    write_chain_reference,
    write_pair_reference,
    write_reference,
    write_stamp_reference,
)

__all__ = [
    "CanaryStatus",
    "CanaryStore",
    "FailBits",
    "GatheredReport",
    "GraphInputs",
    "PlanArgs",
    "PlanBuffers",
    "PlanInputs",
    "PlanStatus",
    "RankedViolation",
    "RealKV",
    "RealKVMode",
    "RealKVSource",
    "VerifyInputs",
    "Violation",
    "ViolationReport",
    "WriteChainInputs",
    "WriteInputs",
    "WriteStampInputs",
    "WriteWorkspace",
    "__version__",
    "gather_violation_reports",
    "load_token_slots_reference",
    "plan_reference",
    "plans_equal",
    "validate_plan_args",
    "verify_entries_needed",
    "verify_reference",
    "write_chain_reference",
    "write_pair_reference",
    "write_reference",
    "write_stamp_reference",
]
