"""Reports an engine can act on (issue 26, section 1): four engine bugs on a tiny paged
pool, each run on both paths (``canary`` fixture: the torch references and the kernels)
with plans built by ``plan_reference``, and what the report then names: the victim (the
request whose prefix holds the slot, ``Violation.req_pool_index``), the culprit (the slot's
last writer, ``Violation.owner``) and ``ViolationReport.req_pool_indices()``, the requests
to abort.

The toy engine: pages of 4 slots, each request's ``req_to_token`` row its pages' slots;
a step plans its batch, verifies every prefix (before the forward), writes each token's KV
bytes at its ``out_cache_loc`` (what the forward does), then stamps the records (the
canary write, at the same ``out_cache_loc``). The KV bytes are the real-KV source
(mode ALL), and the expected-token pool holds each request's tokens.
"""

from __future__ import annotations

import torch

from kv_canary_buffers import FailBits, RealKV, RealKVMode, plan_reference
from tests.helpers.canary import DEVICE, i64, new_plan, new_store

PAGE = 4
PAGES = 8
NUM_SLOTS = PAGE * PAGES  # slot 0 (page 0) is the pool's padding slot: never handed out
BYTES = 16
A, B, C = 1, 2, 3
"""Request pool indices (0 is the padding row)."""


def token_of(req: int, pos: int) -> int:
    return 1000 * req + pos


