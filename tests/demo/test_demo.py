"""The main job, ``python -m kv_canary_demo``: flags, --version, refused devices in one
line, a clean run (0 violations, exit 0), --inject-corruption catching every kind, the
kernels in a tiny run, no progress bar and no traceback when the output is a closed pipe.

The runs use the torch references at small sizes (the Triton interpreter costs
milliseconds a program), except one tiny run of the kernels."""

import os
import re
import subprocess
import sys

import pytest
import torch

from kv_canary_buffers import __version__
from kv_canary_demo import Corruption
from kv_canary_demo.cli import run

CUDA = torch.cuda.is_available()
# Where the Triton kernels can run in this session: the GPU, else the interpreter on CPU
# (tests/conftest.py sets TRITON_INTERPRET=1 when there is no CUDA).
KERNELS = ["--device", "cuda"] if CUDA else ["--stages", "kernels"]
# in this process TRITON_INTERPRET=1 may be set, and auto would pick the kernels
SMALL = ["--max-batch", "8", "--max-seq-len", "64", "--stages", "reference"]
STEP_LINE = re.compile(r"^step \d+: ")


def demo(*args: str, env_drop=("TRITON_INTERPRET",), **kwargs) -> subprocess.CompletedProcess:
    """The demo as a module in a fresh process (stdout and stderr are pipes)."""
    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    return subprocess.run(
        [sys.executable, "-m", "kv_canary_demo", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        **kwargs,
    )


def body(text: str) -> list:
    """The lines between the header and the summary."""
    return text.split("\nsummary")[0].splitlines()[1:]


def value(text: str, key: str) -> str:
    m = re.search(rf"^\s*{re.escape(key)}\s+(.+?)\s*$", text, re.MULTILINE)
    assert m, f"no {key!r} in the summary"
    return m.group(1)


def test_clean_run_as_a_module_has_no_violation():
    out = demo("--steps", "30", *SMALL)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert text.startswith(
        f"kv-canary demo {__version__}: 30 steps on cpu, HEAD and TAIL "
        "stores, stages: torch references"
    )
    assert value(text, "violations") == "0"
    assert value(text, "plans differing from plan_reference") == "0"
    assert int(value(text, "overflow steps (verify skipped)")) >= 1
    assert int(value(text, "slots reused from earlier requests")) > 0
    assert text.rstrip().endswith("result: OK: 0 violations, every plan equal to plan_reference")
    # every message about a step says which step, the growth mid-run included
    lines = body(text)
    assert lines and all(STEP_LINE.match(line) for line in lines), lines
    assert any(re.match(r"step 15: KV pool grew .*: 528 -> 1056 slots", line) for line in lines)
    assert any("plan buffers grew: write_req_capacity 8 -> 16" in line for line in lines)
    assert any("verify_enable=0" in line for line in lines)
    # what is timed, without the warm-up: min, median, p90 and the count
    timing = re.search(
        r"^timing: host time of one eager step's canary launches \(plan \+ "
        r"HEAD verify \+ write \+ TAIL verify; both groups\): min [\d.]+ m?s, "
        r"median [\d.]+ m?s, p90 [\d.]+ m?s over (\d+) steps \((\d+) warm-up",
        text,
        re.MULTILINE,
    )
    assert timing and int(timing.group(1)) + int(timing.group(2)) == 30
    # no progress bar when the output is not a terminal
    assert "\r" not in text + out.stderr and "━" not in text + out.stderr
    assert out.stderr == ""


def test_inject_corruption_catches_every_kind(capsys):
    code = run(["--steps", "24", "--inject-corruption", "--seed", "1", *SMALL])
    text = capsys.readouterr().out
    assert code == 0, text
    lines = body(text)
    assert all(STEP_LINE.match(line) for line in lines), lines
    table = text.split("injected corruption")[1]
    decoded = text.split("first violation of each kind (decoded):")[1]
    for kind in Corruption:
        injected = [line for line in lines if f"injected {kind.value}: " in line]
        assert len(injected) == 1, kind
        row = re.search(
            rf"^\s*{re.escape(kind.value)}\s+step (\d+)\s+step (\d+), "
            r"(HEAD|TAIL) store",
            table,
            re.MULTILINE,
        )
        assert row and int(row.group(2)) >= int(row.group(1)), kind
        first = re.search(
            rf"^  {re.escape(kind.value)}: \[([A-Z_|]+)\] tag \d+ slot \d+", decoded, re.MULTILINE
        )
        assert first, kind
        assert {b.name for b in kind.expected_bits} <= set(first.group(1).split("|"))
    assert value(text, "violations outside injected requests") == "0"
    assert int(value(text, "violations")) >= len(Corruption)
    assert text.rstrip().endswith(
        "result: OK: all 7 injected kinds caught, "
        f"{value(text, 'violations')} violations, all in the "
        "injected requests"
    )


def test_the_kernels_in_a_tiny_run(capsys):
    code = run(["--steps", "4", "--max-batch", "2", "--max-seq-len", "16", *KERNELS])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "stages: Triton kernels (launch_plan, launch_verify, launch_write" in text
    assert value(text, "stores differing from reference stores") == "0"
    assert value(text, "plans differing from plan_reference") == "0"
    assert value(text, "violations") == "0"
    if CUDA:
        assert "replayed from CUDA graphs" in text and int(value(text, "graph captures")) >= 1


def test_one_step_plans_something_and_says_nothing_was_timed(capsys):
    assert run(["--steps", "1", "--stages", "reference"]) == 0
    text = capsys.readouterr().out
    planned = re.match(r"(\d+) \((\d+) active", value(text, "rows planned (padding included)"))
    assert planned and int(planned.group(2)) >= 1
    assert int(value(text, "tokens stamped (both groups)")) > 0
    assert "no step left to time (1 warm-up, capture or resize step(s) left out)" in text


def test_seed_changes_the_run(capsys):
    run(["--steps", "6", "--seed", "1", *SMALL])
    first = capsys.readouterr().out.split("summary")[1].split("timing:")[0]
    run(["--steps", "6", "--seed", "2", *SMALL])
    second = capsys.readouterr().out.split("summary")[1].split("timing:")[0]
    assert first != second


def test_no_tail_keeps_only_the_head_store(capsys):
    assert run(["--steps", "6", "--no-tail", *SMALL]) == 0
    text = capsys.readouterr().out
    assert "HEAD store only" in text
    assert "(plan + HEAD verify + write; both groups)" in text


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"kv-canary-buffers {__version__}\n"


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--version",
        "--steps",
        "--max-batch",
        "--max-seq-len",
        "--device",
        "--seed",
        "--inject-corruption",
        "--stages",
        "--no-tail",
        "--no-graphs",
    ):
        assert flag in out


