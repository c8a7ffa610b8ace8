"""kv-canary-demo: the whole canary around a toy serving engine (``python -m kv_canary_demo``)."""