class ToyEngine:
    """A paged KV pool, its canary store and one plan buffers; ``pages[req]`` are the
    pages handed to each request (``req_to_token`` follows them)."""

    def __init__(self, canary, pages: dict[int, list[int]]):
        self.canary = canary
        self.store = new_store(NUM_SLOTS, 32, junk_records=False)
        self.plan = new_plan(write_req_capacity=4, verify_capacity=64)
        self.kv = torch.zeros(PAGES, PAGE * BYTES, dtype=torch.uint8, device=DEVICE)
        self.real_kv = RealKV(
            mode=RealKVMode.ALL, sources=(self.kv,), page_size=PAGE, bytes_per_token=BYTES
        )
        self.table = torch.zeros(4, PAGE * PAGES, dtype=torch.int32, device=DEVICE)
        for req, owned in pages.items():
            slots = [p * PAGE + k for p in owned for k in range(PAGE)]
            self.table[req, : len(slots)] = torch.tensor(slots, dtype=torch.int32)
        cols = self.table.shape[1]
        self.pool = torch.tensor(
            [[token_of(r, p) for p in range(cols)] for r in range(4)], dtype=torch.int32
        ).to(DEVICE)
        self.tag = 0

    def slot(self, req: int, pos: int) -> int:
        return int(self.table[req, pos])

    def kv_bytes(self, token: int) -> torch.Tensor:
        return torch.full((BYTES,), token % 251, dtype=torch.uint8, device=DEVICE)

    def write_kv(self, slot: int, token: int) -> None:
        """The forward's KV write of one token at ``slot``."""
        row = self.kv[slot // PAGE]
        row[(slot % PAGE) * BYTES : (slot % PAGE + 1) * BYTES] = self.kv_bytes(token)

    def step(self, batch, *, wrong: dict | None = None, padding_kv: list | None = None):
        """One step of ``batch`` (``(req, prefix_len, extend_len)`` rows, ``req`` 0 a
        padding row): plan, verify, KV write, canary write. ``wrong`` maps ``(req, pos)``
        to the slot the engine wrongly writes that token at (KV and canary alike);
        ``padding_kv`` lists slots a padding token's KV bytes land in (the canary write
        never sees them: a padding row writes nothing)."""
        reqs, prefix, extend = (i64([b[i] for b in batch]) for i in range(3))
        plan_reference(
            self.plan,
            req_pool_indices=reqs,
            prefix_lens=prefix,
            extend_seq_lens=extend,
            req_to_token=self.table,
            req_to_verify_expected_tokens=self.pool,
            req_to_verify_expected_tokens_valid_lens=prefix + extend,
        )
        self.tag += 1
        self.canary.verify(self.store, self.plan, launch_tag=self.tag, real_kv=self.real_kv)
        ids, pos, ocl = [], [], []
        for req, p0, e in batch:
            for p in range(p0, p0 + e if req else p0):
                s = (wrong or {}).get((req, p), self.slot(req, p))
                ids.append(token_of(req, p))
                pos.append(p)
                ocl.append(s)
                self.write_kv(s, token_of(req, p))
        for s in padding_kv or []:
            self.write_kv(s, 77)
        self.canary.write(
            self.store,
            self.plan,
            input_ids=i64(ids),
            positions=i64(pos),
            out_cache_loc=i64(ocl),
            launch_tag=100 + self.tag,
            real_kv=self.real_kv,
        )

    def report(self):
        status = self.store.take_status()
        assert status == 0, status
        return self.store.take_violations()


def by_slot(report):
    """``{slot: (req_pool_index, expected_position, owner, fail_bits)}`` of the report's
    rows (one row a slot in these cases)."""
    rows = {}
    for v in report.violations:
        assert v.slot not in rows, v
        rows[v.slot] = (v.req_pool_index, v.expected_position, v.owner, v.fail_bits)
    return rows


def test_a_clean_run_names_nobody(canary):
    eng = ToyEngine(canary, {A: [1, 2], B: [3]})
    eng.step([(A, 0, 4), (B, 0, 3)])
    eng.step([(A, 4, 1), (B, 3, 1)])
    eng.step([(A, 5, 1), (B, 4, 0)])
    report = eng.report()
    assert not report and report.req_pool_indices() == ()


def test_a_double_allocation_names_the_victim_and_the_culprit(canary):
    """Page 2 handed to A and, while A still holds it, to B as well. A prefills positions
    0..7 (pages 1, 2); B prefills 0..3 into page 2; A's next step finds its positions 4..7
    written by B: victim A, culprit B, at each of the four slots."""
    eng = ToyEngine(canary, {A: [1, 2], B: [2]})  # the allocator's bug
    eng.step([(A, 0, 8)])
    eng.step([(B, 0, 4)])
    eng.step([(A, 8, 0), (B, 4, 0)])  # A's prefix verified; B's clean: B wrote last
    report = eng.report()
    rows = by_slot(report)
    assert sorted(rows) == [8, 9, 10, 11]
    for k, s in enumerate(range(8, 12)):
        req, expected, owner, bits = rows[s]
        assert (req, expected, owner) == (A, 4 + k, B)
        assert FailBits.POSITION in bits and FailBits.VERIFY_TOKEN in bits
    # the ring's own position is the culprit's write (B's position k), beside A's
    assert {v.slot: v.position for v in report.violations} == {8 + k: k for k in range(4)}
    assert report.req_pool_indices() == (A, B)


def test_an_off_by_one_in_a_chunked_prefill_chunk_names_the_right_rows(canary):
    """A prefills 8 tokens in two chunks; the second chunk's slots are shifted by one
    (position p written at p + 1's slot), so its last token lands in C's first slot.
    Today's rows name slots only (C's slot 12 among them, an innocent bystander's); with
    attribution: C is the victim of A's write at slot 12 (and of the chain break after
    it, at slot 13, whose record is C's own), A the victim at its own shifted slots (8:
    never written, owner unknown; 9..11: A's own writes at the wrong positions)."""
    eng = ToyEngine(canary, {A: [1, 2], C: [3, 4]})  # A: slots 4..11, C: 12..19
    eng.step([(A, 0, 4), (C, 0, 4)])
    shifted = {(A, p): eng.slot(A, p) + 1 for p in range(4, 8)}  # p = 7 -> slot 12, C's
    eng.step([(A, 4, 4), (C, 4, 1)], wrong=shifted)
    eng.step([(A, 8, 0), (C, 5, 0)])
    report = eng.report()
    rows = by_slot(report)
    assert sorted(rows) == [8, 9, 10, 11, 12, 13]
    assert rows[8][:3] == (A, 4, -1)  # A's position 4: never written
    for s in (9, 10, 11):  # A's own tokens, one position early
        assert rows[s][:3] == (A, s - 4, A)
        assert FailBits.POSITION in rows[s][3]
    assert rows[12][:3] == (C, 0, A)  # the bystander's slot, overwritten by A
    assert FailBits.POSITION in rows[12][3] and FailBits.VERIFY_TOKEN in rows[12][3]
    assert rows[13][:3] == (C, 1, C)  # C's own record, chained from the overwritten one
    assert rows[13][3] == FailBits.CHAIN
    assert report.req_pool_indices() == (A, C)
    culprits = {v.owner for v in report.violations if v.owner not in (-1, v.req_pool_index)}
    assert culprits == {A}


def test_kv_written_to_the_wrong_slot_names_both_requests(canary):
    """A's decode token (position 4) is written, KV and record, at B's slot of position 1
    instead of A's own: B is the victim at that slot (culprit A), A at its own slot
    (never written: owner unknown)."""
    eng = ToyEngine(canary, {A: [1, 2], B: [3]})
    eng.step([(A, 0, 4), (B, 0, 3)])
    wrong = {(A, 4): eng.slot(B, 1)}
    eng.step([(A, 4, 1), (B, 3, 1)], wrong=wrong)
    eng.step([(A, 5, 0), (B, 4, 0)])
    report = eng.report()
    rows = by_slot(report)
    b1, a4 = eng.slot(B, 1), eng.slot(A, 4)
    assert rows[b1][:3] == (B, 1, A)
    assert FailBits.POSITION in rows[b1][3] and FailBits.VERIFY_TOKEN in rows[b1][3]
    assert rows[a4][:3] == (A, 4, -1)
    # B's next slot chains from the overwritten record: B's own record, a CHAIN row
    b2 = eng.slot(B, 2)
    assert rows[b2] == (B, 2, B, FailBits.CHAIN)
    assert sorted(rows) == sorted({b1, a4, b2})
    assert report.req_pool_indices() == (A, B)


def test_a_padding_write_to_a_live_slot_names_the_victim_only(canary):
    """A padding row's token (an engine's graph padding with a stale out_cache_loc)
    writes KV bytes into A's slot of position 2. The padding row writes no record (it has
    no tokens in the plan), so the owners sidecar never sees it: the real-KV hash catches
    the bytes (REAL_KV) and the report names the victim, A, whose own record the slot
    still holds (owner A): no culprit is named."""
    eng = ToyEngine(canary, {A: [1, 2], B: [3]})
    eng.step([(A, 0, 4), (B, 0, 2)])
    eng.step([(A, 4, 1), (0, 0, 1), (B, 2, 1)], padding_kv=[eng.slot(A, 2)])
    eng.step([(A, 5, 0), (B, 3, 0)])
    report = eng.report()
    rows = by_slot(report)
    assert rows == {eng.slot(A, 2): (A, 2, A, FailBits.REAL_KV)}
    assert report.req_pool_indices() == (A,)
    (v,) = report.violations
    assert "request 1 expected position 2, slot last written by request 1" in str(v)
    assert v.log_line().endswith("req_pool_index=1 expected_position=2 owner=1")
