"""One segment run by a generated kernel: lowering, legalization (``legalize.py``: each
launch's layout) and compilation at the first call of a plan, then per call only
allocation, an ``as_strided`` per operand that is not its tensor unchanged and whose view
the launch function cannot build from it (``base_maps.BaseMap``), and the TVM-FFI launch.

``mode`` picks what executes the lowered program: ``"cute"`` (CuTe DSL kernels, CUDA) or
``"torch"`` (``torch_eval``, any device), which runs the same operand views with torch so
the CPU test-suite checks lowering and geometry end to end.
"""

from __future__ import annotations

import math
from collections import ChainMap

import torch

from thunder_fuser import config
from thunder_fuser.backends import reference
from thunder_fuser.backends.cute import cache, compile_workers
from thunder_fuser.backends.cute.backend import arch_of, compile_options
from thunder_fuser.backends.cute.tiling.base_maps import aligned, views_for_call
from thunder_fuser.backends.cute.tiling.columns_geometry import column_state_offsets
from thunder_fuser.backends.cute.lower.constants import find_iotas
from thunder_fuser.backends.cute.legalize import Part, legalize
from thunder_fuser.backends.cute.lower.expr import (
    Program,
    column_sums,
    lower_segment,
    planned_strides,
    reductions_in_order,
    render,
    softmax_sums,
)
from thunder_fuser.backends.cute.tiling.geometry import Needs, geometry_or_needs
from thunder_fuser.backends.cute.tiling.operands import Geometry
from thunder_fuser.backends.cute.unsupported import Unsupported
from thunder_fuser.segment.views import alias_views


