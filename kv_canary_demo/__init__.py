"""kv-canary-demo: a toy serving engine that runs the whole canary around its forward pass.

The demo (``python -m kv_canary_demo``, :mod:`kv_canary_demo.cli`) and the end-to-end
tests drive a :class:`Simulation`: requests arrive, prefill in chunks, decode one token a
step and finish; their KV slots come from a LIFO free list, so finished requests' slots
are reused at once. The KV pool has two buffer groups, as a hybrid model's would: ``full`` (full
attention) and ``swa`` (a sliding window of ``swa_window`` tokens, whose slots are the full
pool's translated by a LUT, ``full_to_swa_index_mapping``). Each group has a fake KV layer
(a bfloat16 tensor the "forward" writes random bytes into) that the canary fingerprints with
a PARTIAL real-KV hash, and an expected-token pool (the tokens the scheduler believes are
in the cache) that the verify checks.

Step order (what an engine does around each forward pass)
----------------------------------------------------------
Per KV pool (buffer group) the engine owns one :class:`PlanBuffers` and two
:class:`CanaryStore` objects, the HEAD store and the TAIL store, holding the same records
in a correct run. Every step:

1. **schedule** (host): admit requests, pick the batch, allocate this step's slots into
   ``req_to_token`` and put the scheduled tokens into the expected-token pool.
2. **plan** each group (``launch_plan`` / ``plan_reference``): which slots this step
   writes and which prefix slots the batch attends to.
3. **HEAD verify**, before the forward: check every prefix slot of the batch against the
   HEAD store (chain, position, expected token, real-KV hash). It catches what happened
   *between* steps (a slot handed to two requests, a page freed while still referenced, an
   off-by-one in the paged index, a stale expected token, KV bytes or records overwritten)
   before attention reads the damaged KV.
4. **forward**: the model writes this step's KV bytes at ``out_cache_loc``.
5. **write**, after the forward (the real-KV hash must see the bytes just written): stamp
   this step's slots into the HEAD store with ``expected_input_ids`` /
   ``expected_positions`` from the scheduler's view (a token the forward consumed that
   differs from the scheduled one shows as ``WRITE_TOKEN``), and into the TAIL store.
6. **TAIL verify**, after the write: check the same prefix slots against the TAIL store.
   It catches what *this* step's forward and write did (a stray kernel overwriting a live
   slot's KV, a slot handed to two requests of the same batch) in the same step instead
   of the next. Because the TAIL store is a second copy of the records, a record damaged
   in one store only (a stray write into canary memory) is told apart from damage to the
   KV pool itself, which both stores see.
7. **read back** (host, a sync): the violations and status words; the engine aborts every
   request that holds a flagged slot. A real engine reads every N steps; the simulation
   reads every step so that it can say which step caught what.

In code, per step and group (each launch has its own ``launch_tag``, :class:`LaunchTag`,
so a violation row names the endpoint and group that saw it)::

    launch_plan(buffers, req_pool_indices=..., prefix_lens=..., extend_seq_lens=...,
                req_to_token=..., req_to_verify_expected_tokens=pool,
                req_to_verify_expected_tokens_valid_lens=prefix_lens_of_rows)
    launch_verify(head, buffers, launch_tag=HEAD_VERIFY, real_kv=real_kv)
    model.forward(...)                     # writes KV at out_cache_loc
    launch_write(head, buffers, input_ids=..., positions=..., out_cache_loc=...,
                 expected_input_ids=..., expected_positions=..., real_kv=real_kv,
                 launch_tag=HEAD_WRITE)
    launch_write(tail, buffers, input_ids=..., positions=..., out_cache_loc=...,
                 real_kv=real_kv, launch_tag=TAIL_WRITE)
    launch_verify(tail, buffers, launch_tag=TAIL_VERIFY, real_kv=real_kv)
    if step % N == 0:                      # a sync: outside graphs, not every step
        report = head.take_violations()    # and tail's, and take_status() of each

The ``swa`` group passes its LUT to the plan and its translated slots
(``LUT[out_cache_loc]``) to the write. The stores are created once per pool with
``enable_chain_position_check()``; when the KV pool grows, each store is replaced by
``store.resize(num_slots=...)`` (records kept) and each ``RealKV`` rebuilt on the new KV
tensors; a grown batch or prefix total is ``buffers.ensure_capacity(...)``. A step's verify
entries are counted on the host, from the scheduler's lists, with
``verify_entries_needed(prefix_lens, req_pool_indices=..., swa_window_size=...)``; an
engine grows ``verify_capacity`` from it before the plan, while the simulation lets the
full group's small first capacity overflow once (``verify_enable = 0``) to show it, then
grows from the same count.

Turning the TAIL store off (``tail=False``) halves the canary's memory and launches; the
HEAD store alone still catches every corruption kind, one step later for those that
happen during a forward. On CUDA with the kernels, steps 2-3 and 5-6 are each captured
once per generation in a CUDA graph (``pre`` and ``post``) and replayed after refilling
fixed input tensors (:class:`GraphInputs` for the rows, :class:`TokenInputs` for the
tokens); a grown plan buffer, store or KV pool is a new generation and is re-captured.

Where it lives
--------------
``scheduler`` (requests, rows, the KV slot pool and its free list, admission, the batch),
``step`` (the groups, their plan buffers and HEAD/TAIL stores, the launches, CUDA graphs,
growth, read-back), ``corruption`` (the seven kinds, where each is put in, what caught
it), ``shadow`` (plans and stores against the torch references), ``simulation`` (the
:class:`Simulation` composing them, in the step order above), ``config``
(:class:`SimConfig`, :class:`Stats`), ``stages`` (references or kernels) and ``cli`` (the
rich output; the only module that imports rich, and this package's ``__init__`` does not
import it). The package uses ``kv_canary_buffers`` and ``kv_canary_kernels`` by their
public names only; the kernels (and Triton) are imported inside :func:`kernel_stages`,
so a run of the references never imports Triton.
"""

from .config import SimConfig, Stats
from .corruption import Corruption, Injection, Injector, Seen
from .scheduler import Request, Scheduler, SlotPool, StepInputs
from .shadow import Shadow
from .simulation import Simulation
from .stages import REFERENCE_STAGES, Stages, kernel_stages
from .step import CanaryStep, Group, LaunchTag, TokenInputs

__all__ = [
    "REFERENCE_STAGES",
    "CanaryStep",
    "Corruption",
    "Group",
    "Injection",
    "Injector",
    "LaunchTag",
    "Request",
    "Scheduler",
    "Seen",
    "Shadow",
    "SimConfig",
    "Simulation",
    "SlotPool",
    "Stages",
    "Stats",
    "StepInputs",
    "TokenInputs",
    "kernel_stages",
]
