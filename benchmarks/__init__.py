"""The benchmarks of kv-canary-buffers: one entry point (``python -m benchmarks``, the
stages side by side), the modules it shares with the probes (``harness``, ``plan_cases``,
``canary_cases``, ``baselines``, ``canary_baselines``), and single-question probes in
``benchmarks.probes``. Run from the repository's root; ``benchmarks/README.md`` lists them.

Importing this package imports nothing else: ``bench.py --smoke`` must choose Triton's
interpreter before Triton is imported.
"""