class SegmentKernel:
    def __init__(self, seg, orders: dict, mode: str):
        self.seg = seg
        self.mode = mode
        self.iotas = find_iotas(seg.nodes, seg.outputs)
        self.parts = [Part(p) for p in lower_segment(seg, self.iotas, orders)]  # raises Unsupported
        self.constants: dict = {}  # the iota operands (evaluated once, at ``prepare``)
        self.post_views = alias_views(seg)  # outputs that are views: made by torch after the launches
        self.orders = orders
        self.write_outs: list = []  # (node output value, dst value) pairs
        self.columns_apart = ""  # why the segment's sums per column run apart from its rows (``columns_apart``)
        # independent pointwise parts (one per shape: RoPE's q and k, a cat's pieces) share one
        # launch (``shares_launch``); ``shared`` is its function once built
        self.shares = False
        self.shared = None

    def notes(self) -> list[str]:
        """How this segment's kernels depart from the plain templates: reductions split
        across blocks (two launches each: partials, then a combine), operands staged through
        shared memory (a tiled transpose), reductions in two stages. The plan records them
        when it prepares the kernel, for ``explain``."""
        notes = []
        if self.shares:
            notes.append(f"runs its {len(self.parts)} programs (one per shape) in one launch")
        if self.columns_apart:
            notes.append(f"takes its sums per column in a reduction of their own after its rows ({self.columns_apart})")
        for part in self.parts:
            if part.geo.stage:
                slots = set(part.geo.stage[1])
                names = sorted({ld.source.name for ld in part.prog.loads if part.geo.load_slot[id(ld)] in slots})
                if part.transposed_copy:
                    notes.append(f"copies {', '.join(names)} through shared-memory tiles into the order of its reduction's "
                                 f"rows (a tiled transpose), then reduces reading the copy in vectors")
                else:
                    notes.append(f"reads {', '.join(names)} through shared-memory tiles (a tiled transpose: "
                                 f"{'they are' if len(names) > 1 else 'it is'} contiguous along another dim than the output)")
            if part.geo.looped:
                online = softmax_sums(reductions_in_order(part.prog))
                notes.append(f"loops over rows too long for registers ({part.geo.n} elements): a pass per reduction"
                             + (" (the max and the sum of exp(x - max) in one: online softmax)" if online else "")
                             + (", then one for its stores" if any(not st.is_row for st in part.prog.stores) else ""))
            if part.first_stage:
                inner, other = part.first_stage
                notes.append(f"reduces over dims {inner} first, into partials, then over dims {other} reading those "
                             f"(two row kernels: its reduced dims are runs apart in memory)")
            if part.workspace is None:
                continue
            if part.geo.across:
                notes.append(f"takes its sums per column in its row kernel: each of its {part.workspace[0]} blocks adds "
                             f"up the rows it walks into a partial, then a second launch adds the partials")
                continue
            splits, what = part.workspace[0], "column" if part.geo.columns else "row"
            notes.append(f"splits each {what} of its reduction across {splits} blocks, then combines their partials "
                         f"in a second launch")
        return notes

    def prepare(self, env, device, compile_now: bool = True, defer: bool = False) -> None:
        """Lower, lay out and (unless ``compile_now`` is False: a member of a shared launch,
        see ``compile``) compile every part (``defer``: queue it for a worker process)."""
        writes = [n for n in self.seg.nodes if n.op in ("copy_to_out_", "copy_")]
        written = {id(n.written) for n in writes}
        self.write_outs = [(n.output, n.written) for n in writes]
        self.device = device
        self.constants = self.iotas.evaluate()
        env = dict(env)  # later parts read what earlier ones store (a split's temporaries)
        env.update(self.constants)

        def place(part: Part, chosen: dict) -> Needs | None:
            # the layouts the rewrites chose for their temporaries, then the plan's
            return self._prepare_part(part, env, written, device, ChainMap(chosen, self.orders))

        try:
            legal = legalize(self.parts, place)
        except Unsupported:
            # outputs stored over their source's shape (``expr._stored_before_reshape``) join
            # a launch whose operands these strides may not view so: as lowered without that
            plain = [Part(p) for p in lower_segment(self.seg, self.iotas)]
            if len(plain) == len(self.parts):
                raise
            legal = legalize(plain, place)
        self.parts, self.columns_apart = legal.parts, legal.columns_apart
        _check_no_read_after_an_earlier_write(self.parts, written, env)
        self.shares = shares_launch(self.parts)
        if compile_now:
            self.compile(defer)

    def compile(self, defer: bool = False) -> None:
        """Each part's kernel (CuTe mode), once; with ``defer``, those not yet built are
        queued for worker processes and stay missing (``ready`` is False) until a call
        without it. A member of a shared launch compiles its own only if it must launch
        alone: the group failed to build, or a call's pointers broke the vector alignment
        of another member."""
        if self.mode != "cute":
            return
        if self.shares and self.shared is None:
            try:
                self.shared = compile_group(self.parts, self.device, defer)
                return
            except Exception:  # noqa: BLE001 - the parts still run, one launch each
                self.shares = False
        for part in self.parts:
            if part.fn is None:
                part.fn = compile_program(part.prog, part.geo, self.device, defer)

    @property
    def ready(self) -> bool:
        """Can ``run`` launch: its shared launch or every part's kernel built (the torch mode
        needs none)."""
        if self.mode != "cute":
            return True
        return self.shared is not None if self.shares else all(part.fn is not None for part in self.parts)

    def _prepare_part(self, part: Part, env, written: set, device, orders) -> Needs | None:
        """Lay ``part`` out for the tensors in ``env``: its stores' allocations and its
        geometry; the rewrite it needs first where it has none (``legalize.py``)."""
        part.allocs = []
        for st in part.prog.stores:
            v = st.target
            if id(v) in written:
                part.allocs.append(None)
            else:
                part.allocs.append((tuple(v.shape), planned_strides(v, orders), v.dtype))
        part.store_recipe = [(id(st.target), a) for st, a in zip(part.prog.stores, part.allocs)]
        stores = _allocate(part.store_recipe, env, device)
        _check_no_overlap(part, env, stores)
        geo = geometry_or_needs(part.prog, env, stores, self.iotas.params(), _sm_count(device))
        if isinstance(geo, Needs):
            return geo
        refs = []
        for b in geo.bases:
            ref = next(((True, i) for i, s in enumerate(stores) if s is b), None)
            if ref is None:
                ref = next((False, id(ld.source)) for ld in part.prog.loads if env[id(ld.source)] is b)
            refs.append(ref)
        geo.drop_call_tensors()
        part.base_refs, part.geo = refs, geo
        fresh = {j for j, (from_store, i) in enumerate(refs) if from_store and part.allocs[i] is not None}
        # a fresh allocation is 256-byte aligned, so only its static offset could misalign it
        part.checks = tuple(c for c in geo.align_checks if c[0] not in fresh or c[1] % c[2])
        if geo.splits:  # a workspace of partials per split: per reduction state, a column or a row each
            # (a row kernel's sums per column: a partial row per block, per sum)
            reduces = column_sums(part.prog) if geo.across else reductions_in_order(part.prog)
            states = max(1, column_state_offsets(reduces)[-1])
            splits, part.per_split = geo.splits
            part.workspace = (splits, states * (geo.n if geo.columns or geo.across else math.prod(geo.outer)))
        for st, t in zip(part.prog.stores, stores):
            env[id(st.target)] = t
        return None

    def run(self, env) -> bool:
        """Run the segment; False when these tensors do not fit the compiled assumptions
        (alignment): the caller then runs the reference backend for this call. The per-call
        path: allocate, read the bases, check the pointers of bases we did not allocate,
        make the views, launch (``scripts/host_probe.py`` times each step)."""
        launches = []
        for part in self.parts:
            views = self.part_views(part, env)
            if views is None:  # nothing has launched yet: the reference backend runs the segment
                return False
            launches.append((part, views))
        if self.shared is not None:
            self.shared(tuple(views for _, views in launches))
        else:
            for part, views in launches:
                self._launch(part, views)
        self.finish(env)
        return True

    def _launch(self, part: Part, views) -> None:
        if self.mode != "cute":
            _run_on_torch(part, views)
        elif part.workspace is None:
            part.fn(views)
        else:
            part.fn(views, *part.extra_args(self.device))

    def part_views(self, part: Part, env):
        """Allocate ``part``'s outputs into ``env`` and return the operand views of one
        launch; None when a base pointer no longer allows the compiled vector width."""
        if self.constants:
            env.update(self.constants)
        stores = _allocate(part.store_recipe, env, self.device)
        if FILL_NAN:
            _fill_nan(part, stores)
        bases = [stores[i] if from_store else env[i] for from_store, i in part.base_refs]
        if part.checks and not aligned(part.checks, bases):
            return None
        return views_for_call(part.geo, bases)

    def conform(self, env) -> None:
        """After the reference backend ran the segment for one call (``run`` returned False):
        each output the kernel allocates, in the layout the kernel gives it. A later kernel of
        the plan reads it through views fixed at its first call (``views_for_call``), so an
        output in torch's layout would be read at the wrong elements."""
        for part in self.parts:
            for target, a in part.store_recipe:
                t = env.get(target)
                if a is not None and isinstance(t, torch.Tensor) and not _same_places(t, a[1]):
                    out = torch.empty_strided(a[0], a[1], dtype=t.dtype, device=t.device)
                    env[target] = out.copy_(t)

    def finish(self, env) -> None:
        """After the launches: in-place results name their destination; view outputs."""
        for out, dst in self.write_outs:
            env[id(out)] = env[id(dst)]
        if self.post_views:
            reference.run_nodes(self.post_views, env)


