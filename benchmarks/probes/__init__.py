"""Single-question probes: each module asks one question about the canary's cost, says in
its docstring how to run it (``python -m benchmarks.probes.<name>`` from the repository's
root) and what it last answered, where and when. ``benchmarks/README.md`` lists them.
They print their answer and keep a copy in ``benchmarks/out/`` (``harness.logged``).
"""