@pytest.mark.parametrize("device", ["foo", "mps", "xpu", "meta", "cuda:x", "cpu:1", "cuda:99"])
def test_unusable_devices_are_refused_in_one_line(device, capsys):
    if device == "cuda:99" and not CUDA:
        pytest.skip("needs CUDA: without it, any cuda device is refused as unavailable")
    with pytest.raises(SystemExit) as exit_info:
        run(["--device", device])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"kv-canary demo: error: --device {device}: ")
    assert "devices that work" in lines[0] and "cpu" in lines[0]


@pytest.mark.skipif(CUDA, reason="CUDA is available here")
def test_cuda_without_cuda_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(["--device", "cuda"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "kv-canary demo: error: --device cuda: CUDA is not available on this machine; "
        "devices that work here: cpu\n"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "0"], "--steps and --max-batch must be >= 1"),
        (["--max-seq-len", "4"], "--max-seq-len must be >= 8, got 4"),
        (
            ["--steps", "10", "--inject-corruption"],
            "--inject-corruption needs --steps >= 20, got 10",
        ),
    ],
)
def test_bad_arguments_are_refused_in_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(args)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"kv-canary demo: error: {message}\n"


@pytest.mark.skipif(CUDA, reason="with CUDA the kernels can run")
def test_kernels_without_triton_are_refused_in_one_line():
    out = demo("--stages", "kernels")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith(
        "kv-canary demo: error: --stages kernels: the Triton kernels "
        "need a CUDA device, or TRITON_INTERPRET=1"
    )
    assert len(out.stderr.splitlines()) == 1


def test_a_closed_pipe_ends_the_demo_quietly():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kv_canary_demo", "--steps", "40", "--inject-corruption", *SMALL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # like `| head -1`: the reader goes away, the demo writes on
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert first.startswith(b"kv-canary demo")
    assert "Traceback" not in err and "BrokenPipeError" not in err and err == ""
    assert code == 1  # quiet, as rich's console and Python's SIGPIPE recipe end it


def test_the_demo_modules_never_import_triton():
    code = (
        "import sys\n"
        "from kv_canary_demo import simulation\n"
        "from kv_canary_demo.cli import run\n"
        "assert run(['--steps', '2', '--max-batch', '4', '--max-seq-len', '16']) == 0\n"
        "assert 'triton' not in sys.modules, 'triton was imported'\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


CURSOR_UP = re.compile(r"\x1b\[(\d*)A")


def committed_lines(raw: str) -> list[str]:
    """What stays on a terminal's scrollback: each line ended by a newline, as the last
    carriage-return segment that holds text, without colour and erase sequences; a cursor
    moved up (to erase a transient bar) takes the lines it passes back."""
    lines: list[str] = []
    for physical in raw.split("\n")[:-1]:
        for up in CURSOR_UP.findall(physical):
            del lines[len(lines) - int(up or 1) :]
        segments = [ANSI.sub("", s) for s in physical.split("\r")]
        shown = [s for s in segments if s.strip()]
        lines.append(shown[-1] if shown else "")
    return lines


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_on_a_terminal_messages_print_above_the_progress_bar():
    """On a terminal the bar is drawn (and erased at the end: transient), and every
    ``step N:`` message is a whole line of its own above it, the same lines a piped run
    prints; the bar never ends up in the scrollback."""
    import select

    args = ["--steps", "40", *SMALL]
    master, slave = os.openpty()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(COLUMNS="120", TERM="xterm")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kv_canary_demo", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    raw = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        raw += chunk
    os.close(master)
    assert proc.wait(timeout=120) == 0
    text = raw.decode()
    assert "━" in text  # the bar was drawn
    lines = committed_lines(text)
    assert not any("━" in line for line in lines), "the bar stayed in the scrollback"
    messages = [line for line in lines if STEP_LINE.match(line)]
    piped = [line for line in demo(*args).stdout.splitlines() if STEP_LINE.match(line)]
    assert messages == piped and len(messages) >= 5
    assert any(re.match(r"step \d+: KV pool grew ", line) for line in messages)
    assert lines[0].startswith("kv-canary demo ") and lines[-1].startswith("result: OK")


def test_importing_the_package_loads_neither_kernels_nor_triton():
    """The torch layer never imports the kernel package (nor Triton) at module level: the
    demo imports it only when it runs the kernels."""
    code = (
        "import kv_canary_buffers, kv_canary_demo.cli, kv_canary_demo.simulation, sys; "
        "print('kv_canary_kernels' in sys.modules, 'triton' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "False False\n"
