"""The plan's kernels: the flat work lists of one batch (docs/contract.md).

Three families, by batch size and launch mode (docs/design.md, "The plan's kernels"):

- :mod:`.small_batch`: one launch below ``SCAN_BLOCK`` rows;
- :mod:`.large_batch`: one launch from ``SCAN_BLOCK`` rows, eager, below
  ``LaunchConfig.one_launch_max_rows`` (scanner and worker programs that wait for each
  other on the device);
- :mod:`.offsets` then :mod:`.entries`: three launches (block sums, offsets, entries) when
  captured in a CUDA graph or larger.

:mod:`.common` holds the device functions they share; :mod:`.dispatch` picks the family and
launches it (``dispatch_plan``, behind ``kv_canary_kernels.launch_plan``).
"""

from .dispatch import dispatch_plan, int_classes

__all__ = ["dispatch_plan", "int_classes"]