class LaunchGroup:
    """Independent one-launch pointwise segments run as one launch (``schedule.launch_steps``)."""

    def __init__(self, kernels: list[SegmentKernel], defer: bool = False):
        self.kernels = kernels
        self.parts = [k.parts[0] for k in kernels]
        self.mode = kernels[0].mode
        self.fn = None
        self.compile(defer)

    def compile(self, defer: bool = False) -> None:
        """The shared launch (``defer``: queued for a worker, as ``SegmentKernel.compile``)."""
        if self.mode == "cute" and self.fn is None:
            self.fn = compile_group(self.parts, self.kernels[0].device, defer)

    @property
    def ready(self) -> bool:
        return self.mode != "cute" or self.fn is not None

    def run(self, env) -> bool:
        """False when a member's pointers do not fit (then each runs on its own)."""
        calls = []
        for k, part in zip(self.kernels, self.parts):
            views = k.part_views(part, env)
            if views is None:
                return False
            calls.append(views)
        if self.fn is not None:
            self.fn(tuple(calls))
        else:
            for part, views in zip(self.parts, calls):
                _run_on_torch(part, views)
        for k in self.kernels:
            k.finish(env)
        return True


def shares_launch(parts: list) -> bool:
    """May a segment's parts run as one launch (``pointwise.build_pointwise_group``): two or
    more pointwise programs, each a plain launch (no workspace, no shared-memory tile,
    32-bit indices), none reading what another stores and none writing in place (their
    threads run in any order)."""
    if len(parts) < 2:
        return False
    stored = {id(st.target) for p in parts for st in p.prog.stores}
    for p in parts:
        g = p.geo
        if p.prog.family != "pointwise" or g.columns or g.stage or g.index64 or g.splits or p.workspace is not None:
            return False
        if any(a is None for a in p.allocs) or any(id(ld.source) in stored for ld in p.prog.loads):
            return False
    return True


