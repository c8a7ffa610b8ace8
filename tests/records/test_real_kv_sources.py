"""Real-KV sources of their own geometries (docs/contract-canary.md, "Real-KV hash"), on
both paths (``canary`` fixture): sources of mixed page sizes, token widths, read widths,
dtypes and layouts (2-D rows with bytes past their slots, ``[pages, page_size, ...]``
tensors, the K half of an interleaved K/V buffer) in one call, every layer's K and V of a
256-source pool, each record's hash against the plain-Python model
(``tests/helpers/canary.py``, ``py_real_kv``) and an overwritten byte found in the source
and slot it was written to. Then ``RealKVSource``'s own rules, and copies of a ``RealKV``
of such sources."""

import copy
import pickle

import pytest
import torch

from kv_canary_buffers import FailBits, RealKV, RealKVMode, RealKVSource
from kv_canary_buffers.layout import MAX_REAL_KV_SOURCES
from tests.helpers.canary import (
    DEVICE,
    flip_source_byte,
    hash_of,
    i64,
    kept_rows,
    make_source,
    make_source_3d,
    new_plan,
    new_store,
    py_real_kv,
    set_verify_plan,
    set_write_plan,
)

KV = int(FailBits.REAL_KV)
NUM_SLOTS = 48


def mixed_sources(g: torch.Generator) -> list[RealKVSource]:
    """Seven sources covering 48 slots, no two of one geometry."""
    return [
        # 2-D, page size 1, int8, rows with 32 bytes past their slot (never read)
        RealKVSource(
            make_source(g, NUM_SLOTS, 64 + 32, torch.int8, device=DEVICE),
            page_size=1,
            bytes_per_token=64,
            read_bytes=48,
        ),
        # 2-D, page size 4, bf16, a strided view into a wider buffer
        RealKVSource(
            make_source(
                g, 12, 4 * 32, torch.bfloat16, pad_bytes=48, offset_bytes=16, device=DEVICE
            ),
            page_size=4,
            bytes_per_token=32,
        ),
        # 2-D, page size 16, fp32, more rows than the store needs
        RealKVSource(
            make_source(g, 5, 16 * 16, torch.float32, spare_rows=1, device=DEVICE),
            page_size=16,
            bytes_per_token=16,
        ),
        # [pages, 4, heads, dim] fp16
        RealKVSource(
            make_source_3d(g, 12, 4, (2, 24), torch.float16, device=DEVICE),
            page_size=4,
            bytes_per_token=96,
            read_bytes=80,
        ),
        # the K half of an interleaved [pages, 16, 2, heads, dim] bf16 buffer: slots 2 x 32
        # bytes apart, 32 bytes each
        RealKVSource(
            make_source_3d(g, 3, 16, (1, 16), torch.bfloat16, interleaved=True, device=DEVICE),
            page_size=16,
            bytes_per_token=64,
            read_bytes=32,
        ),
        # [pages, 1, dim] int8 (page size 1 as a 3-D tensor)
        RealKVSource(
            make_source_3d(g, NUM_SLOTS, 1, (128,), torch.int8, device=DEVICE),
            page_size=1,
            bytes_per_token=128,
        ),
        # 2-D, page size 4, 288-byte slots: more than two 16-word reads in mode ALL
        RealKVSource(
            make_source(g, 12, 4 * 288, torch.uint8, device=DEVICE),
            page_size=4,
            bytes_per_token=288,
            read_bytes=272,
        ),
    ]


def write_slots(canary, store, plan, slots, real_kv, tag=0):
    n = len(slots)
    set_write_plan(plan, [0, n], [-1])
    canary.write(
        store,
        plan,
        input_ids=i64([100 + s for s in slots]),
        positions=i64(list(range(n))),
        out_cache_loc=i64(slots),
        real_kv=real_kv,
        launch_tag=tag,
    )


def verify_slots(canary, store, plan, slots, real_kv, tag=0):
    set_verify_plan(plan, slots, [-1] + slots[:-1], list(range(len(slots))))
    canary.verify(store, plan, real_kv=real_kv, launch_tag=tag)


