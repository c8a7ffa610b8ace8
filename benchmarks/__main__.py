"""``python -m benchmarks``: the benchmark's one entry point (:func:`benchmarks.bench.main`)."""

from benchmarks.bench import main

raise SystemExit(main())
