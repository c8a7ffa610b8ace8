"""Run the write and verify kernels, and the split write's chain and stamp, on data outside
the store and the inputs, for compute-sanitizer:

    PYTHONPATH=. compute-sanitizer --tool memcheck python scripts/memcheck/canary.py

Each case raises its CanaryStatus bit (checked) and must not read or write outside a
tensor (memcheck reports any). Then hostile plans: every plan field drawn from the whole
int64 range, with real-KV sources of several geometries. Sources that do not cover the
store are refused by the launchers; their cases go to the stages' dispatch past that
check (as the bounds check behind it). Every write case runs as the split write too
(stage ``split``: the chain, then the stamp), and a stamp replayed without its chain
(``WRITE_CHAIN_STALE``), and as the pair write (stage ``pair``: HEAD and TAIL in one
launch, the TAIL its own store, which must raise the same bit). Runs on the CPU too
(``TRITON_INTERPRET=1``), without the sanitizer.
"""

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from kv_canary_buffers import (
    CanaryStatus,
    CanaryStore,
    PlanBuffers,
    RealKV,
    RealKVMode,
    RealKVSource,
    WriteWorkspace,
)
from kv_canary_buffers.verify import validate_verify_args
from kv_canary_buffers.write import WritePairArgs, WriteStampArgs, validate_write_args
from kv_canary_kernels import (
    launch_verify,
    launch_write,
    launch_write_chain,
    launch_write_pair,
    launch_write_stamp,
)
from kv_canary_kernels.verify import dispatch_verify
from kv_canary_kernels.write import dispatch_write, dispatch_write_pair
from kv_canary_kernels.write_split import dispatch_write_stamp

DEV = "cuda" if torch.cuda.is_available() else "cpu"
N_SLOTS = 64
EDGES = [-(2**63), -(2**62), -(2**31) - 1, -1, 0, 1, 2**31, 2**62, 2**63 - 1]