def launch_group(kernels: list, defer: bool = False) -> tuple[LaunchGroup | None, str]:
    """A LaunchGroup of these segments' kernels, or None and why they launch apart."""
    for k in kernels:
        if k is None:
            return None, "a member runs on the reference backend"
        if len(k.parts) != 1 or k.parts[0].prog.family != "pointwise" or k.parts[0].geo.columns:
            return None, f"segment {k.seg.index} is not one pointwise launch"
        if k.mode != kernels[0].mode or k.device != kernels[0].device:
            return None, f"segment {k.seg.index} runs elsewhere"
        if k.parts[0].geo.stage:
            return None, f"segment {k.seg.index} stages operands through shared memory (a block-wide tile)"
        if k.parts[0].geo.index64:
            return None, f"segment {k.seg.index} indexes in 64 bits (2**31 elements or more)"
    try:
        return LaunchGroup(kernels, defer), ""
    except Exception as e:  # noqa: BLE001 - the members still run, one launch each
        return None, f"{type(e).__name__}: {str(e)[:300]}"


def _same_places(t: torch.Tensor, strides) -> bool:
    """Are ``t``'s elements where ``strides`` puts them (a dim of extent 1 has no say)?"""
    return all(n == 1 or a == b for n, a, b in zip(t.shape, t.stride(), strides))


def _run_on_torch(part: Part, views) -> None:
    from thunder_fuser.backends.cute.torch_eval import run_program

    run_program(part.prog, part.geo, views)


FILL_NAN = False  # tests set it: every fresh output starts as NaN, so an unwritten element fails


def _check_no_read_after_an_earlier_write(parts: list, written: set, env) -> None:
    """A segment lowered into several launches (a reduction's result read by pointwise work:
    ``split_at_reductions``) recomputes, in a later launch, what it needs of the values before
    the reduction, from their loads. A load there of a tensor an earlier launch wrote in place
    would read the new values where the program means the old ones (``a.add_(a)`` stored in
    the first launch, ``a + a`` computed again in the second: found by the thorough property
    of the lowered programs). Such a segment runs on the reference backend."""
    stored: set[int] = set()  # the storages earlier launches wrote in place
    for k, part in enumerate(parts):
        for ld in part.prog.loads:
            t = env.get(id(ld.source))
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in stored:
                raise Unsupported(f"launch {k + 1} of the segment reads {ld.source.name}, which an earlier "
                                  "launch wrote in place")
        stored.update(env[id(st.target)].untyped_storage().data_ptr() for st in part.prog.stores
                      if id(st.target) in written)


def _allocate(store_recipe, env, device) -> list:
    """Per store: a fresh tensor, or for an in-place write the tensor it writes into; each
    also entered in ``env`` at once (a later part may read it: a split's temporaries)."""
    stores = []
    for target, a in store_recipe:
        t = env[target] if a is None else torch.empty_strided(a[0], a[1], dtype=a[2], device=device)
        env[target] = t
        stores.append(t)
    return stores


def _fill_nan(part: Part, stores) -> None:
    for a, t in zip(part.allocs, stores):
        if a is not None and t.dtype.is_floating_point:
            t.fill_(float("nan"))


def _check_no_overlap(part: Part, env, stores) -> None:
    """An in-place store may only meet reads of the same memory at the same element."""
    for a, w in zip(part.allocs, stores):
        if a is not None:
            continue
        wp = w.untyped_storage().data_ptr()
        for ld in part.prog.loads:
            t = env[id(ld.source)]
            same_place = t.stride() == w.stride() and t.storage_offset() == w.storage_offset()
            if t.untyped_storage().data_ptr() == wp and (not same_place or ld.views or ld.shifts):
                raise Unsupported(f"{ld.source.name} is read at other positions than the in-place write changes")