def real_kv_rows(store, start=0):
    """The slots of the REAL_KV rows appended from ``start``, sorted."""
    return sorted(r[1] for r in kept_rows(store, start) if r[7] == KV)


@pytest.mark.parametrize("mode", [RealKVMode.PARTIAL, RealKVMode.ALL])
def test_sources_of_mixed_geometries_hash_the_contract_and_find_the_byte(canary, mode):
    """Every record's hash is the model's (each source read with its own geometry); a
    clean verify finds nothing; a byte overwritten in one source flags the slot it
    belongs to (in the bytes the mode reads) and no other."""
    g = torch.Generator().manual_seed(26)
    sources = mixed_sources(g)
    kv = RealKV(mode=mode, sources=sources)
    store = new_store(num_slots=NUM_SLOTS, violation_capacity=16)
    plan = new_plan(write_req_capacity=4, verify_capacity=48)
    slots = [1, 2, 3, 5, 15, 16, 17, 31, 32, 46, 47]
    write_slots(canary, store, plan, slots, kv)
    hashes = [store.records[s, 3].item() for s in slots]
    assert hashes == [py_real_kv(kv, s) for s in slots]
    assert len(set(hashes)) == len(hashes)
    verify_slots(canary, store, plan, slots, kv)
    assert int(store.violation_count) == 0
    # Slot 17 in source 3 ([pages, 4, heads, dim]: page 4, slot 1 of it), in its first 16
    # bytes (both modes read them); slot 46 in source 4 (interleaved, page 2, slot 14) at
    # byte 20 (ALL reads 32 of it, PARTIAL 16); slot 32 in source 0 past its read bytes.
    flip_source_byte(sources[3], 4, 1, 5)
    flip_source_byte(sources[4], 2, 14, 20)
    flip_source_byte(sources[0], 32, 0, 50)
    verify_slots(canary, store, plan, slots, kv, tag=3)
    want = [17, 46] if mode == RealKVMode.ALL else [17]
    assert real_kv_rows(store) == want
    for s in slots:
        assert (py_real_kv(kv, s) != store.records[s, 3].item()) == (s in want), s


def test_the_sources_fold_in_order(canary):
    """``h = sm(h ^ acc)`` source after source: the same sources in another order give
    other hashes (both paths, as the model)."""
    g = torch.Generator().manual_seed(3)
    sources = mixed_sources(g)[:4]
    slots = [4, 9, 30]
    got = []
    for order in (sources, sources[::-1]):
        kv = RealKV(mode=RealKVMode.ALL, sources=order)
        store, plan = new_store(num_slots=NUM_SLOTS), new_plan(verify_capacity=48)
        write_slots(canary, store, plan, slots, kv)
        got.append([store.records[s, 3].item() for s in slots])
        assert got[-1] == [py_real_kv(kv, s) for s in slots]
    assert all(a != b for a, b in zip(*got))


def test_plain_tensors_beside_sources_take_the_real_kv_geometry(canary):
    """A plain tensor takes the ``RealKV``'s ``page_size``, ``bytes_per_token`` and
    ``read_bytes``; a ``RealKVSource`` beside it keeps its own: the same hashes as all of
    them given as ``RealKVSource``."""
    g = torch.Generator().manual_seed(7)
    plain = make_source(g, 24, 2 * 64, torch.bfloat16, device=DEVICE)
    other = mixed_sources(g)[2]
    mixed = RealKV(
        mode=RealKVMode.ALL,
        sources=[plain, other],
        page_size=2,
        bytes_per_token=64,
        read_bytes=48,
    )
    assert mixed.sources[0].tensor is plain
    assert (mixed.sources[0].page_size, mixed.sources[0].read_bytes) == (2, 48)
    explicit = RealKV(
        mode=RealKVMode.ALL,
        sources=[RealKVSource(plain, page_size=2, bytes_per_token=64, read_bytes=48), other],
    )
    slots = [1, 20, 47]
    stores = []
    for kv in (mixed, explicit):
        store, plan = new_store(num_slots=NUM_SLOTS), new_plan()
        write_slots(canary, store, plan, slots, kv)
        stores.append(store)
    assert torch.equal(stores[0].records, stores[1].records)
    assert stores[0].records[slots, 3].tolist() == [py_real_kv(explicit, s) for s in slots]