def setup(rows=3, n=6):
    plan = PlanBuffers.allocate(write_req_capacity=4, verify_capacity=8, device=DEV)
    plan.write_num_valid_reqs.fill_(rows)
    plan.write_offsets[: rows + 1].copy_(torch.arange(rows + 1) * (n // rows))
    plan.write_seed_slot_indices.fill_(-1)
    plan.verify_slot_indices.copy_(torch.arange(1, 9))
    plan.verify_prev_slot_indices.copy_(torch.arange(0, 8))
    plan.verify_expected_positions.zero_()
    plan.verify_expected_tokens.fill_(-1)
    plan.verify_num_valid.fill_(8)
    plan.verify_enable.fill_(1)
    store = CanaryStore.allocate(num_slots=N_SLOTS, violation_capacity=16, device=DEV)
    step = dict(
        input_ids=torch.arange(n, device=DEV),
        positions=torch.arange(n, device=DEV),
        out_cache_loc=torch.arange(10, 10 + n, device=DEV),
    )
    kv = torch.zeros(N_SLOTS // 2, 64, dtype=torch.float16, device=DEV)  # 2 slots a row
    real_kv = RealKV(mode=RealKVMode.PARTIAL, sources=(kv,), page_size=2, bytes_per_token=64)
    return plan, store, step, real_kv


def case(name, mutate, expected, stage):
    plan, store, step, _real_kv = setup()
    kw = {"real_kv": None}
    mutate(plan, store, step, kw)
    # Twice: the second launch with the same objects takes the launchers' fast path
    # (cached addresses, kv_canary_kernels/fast_launch.py), which memcheck must see too.
    for _ in range(2):
        launch(stage, store, plan, step, kw["real_kv"])
    flags = store.take_status()
    if stage == "split":  # each chain's stamp is replayed once without it: stale
        expected |= CanaryStatus.WRITE_CHAIN_STALE
    assert flags == expected, (name, flags, expected)
    if stage == "pair":  # the TAIL half skipped and flagged the same data
        tail_flags = TAILS.pop(id(store)).take_status()
        assert tail_flags == expected, (name, "tail", tail_flags, expected)
    print(f"{stage:6s} {name:34s} status={flags!r}")


TAILS: dict[int, CanaryStore] = {}
"""A pair launch's TAIL store per HEAD store (by the store's id, as WORKSPACES)."""

WORKSPACES: dict[int, WriteWorkspace] = {}
"""A workspace per store (by the store's id: the cases' stores live until their case ends)."""


def launch(stage, store, plan, step, real_kv):
    """``stage``'s launcher; for sources that do not cover the store (which it refuses,
    nothing written), the stage's dispatch past that check."""
    covers = real_kv is None or all(
        s.rows * s.page_size >= store.num_slots for s in real_kv.sources
    )
    if stage == "split":
        ws = WORKSPACES.get(id(store))
        if ws is None or ws.slot_capacity < store.num_slots:
            ws = WORKSPACES[id(store)] = WriteWorkspace.for_store(store, token_capacity=64)
        launch_write_chain(store, plan, ws, **step)
        stamp = WriteStampArgs(step["out_cache_loc"].shape[0], ws.last_chain.launch, real_kv)
        if covers:
            launch_write_stamp(store, plan, ws, real_kv=real_kv)
        else:
            dispatch_write_stamp(store, ws, stamp)  # past the door's coverage check
        dispatch_write_stamp(store, ws, stamp)  # replayed without its chain: stale
        return
    if stage == "pair":  # HEAD and TAIL in one launch: the tail its own store and ring
        tail = TAILS.get(id(store))
        if tail is None or tail.num_slots != store.num_slots:
            tail = TAILS[id(store)] = CanaryStore.allocate(
                num_slots=store.num_slots, violation_capacity=8, device=DEV
            )
        plain = {k: step[k] for k in ("input_ids", "positions", "out_cache_loc")}
        if covers:
            launch_write_pair(store, tail, plan, tail_launch_tag=1, **step, real_kv=real_kv)
            return
        pair = WritePairArgs(
            validate_write_args(store, plan, **step)._replace(real_kv=real_kv),
            validate_write_args(tail, plan, **plain, launch_tag=1)._replace(real_kv=real_kv),
        )
        dispatch_write_pair(store, tail, plan, pair)  # past the door's coverage check
        return
    if covers:
        if stage == "write":
            launch_write(store, plan, **step, real_kv=real_kv)
        else:
            launch_verify(store, plan, real_kv=real_kv)
        return
    if stage == "write":
        try:
            launch_write(store, plan, **step, real_kv=real_kv)
        except ValueError as err:
            assert "must cover the store" in str(err), err
        args = validate_write_args(store, plan, **step)._replace(real_kv=real_kv)
        dispatch_write(store, plan, args)
    else:
        try:
            launch_verify(store, plan, real_kv=real_kv)
        except ValueError as err:
            assert "must cover the store" in str(err), err
        dispatch_verify(store, plan, validate_verify_args(store, plan)._replace(real_kv=real_kv))


def small_kv(plan, store, step, kw):
    kw["real_kv"] = RealKV(
        mode=RealKVMode.ALL,
        sources=(torch.zeros(3, 64, dtype=torch.float16, device=DEV),),  # slots 0..5 only
        page_size=2,
        bytes_per_token=64,
    )


CASES = [
    (
        "seed past num_slots",
        lambda p, s, st, kw: p.write_seed_slot_indices.fill_(N_SLOTS),
        CanaryStatus.SEED_OUT_OF_RANGE,
        "write",
    ),
    (
        "seed 2**63-1",
        lambda p, s, st, kw: p.write_seed_slot_indices.fill_(2**63 - 1),
        CanaryStatus.SEED_OUT_OF_RANGE,
        "write",
    ),
    (
        "out_cache_loc past num_slots",
        lambda p, s, st, kw: st["out_cache_loc"].fill_(2**62),
        CanaryStatus.WRITE_SLOT_OUT_OF_RANGE,
        "write",
    ),
    (
        "offsets past n",
        lambda p, s, st, kw: p.write_offsets[3].fill_(2**63 - 1),
        CanaryStatus.WRITE_INDEX_OUT_OF_RANGE,
        "write",
    ),
    (
        "offsets negative",
        lambda p, s, st, kw: p.write_offsets[0].fill_(-(2**63)),
        CanaryStatus.WRITE_INDEX_OUT_OF_RANGE,
        "write",
    ),
    (
        "write rows past capacity",
        lambda p, s, st, kw: p.write_num_valid_reqs.fill_(2**31 - 1),
        CanaryStatus.PLAN_COUNT_OUT_OF_RANGE,
        "write",
    ),
    (
        "write rows negative",
        lambda p, s, st, kw: p.write_num_valid_reqs.fill_(-5),
        CanaryStatus.PLAN_COUNT_OUT_OF_RANGE,
        "write",
    ),
    ("real-KV row past source (write)", small_kv, CanaryStatus.REAL_KV_ROW_OUT_OF_RANGE, "write"),
    (
        "verify slot negative",
        lambda p, s, st, kw: p.verify_slot_indices[2].fill_(-(2**63)),
        CanaryStatus.VERIFY_SLOT_OUT_OF_RANGE,
        "verify",
    ),
    (
        "verify slot past num_slots",
        lambda p, s, st, kw: p.verify_slot_indices[5].fill_(N_SLOTS),
        CanaryStatus.VERIFY_SLOT_OUT_OF_RANGE,
        "verify",
    ),
    (
        "prev past num_slots",
        lambda p, s, st, kw: p.verify_prev_slot_indices[4].fill_(2**62),
        CanaryStatus.PREV_SLOT_OUT_OF_RANGE,
        "verify",
    ),
    (
        "verify count past capacity",
        lambda p, s, st, kw: p.verify_num_valid.fill_(2**31 - 1),
        CanaryStatus.PLAN_COUNT_OUT_OF_RANGE,
        "verify",
    ),
    (
        "verify count negative",
        lambda p, s, st, kw: p.verify_num_valid.fill_(-(2**31)),
        CanaryStatus.PLAN_COUNT_OUT_OF_RANGE,
        "verify",
    ),
    ("real-KV row past source (verify)", small_kv, CanaryStatus.REAL_KV_ROW_OUT_OF_RANGE, "verify"),
]


def hostile(seed, rows, entries):
    """Every plan field from the int64 edges and random values; kernels must finish."""
    g = torch.Generator().manual_seed(seed)
    edges = torch.tensor(EDGES)

    def draw(shape):
        pick = edges[torch.randint(0, len(EDGES), shape, generator=g)]
        small = torch.randint(-3, N_SLOTS + 3, shape, generator=g)
        return torch.where(torch.rand(shape, generator=g) < 0.5, pick, small)

    plan = PlanBuffers.allocate(write_req_capacity=rows, verify_capacity=entries, device=DEV)
    plan.write_offsets.copy_(draw((rows + 1,)))
    plan.write_seed_slot_indices.copy_(draw((rows,)))
    plan.write_num_valid_reqs.fill_(rows)
    for name in (
        "verify_slot_indices",
        "verify_prev_slot_indices",
        "verify_expected_positions",
        "verify_expected_tokens",
    ):
        getattr(plan, name).copy_(draw((entries,)))
    plan.verify_num_valid.fill_(entries)
    plan.verify_enable.fill_(1)
    store = CanaryStore.allocate(num_slots=N_SLOTS, violation_capacity=32, device=DEV)
    store.records.copy_(draw((N_SLOTS, 4)))
    store.enable_chain_position_check()
    n = 50
    step = {k: draw((n,)).to(DEV) for k in ("input_ids", "positions", "out_cache_loc")}
    step.update(expected_input_ids=draw((n,)).to(DEV), expected_positions=draw((n,)).to(DEV))
    kv = torch.randint(-9, 9, (N_SLOTS // 4, 128), generator=g).to(torch.float16).to(DEV)
    pages = torch.randint(-9, 9, (N_SLOTS, 1, 2, 16), generator=g).to(torch.bfloat16).to(DEV)
    wide = torch.randint(-9, 9, (N_SLOTS // 16, 16 * 48), generator=g).to(torch.int8).to(DEV)
    others = [
        RealKVSource(pages[:, :, 0], page_size=1, bytes_per_token=64, read_bytes=32),
        RealKVSource(wide, page_size=16, bytes_per_token=48, read_bytes=32),
    ]
    for mode in RealKVMode:
        # covering the store, each source its own geometry; then one source short
        covering = RealKV(mode=mode, sources=[kv, *others], page_size=4, bytes_per_token=64)
        short = RealKV(mode=mode, sources=(kv, kv[:5], *others), page_size=4, bytes_per_token=64)
        for real_kv in (covering, short):
            launch("write", store, plan, step, real_kv)
            launch("pair", store, plan, step, real_kv)
            launch("split", store, plan, step, real_kv)
            launch("verify", store, plan, {}, real_kv)
    if DEV == "cuda":
        torch.cuda.synchronize()
    report = store.take_violations()
    print(
        f"hostile seed {seed}: rows {rows}, entries {entries}: status "
        f"{store.take_status()!r}, {report.appended} violations"
    )


def main() -> int:
    for name, mutate, expected, stage in CASES:
        case(name, mutate, expected, stage)
        if stage == "write":
            case(name, mutate, expected, "split")
            WORKSPACES.clear()
            case(name, mutate, expected, "pair")
    for seed in range(3):
        hostile(seed, rows=40 if DEV == "cpu" else 3000, entries=300 if DEV == "cpu" else 200_000)
    print("gpu_memcheck_canary: every case raised its status bit; hostile plans finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