def compile_program(prog: Program, geo: Geometry, device, defer: bool = False):
    return compile_members([(prog, geo)], device, defer)


def compile_group(parts: list, device, defer: bool = False):
    """One launch for several independent pointwise programs (``pointwise.build_pointwise_group``)."""
    return compile_members([(p.prog, p.geo) for p in parts], device, defer)


def compile_members(members: list, device, defer: bool = False, directory=None):
    """The launch function of these (program, geometry) pairs; None where ``defer`` queued
    it for a worker process (``compile_workers.py``), which writes it to the disk cache
    (``directory``, in the worker)."""
    # the DSL is imported only to compile (the CPU check of lowering runs without it)
    from thunder_fuser.backends.cute.dsl.cute_memory import fake_operands
    from thunder_fuser.backends.cute.launch import build_launch
    from thunder_fuser.backends.cute.families.partials import fake_workspace
    from thunder_fuser.backends.cute.families.pointwise import build_pointwise_group

    arch = arch_of(device)
    texts = tuple((prog.family, _program_text(prog, geo), geo.signature()) for prog, geo in members)
    key = ("v2", texts[0], arch) if len(members) == 1 else ("group v2", texts, arch)  # v2: kernels named by their ops
    if not config.flag("THUNDER_FUSER_FAST_MATH"):  # the same programs, other instructions (``fast_math_for``)
        key += ("exact math",)

    def build():
        import cutlass.cute as cute
        from cutlass.cute.runtime import make_fake_stream

        if len(members) == 1:
            prog, geo = members[0]
            launch = build_launch(prog, geo)
            args = [fake_operands(geo)]
            if geo.splits:
                args += [fake_workspace(), 1]
        else:
            launch = build_pointwise_group([p for p, _ in members], [g for _, g in members])
            args = [tuple(fake_operands(g) for _, g in members)]
        stream = make_fake_stream(use_tvm_ffi_env_stream=True)
        return cute.compile(launch, *args, stream, options=compile_options(arch))

    digest = cache.key_digest(key)

    def job():
        portable = _portable(members)
        return None if portable is None else (__name__, "compile_portable", (portable,))

    if defer and compile_workers.submit(digest, job, arch):
        return None
    compile_workers.wait(digest)
    return cache.get_or_compile(key, build, directory, digest)



def _portable(members: list) -> list | None:
    """The members as they travel: a geometry finds its loads' operands by the loads'
    ``id``, which a pickle does not keep, so each load's slot goes beside it by position
    (None where some slot belongs to no load of the program: compiled by the caller)."""
    out = []
    for prog, geo in members:
        slots = [geo.load_slot.get(id(ld)) for ld in prog.loads]
        if len({id(ld) for ld in prog.loads}) != len(geo.load_slot) or None in slots:
            return None
        out.append((prog, geo, slots))
    return out


def _rebuilt(portable: list) -> list:
    """The members again, in the worker (``_portable``)."""
    for prog, geo, slots in portable:
        geo.load_slot = {id(ld): s for ld, s in zip(prog.loads, slots)}
    return [(prog, geo) for prog, geo, _ in portable]


def compile_portable(portable: list, directory=None):
    """A compile worker's job (``compile_workers.submit``): the members as they travelled."""
    return compile_members(_rebuilt(portable), None, directory=directory)


def _sm_count(device) -> int:
    if device is not None and getattr(device, "type", None) == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # an H100 SXM: what CI's PTX compile and the CPU check assume


def _program_text(prog: Program, geo: Geometry) -> str:
    """The program with value names erased (loads named by operand slot and shift): two
    segments computing the same thing over the same operand pattern share a kernel."""

    def load_name(e) -> str:
        return f"load{geo.load_slot[id(e)]}" + "".join(f"<<{at}@{d}" for d, at in e.shifts)

    return " | ".join(("row " if st.is_row else "column " if st.across else "") + render(st.expr, load_name, typed=True)
                      for st in prog.stores)