def pool_sources(g: torch.Generator, layers: int, num_slots: int) -> list[RealKVSource]:
    """Every layer's K and V of one bf16 pool ``[layers, 2, pages, 4 slots, 2 heads, 8]``
    (page size 4, 32 bytes a slot), as ``[pages, 4, 2, 8]`` views."""
    pages = -(-num_slots // 4)
    pool = make_source_3d(g, layers * 2 * pages, 4, (2, 8), torch.bfloat16, device=DEVICE)
    pool = pool.view(layers, 2, pages, 4, 2, 8)
    return [
        RealKVSource(pool[layer, half], page_size=4, bytes_per_token=32)
        for layer in range(layers)
        for half in range(2)
    ]


@pytest.mark.parametrize(
    "mode",
    # ALL: 256 sources of 16-word tiles take half a minute in the interpreter
    [RealKVMode.PARTIAL, pytest.param(RealKVMode.ALL, marks=pytest.mark.slow)],
)
def test_every_layer_of_a_128_layer_pool(canary, mode):
    """256 sources (every layer's K and V of a 128-layer pool, page size 4): the records'
    hashes are the model's, and a byte overwritten in layer 100's V (a layer SGLang's
    canary, which hashes layer 0 only, would not see) flags its slot."""
    g = torch.Generator().manual_seed(128)
    num_slots = 24
    sources = pool_sources(g, 128, num_slots)
    assert len(sources) == 256
    kv = RealKV(mode=mode, sources=sources)
    store = new_store(num_slots=num_slots, violation_capacity=8)
    plan = new_plan(verify_capacity=16)
    slots = [3, 9, 14, 23]
    write_slots(canary, store, plan, slots, kv)
    assert store.records[slots, 3].tolist() == [py_real_kv(kv, s) for s in slots]
    verify_slots(canary, store, plan, slots, kv)
    assert int(store.violation_count) == 0
    flip_source_byte(sources[2 * 100 + 1], 14 // 4, 14 % 4, 3)  # layer 100's V, slot 14
    verify_slots(canary, store, plan, slots, kv, tag=1)
    rec = store.records[14].tolist()
    assert kept_rows(store) == [(1, 14, 2, 114, -1, rec[2], hash_of(store.records[9].tolist()), KV)]


def test_the_most_sources_a_real_kv_takes(canary):
    """``MAX_REAL_KV_SOURCES`` (512) sources, all views of one tensor: written and
    verified clean, each hash the model's; one more is refused."""
    assert MAX_REAL_KV_SOURCES == 512
    g = torch.Generator().manual_seed(512)
    src = make_source(g, 8, 16, device=DEVICE)
    kv = RealKV(mode=RealKVMode.PARTIAL, sources=[src] * 512, page_size=1, bytes_per_token=16)
    store, plan = new_store(num_slots=8), new_plan()
    write_slots(canary, store, plan, [2, 7], kv)
    assert store.records[[2, 7], 3].tolist() == [py_real_kv(kv, 2), py_real_kv(kv, 7)]
    verify_slots(canary, store, plan, [2, 7], kv)
    assert int(store.violation_count) == 0
    with pytest.raises(ValueError, match="at most 512 sources, got 513"):
        RealKV(mode=RealKVMode.PARTIAL, sources=[src] * 513, page_size=1, bytes_per_token=16)


# --- RealKVSource's rules ------------------------------------------------------------------
def _t(*shape, dtype=torch.uint8):
    return torch.zeros(*shape, dtype=dtype, device=DEVICE)


SOURCE_ERRORS = {
    "page_size 0": (
        dict(page_size=0),
        ValueError,
        r"RealKVSource.page_size must be >= 1, got 0",
    ),
    "bytes_per_token 24": (
        dict(bytes_per_token=24),
        ValueError,
        r"RealKVSource.bytes_per_token must be a positive multiple of 16, got 24",
    ),
    "read_bytes past bytes_per_token": (
        dict(read_bytes=48),
        ValueError,
        r"RealKVSource.read_bytes must be <= bytes_per_token = 32, got 48",
    ),
    "not a tensor": (
        dict(tensor=[1, 2]),
        TypeError,
        r"RealKVSource.tensor must be a torch.Tensor, got list",
    ),
    "rows too short": (
        dict(tensor=_t(8, 48)),
        ValueError,
        r"RealKVSource.tensor rows must hold page_size \* bytes_per_token = 64 bytes, got 48",
    ),
    "3-D of another page size": (
        dict(tensor=_t(8, 4, 16)),
        ValueError,
        r"RealKVSource.tensor is read as \[pages, page_size, ...\], so page_size must be its "
        r"shape\[1\] = 4, got page_size = 2 \(shape \(8, 4, 16\), strides \(64, 16, 1\), "
        r"torch.uint8; a token-major \[tokens, heads, head_dim\] layer is 2-D as \[tokens, "
        r"-1\] with page_size 1\)",
    ),
    "3-D of another slot stride": (
        dict(tensor=_t(8, 2, 16, dtype=torch.bfloat16), bytes_per_token=16),
        ValueError,
        r"RealKVSource.tensor has slots 32 bytes apart \(stride\(1\) \* element_size\), so "
        r"bytes_per_token must be 32, got 16 \(shape \(8, 2, 16\)",
    ),
    "3-D not contiguous within a slot": (
        dict(tensor=_t(8, 2, 4, 16).transpose(2, 3), bytes_per_token=64),
        ValueError,
        r"RealKVSource.tensor \(at least 3-D: \[pages, page_size, ...\]\) must be contiguous "
        r"within a slot \(dimensions 2 on\), got shape \(8, 2, 16, 4\), strides "
        r"\(128, 64, 1, 16\)",
    ),
    "3-D read past the slot (the default)": (
        dict(tensor=_t(8, 2, 2, 16)[:, :, 0], bytes_per_token=32),
        ValueError,
        r"RealKVSource.read_bytes must be <= the 16 bytes of one slot of RealKVSource.tensor "
        r"\(shape \(8, 2, 16\), strides \(64, 32, 1\), torch.uint8\), got 32 \(the "
        r"default, bytes_per_token\)",
    ),
    "1-D": (
        dict(tensor=_t(64)),
        ValueError,
        r"RealKVSource.tensor must be 2-D \[pages, bytes of a page as elements\] or at least "
        r"3-D \[pages, page_size, ...\], got shape \(64,\)",
    ),
    "misaligned": (
        dict(tensor=_t(8, 96)[:, 8:72]),
        ValueError,
        r"RealKVSource.tensor must start 16-byte aligned .* data_ptr % 16 = 8",
    ),
}


@pytest.mark.parametrize("case", sorted(SOURCE_ERRORS))
def test_real_kv_source_errors(case):
    change, error, pattern = SOURCE_ERRORS[case]
    kwargs = dict(tensor=_t(8, 64), page_size=2, bytes_per_token=32)
    kwargs.update(change)
    with pytest.raises(error, match="^kv-canary: " + pattern):
        RealKVSource(**kwargs)


def test_a_3d_source_misaligned_between_pages_is_refused():
    # [8, 2, 16] int8 whose pages are 24 bytes apart: not a multiple of 16
    t = _t(8, 24)[:, :16].view(8, 2, 8)
    with pytest.raises(ValueError, match=r"row stride of 24 bytes$"):
        RealKVSource(t, page_size=2, bytes_per_token=8 * 2)


def test_real_kv_source_accepts_the_documented_shapes():
    g = torch.Generator().manual_seed(1)
    two_d = RealKVSource(make_source(g, 8, 96, device=DEVICE), page_size=2, bytes_per_token=32)
    assert (two_d.page_size, two_d.bytes_per_token, two_d.read_bytes, two_d.rows) == (2, 32, 32, 8)
    half = make_source_3d(g, 6, 4, (2, 8), torch.bfloat16, interleaved=True, device=DEVICE)
    assert half.stride(1) * 2 == 64 and not half.is_contiguous()
    src = RealKVSource(half, page_size=4, bytes_per_token=64, read_bytes=32)
    assert (src.rows, src.read_bytes) == (6, 32)
    # a [pages, 1, ...] source: its stride(1), of a dimension of size 1, is never used
    odd = torch.as_strided(_t(8 * 48), (8, 1, 48), (48, 7, 1))
    one = RealKVSource(odd, page_size=1, bytes_per_token=48)
    assert one.read_bytes == 48


def test_geometry_is_only_optional_without_plain_tensors():
    src = RealKVSource(_t(8, 64), page_size=2, bytes_per_token=32)
    kv = RealKV(mode=RealKVMode.ALL, sources=[src, src])
    assert (kv.page_size, kv.bytes_per_token, kv.read_bytes) == (None, None, None)
    assert kv.hashed_bytes == 64 and kv.tensors == (src.tensor, src.tensor)
    assert RealKV(mode=RealKVMode.PARTIAL, sources=src).hashed_bytes == 16
    with pytest.raises(TypeError, match=r"RealKV.page_size must be an int when sources"):
        RealKV(mode=RealKVMode.ALL, sources=[src, _t(8, 64)], bytes_per_token=32)


def test_copies_rebuild_the_sources_geometry():
    """copy, deepcopy and pickle of a RealKV of RealKVSource objects: new objects of the
    same geometry (deepcopy and pickle over new tensors), each checked and with a table
    of its own."""
    g = torch.Generator().manual_seed(2)
    kv = RealKV(mode=RealKVMode.ALL, sources=mixed_sources(g)[:5])
    for other in (copy.copy(kv), copy.deepcopy(kv), pickle.loads(pickle.dumps(kv))):
        other.check()
        assert other._handle != kv._handle
        assert other._source_table.data_ptr() != kv._source_table.data_ptr()
        geometry = [(s.page_size, s.bytes_per_token, s.read_bytes) for s in other.sources]
        assert geometry == [(s.page_size, s.bytes_per_token, s.read_bytes) for s in kv.sources]
        for a, b in zip(other.tensors, kv.tensors):
            assert a.shape == b.shape and a.stride() == b.stride()
            assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
        assert [py_real_kv(other, s) for s in (1, 30)] == [py_real_kv(kv, s) for s in (1, 30)]
    assert copy.copy(kv).tensors[0] is kv.tensors[0]
    assert copy.deepcopy(kv).tensors[0] is not kv.tensors[0]


def test_the_kernels_variant_by_number_of_sources():
    """The launchers' real-KV arguments: the table the RealKV owns (one row per source,
    its address and geometry) and the kernels' MODE: PARTIAL two sources a step up to two
    sources, four a step beyond (a second variant, not one per number); ALL one a step."""
    from kv_canary_buffers.layout import SOURCE_TABLE_COLUMNS
    from kv_canary_kernels.constants import PARTIAL_WIDE
    from kv_canary_kernels.sources import source_args

    g = torch.Generator().manual_seed(4)
    sources = mixed_sources(g)
    stand_in = torch.zeros(1, dtype=torch.int64)
    assert source_args(None, stand_in) == (stand_in, 0, 0, 0)
    for count, partial in ((1, 1), (2, 1), (3, PARTIAL_WIDE), (7, PARTIAL_WIDE)):
        for mode, want in ((RealKVMode.PARTIAL, partial), (RealKVMode.ALL, 2)):
            kv = RealKV(mode=mode, sources=sources[:count])
            args = source_args(kv, stand_in)
            assert (args.num_sources, args.mode, args.covers) == (count, want, NUM_SLOTS)
            assert args.table is kv._source_table
    table = RealKV(mode=RealKVMode.ALL, sources=sources)._source_table
    col = {name: i for i, name in enumerate(SOURCE_TABLE_COLUMNS)}
    for row, s in zip(table.tolist(), sources):
        t = s.tensor
        assert row[col["address"]] == t.data_ptr()
        assert row[col["row_stride_words"]] * 8 == t.stride(0) * t.element_size()
        assert (row[col["rows"]], row[col["page_size"]]) == (t.shape[0], s.page_size)
        assert row[col["bytes_per_token_words"]] * 8 == s.bytes_per_token
        assert row[col["hashed_words"]] * 8 == s.read_bytes
    partial = RealKV(mode=RealKVMode.PARTIAL, sources=sources)._source_table
    assert partial[:, col["hashed_words"]].tolist() == [2] * len(sources)
