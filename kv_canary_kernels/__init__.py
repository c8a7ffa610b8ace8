"""kv-canary-kernels: the Triton kernels of the canary's three stages.

Each launcher accepts nothing but the library's own buffer classes and takes the same
keyword arguments as its torch reference in ``kv_canary_buffers``:

- :func:`launch_plan` (``plan_reference``): fill a :class:`PlanBuffers` from a batch.
- :func:`launch_write` (``write_reference``): stamp the records of the slots a step wrote.
- :func:`launch_write_pair` (``write_pair_reference``): a step's HEAD and TAIL writes (two
  stores) in one launch.
- :func:`launch_verify` (``verify_reference``): check the records of a plan's entries.
- :func:`launch_load_token_slots` (``load_token_slots_reference``): an engine's per-token
  slot lists into a ``req_to_token`` table (the engines runtime's table load on CUDA).
- :func:`launch_write_chain` / :func:`launch_write_stamp` (``write_chain_reference`` /
  ``write_stamp_reference``): the write split in two, the chain before the forward and
  the stamp after it (docs/user-guide.md, "The split write").

To run the kernels on CPU tensors (tests), set ``TRITON_INTERPRET=1`` before anything
imports ``triton`` (this package or another, see docs/troubleshooting.md).
"""

from kv_canary_buffers._version import __version__

from .launch import (
    launch_plan,
    launch_verify,
    launch_write,
    launch_write_chain,
    launch_write_pair,
    launch_write_stamp,
)
from .tables import launch_load_token_slots

__all__ = [
    "__version__",
    "launch_load_token_slots",
    "launch_plan",
    "launch_verify",
    "launch_write",
    "launch_write_chain",
    "launch_write_pair",
    "launch_write_stamp",
]
