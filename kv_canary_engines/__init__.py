"""kv-canary-engines: the KV-cache canary inside serving engines.

:mod:`kv_canary_engines.runtime` holds the engine-neutral runtime (its API summary is at
the top of that module); engine adapters live in their own modules and import their
engine lazily: ``kv_canary_engines.transformers.install(model, manager)`` for
transformers' continuous batching. :mod:`kv_canary_engines.faults` makes a running engine
misbehave, for tests and demonstrations.
"""

from .reports import (
    CanaryReport,
    CanaryViolationError,
    Endpoint,
    EngineViolation,
    Health,
    decode_tag,
    launch_tag,
)
from .runtime import (
    AbortCallback,
    CanaryConfig,
    CanaryRuntime,
    KVGroup,
    Policy,
    Row,
    RuntimeStats,
    StepBatch,
    SweepBatch,
)
from .tables import BlockTable, SlotTable, TokenSlots, expand_into_req_to_token

__all__ = [
    "AbortCallback",
    "BlockTable",
    "CanaryConfig",
    "CanaryReport",
    "CanaryRuntime",
    "CanaryViolationError",
    "Endpoint",
    "EngineViolation",
    "Health",
    "KVGroup",
    "Policy",
    "Row",
    "RuntimeStats",
    "SlotTable",
    "StepBatch",
    "SweepBatch",
    "TokenSlots",
    "decode_tag",
    "expand_into_req_to_token",
    "launch_tag",
]
