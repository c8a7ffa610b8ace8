"""kv-canary-kernels: the Triton plan kernels behind :func:`launch_plan`.

``launch_plan(buffers, **same keyword arguments as plan_reference)`` accepts nothing but a
:class:`kv_canary_buffers.PlanBuffers`. To run the kernels on CPU tensors (tests), set
``TRITON_INTERPRET=1`` before this package is imported.
"""

from .plan import dispatch_plan, launch_plan

__all__ = ["dispatch_plan", "launch_plan"]
