"""A plan's per-call work as one generated Python function, with no interpretation left.

``Plan.run`` walks the schedule, looks kernels up, keeps every value in a dict and checks
each launch's pointers: about 7 us of Python per small call on the H100 host, on top of the
launch itself (``scripts/host_probe.py``). After a plan's first call every decision is
made, so the runner writes the call out as straight-line code, the way thunder writes a
trace as a Python program: locals instead of the dict, allocations with their shapes,
strides and dtypes as constants, a view only where an operand is not its tensor as it is,
each launch, ``del`` where the schedule frees a value, and the outputs.

Whatever could differ between calls is checked first, before anything runs: the input
strides (the plan's key) and the alignment of the input pointers the kernels' vector
accesses assume. If either fails the function returns None and the runner takes the
general path, which handles any call, so nothing has been launched or written twice.
A plan whose first call left something unresolved, that writes an input in place while
grad mode records, or that reads a pointer the top cannot check, gets no function.
"""

from __future__ import annotations

import math
import warnings

import torch

from thunder_fuser.backends import reference
from thunder_fuser.backends.cute import segment_kernel
from thunder_fuser.backends.cute.segment_kernel import LaunchGroup, SegmentKernel
from thunder_fuser.cudagraphs import region_graphs
from thunder_fuser.ir.ops import METADATA
from thunder_fuser.ir.region import Value
from thunder_fuser.ir.torch_impls import REFERENCE_IMPLS
from thunder_fuser.layout import strides_for_order
from thunder_fuser.runtime.donation import donated, donating
from thunder_fuser.runtime.plan import PLAIN_TENSOR_TYPES, conform_output


def _direct_view(n) -> bool:
    """A view or slice of one tensor by constant arguments: the reference backend's call
    on it is the whole of its work (its dtype is its input's: nothing to conform). A
    decode step's regions are small: run through ``run_nodes``, each view cost a dict, a
    walk of its arguments and a lookup, about as much as the torch call itself."""
    return (n.op in METADATA and len(n.outputs) == 1 and not n.kwargs and isinstance(n.args[0], Value)
            and n.inputs() == [n.args[0]])


def _strongest(checks: list) -> list:
    """The alignment checks ``(value id, alignment, residue)`` no other implies, in order: a
    pointer at residue r modulo 16 is at residue r % 8 modulo 8 (RoPE's halves of a
    projection checked once each, not once a width)."""
    checks = list(dict.fromkeys(checks))
    return [(v, a, r) for v, a, r in checks
            if not any(v2 == v and a2 > a and a2 % a == 0 and r2 % a == r for v2, a2, r2 in checks)]


def _identity(n) -> bool:
    """``update_aliases``: it orders thunder's later reads and returns the same tensors
    (run through ``run_nodes`` it cost a dict and an interpreter call, 10-20 us a decode
    region on the H100 host)."""
    return (n.op == "update_aliases" and not n.kwargs and len(n.args) == 1 and isinstance(n.args[0], (list, tuple))
            and len(n.args[0]) == len(n.outputs) and all(isinstance(a, Value) for a in n.args[0]))


def _same_memory(m, shape, strides) -> bool:
    """Does tensor meta ``m`` lie as a store of ``shape`` and ``strides`` would: the same
    strides, or both row-major over as many elements (the logits ``[b, s, vocab]`` a loss
    reads as ``[b * s, vocab]``)?"""
    if tuple(m.shape) == tuple(shape):
        return tuple(m.stride()) == tuple(strides)
    return (m.numel() == math.prod(shape) and tuple(m.stride()) == _row_major(m.shape)
            and tuple(strides) == _row_major(shape))


def _row_major(shape) -> tuple:
    return strides_for_order(tuple(shape), list(range(len(shape))))


def _reads_as_written(o, store) -> bool:
    """Does operand ``o`` read each element where ``store`` writes it?"""
    return (not o.is_store and o.iota is None and o.offset == 0 and tuple(o.shape) == tuple(store.shape)
            and tuple(o.stride) == tuple(store.stride))


def _fast_paths() -> dict | None:
    """torch.compile's own low-overhead allocation and reinterpretation (its generated
    wrappers call them), where this torch has them."""
    guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    if guards is None or not hasattr(guards, "_empty_strided_cuda") or not hasattr(guards, "_reinterpret_tensor"):
        return None
    return {"empty_cuda": guards._empty_strided_cuda, "reinterpret": guards._reinterpret_tensor,
            "cuda_device": getattr(torch._C, "_cuda_getDevice", None)}


def _reinterpret(t: torch.Tensor, shape, strides, offset: int) -> torch.Tensor:
    """``reinterpret_tensor``'s meaning where torch lacks it: ``offset`` counts from ``t``'s."""
    return t.as_strided(shape, strides, t.storage_offset() + offset)


_FAST = _fast_paths()


def _view_on_meta(n, m: torch.Tensor) -> torch.Tensor | None:
    """The view node ``n`` takes of the meta tensor ``m``, or None where it would copy (a
    reshape copies where the strides do not allow a view) or the op fails on meta."""
    try:
        v = REFERENCE_IMPLS[n.op](m, *n.args[1:])
    except Exception:  # noqa: BLE001 - no meta layout: unknown, as a copy
        return None
    ok = isinstance(v, torch.Tensor) and v.device.type == "meta" and v.dtype == m.dtype and v._is_view()
    return v if ok else None


class _Launch:
    """A line of the body that launches a kernel, and the names of the tensors it reads or
    writes (the graph's key, ``region_graphs.py``); ``writes``: it writes a tensor it did
    not allocate (an in-place update, or an output over a dead input)."""

    def __init__(self, text: str, names, writes: bool = False):
        self.text, self.names, self.writes = text, tuple(dict.fromkeys(names)), writes


class _Del:
    """A line that frees what the schedule frees (a graphed body moves it after the launches
    that read it)."""

    def __init__(self, names: list[str]):
        self.names = names
        self.text = f"del {', '.join(names)}"


class _View:
    """A line that views a tensor through the reference backend's op (``op``); ``view``:
    surely a view of a tensor the code allocated (never a copy)."""

    def __init__(self, text: str, op: str, out: str, src: str, view: bool = False):
        self.text, self.op, self.out, self.src, self.view = text, op, out, src, view


class _Torch:
    """A line that runs torch ops on tensors' values (``run_nodes``)."""

    def __init__(self, text: str):
        self.text = text


# views that may copy (torch's rule): their line reads the values a launch wrote
_MAY_COPY = ("reshape", "shallow_copy", "stride_order")
GRAPH_DEFER_BYTES = 64 << 20  # a region whose temporaries would live this much longer is not graphed


class _Unfit(Exception):
    """The plan needs the general path (the reason is for tests and debugging)."""


class StraightLineWarning(UserWarning):
    """Writing a plan's code failed: its calls take the general path (the test suite makes
    this an error, so such a bug fails CI rather than hiding)."""


def straight_line(plan, key: tuple, run=None):
    """The generated function ``run(args) -> list | None`` for ``plan`` (built for the
    input strides ``key``, ``plan.spec_key``), or None. ``run``: the ``LaunchRun`` the
    region's calls belong to (``launch_run.py``): graphed code hands it its launches, other
    code flushes it before launching."""
    try:
        return _Writer(plan, key, run).function()
    except _Unfit:
        return None
    except Exception as e:  # noqa: BLE001 - a writer bug must not fail the call
        warnings.warn(f"{plan.decision.region.name}: no straight-line code ({type(e).__name__}: {e})",
                      StraightLineWarning)
        return None


class _Writer:
    def __init__(self, plan, key: tuple, run=None):
        self.plan, self.key, self.run = plan, key, run
        self.count = 0
        self.glob = {"empty_strided": torch.empty_strided, "run_nodes": reference.run_nodes, "nan": math.nan,
                     "reinterpret": _reinterpret if _FAST is None else _FAST["reinterpret"],
                     "run_on_torch": segment_kernel._run_on_torch, "conform": conform_output}
        self.body: list = []  # lines: str (host work), or _Launch, _Del, _View, _Torch
        self.using: list | None = None  # while a launch's operands are written: the names they read
        self.alloc_bytes: dict[str, int] = {}  # a local the code allocates -> its bytes
        # a local the code allocates, or a view of one -> a meta tensor laid out as it is: a
        # reshape of it that is a view reads no value, so a launch run may defer the launch
        # that writes it (``launch_run.py``)
        self.laid_out: dict[str, torch.Tensor] = {}
        self.alloc_lines: list[int] = []  # where in the body the code allocates
        self.names: dict[int, str] = {}  # value id -> the name (local, argument or global) holding it
        self.owners: dict[str, set] = {}  # a generated local -> the value ids it holds
        self.fresh: dict[int, tuple] = {}  # value id -> strides, for what the code allocates
        self.args: dict[int, int] = {}  # value id of a tensor argument -> its index
        self.checks: list[tuple] = []  # (argument value id, alignment, pointer residue) checked first
        # value id -> a meta tensor laid out as the value is, for the arguments (their strides
        # are the key's) and the views taken of them: a view's pointer is its argument's plus
        # the meta tensor's storage offset, so its alignment is checked on the argument
        self.meta: dict[int, torch.Tensor] = {}
        self.root: dict[int, int] = {}  # value id of such a view -> its argument's
        # value id of a view of an argument -> its meta view, for views the code has not made
        # yet: one ``as_strided`` of the argument, written where it is first needed (a chain
        # slice -> reshape -> transpose costs one torch call, and a view only other views
        # read costs none)
        self.lazy: dict[int, torch.Tensor] = {}
        self.writing = False  # the next launch writes over a dead input (``donor_for``)
        self.cuda_device: int | None = None  # the index of the CUDA device ``allocation`` assumes current
        self.graphs_wanted = False  # launches to replay as a graph (``graphed_body``)
        self.defers = False  # the launches are handed to ``run`` (``graphed_body``)

    def const(self, obj, hint: str = "c") -> str:
        name = f"{hint}{len(self.glob)}"
        self.glob[name] = obj
        return name

    def fresh_name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}{self.count}"

    def local(self, vid: int, hint: str = "t") -> str:
        name = self.fresh_name(hint)
        self.names[vid] = name
        self.owners[name] = {vid}
        return name

    def held(self, vid: int) -> bool:
        return vid in self.names or vid in self.lazy

    def name(self, vid: int) -> str | None:
        """The name holding value ``vid``; a view not made yet is made here."""
        if vid in self.names:
            return self._used(self.names[vid])
        m = self.lazy.get(vid)
        if m is None:
            return None
        using, self.using = self.using, None  # the view is made of its argument before the launch
        expr = self.strided(vid, tuple(m.shape), tuple(m.stride()), 0)
        self.using = using
        del self.lazy[vid]
        self.body.append(f"{self.local(vid)} = {expr}")
        return self._used(self.names[vid])

    def _used(self, name: str) -> str:
        if self.using is not None:
            self.using.append(name)
        return name

    def strided(self, vid: int, shape, strides, offset: int, view: bool = True) -> str:
        """``as_strided(shape, strides)`` at ``offset`` elements past where value ``vid``
        begins: of the argument a view not made yet views, else of ``vid``'s tensor. Not a
        ``view`` (a kernel's operand, dropped after its launch): torch.compile's
        ``reinterpret_tensor``, the same tensor without a view's bookkeeping, in half the
        time (0.7 us against 1.4 on the CPU). A view is only ever made of an argument
        (``name``: the views not made yet), so it counts from the argument's offset."""
        m = self.lazy.get(vid)
        if m is not None:
            vid, offset = self.root[vid], offset + m.storage_offset()
        name = self._used(self.names[vid])
        if not view:
            return f"reinterpret({name}, {shape}, {strides}, {offset})"
        return f"{name}.as_strided({shape}, {strides}, {name}.storage_offset()" + (f" + {offset})" if offset else ")")

    def allocation(self, shape, strides, dtype, device) -> str:
        """An expression allocating a tensor. On the current CUDA device, torch.compile's
        ``empty_strided_cuda``, which skips ``torch.empty_strided``'s argument parsing (a
        region call allocates 2-5 tensors: 2.1 us each on the H100 host); the function then
        checks first that the device is still current."""
        index = getattr(device, "index", None)
        if (getattr(device, "type", None) == "cuda" and index is not None and _FAST is not None
                and _FAST["cuda_device"] is not None):
            self.glob.update(_FAST)
            self.cuda_device = index
            return f"empty_cuda({shape}, {strides}, {self.const(dtype, 'dt')})"
        return f"empty_strided({shape}, {strides}, dtype={self.const(dtype, 'dt')}, device={self.const(device, 'dev')})"

    def alias(self, vid: int, of: int) -> None:
        self.name(of)
        self.names[vid] = self.names[of]
        if of in self.meta:  # an in-place write's result is its destination: views of it are views of that
            self.meta[vid], self.root[vid] = self.meta[of], self.root[of]
        if self.names[of] in self.owners:
            self.owners[self.names[of]].add(vid)

    def function(self):
        plan = self.plan
        region = plan.decision.region
        if plan.decision.error is not None:
            raise _Unfit("the plan raises")
        if plan.laid_out:
            raise _Unfit("a kernel that failed to compile left its layout to the reference backend")
        params = []
        for i, v in enumerate(region.inputs):
            name = f"a{i}"
            params.append(name)
            self.names[id(v)] = name
            if v.is_tensor:
                self.args[id(v)] = i
                strides = self.key[i] if i < len(self.key) else None
                if strides is not None and isinstance(v.dtype, torch.dtype):
                    self.meta[id(v)] = torch.empty_strided(v.shape, strides, dtype=v.dtype, device="meta")
                    self.root[id(v)] = id(v)
        # a tensor of another kind (a subclass, sparse) takes the general path, which runs it as
        # torch does (``RegionRunner.general``); its strides are read after its type
        plain = self.const(PLAIN_TENSOR_TYPES, "plain")
        guards = [
            f"type({self.names[id(v)]}) not in {plain} or {self.names[id(v)]}.stride() != {self.const(key_part, 's')}"
            for v, key_part in zip(region.inputs, self.key) if key_part is not None
        ]
        if region.grad_enabled:  # the general path raises for a leaf that requires grad
            guards += [f"a{i}.requires_grad" for i in plan.decision.written_inputs]
        self.donors = self.dead_inputs_read_by_one_segment()
        for step, frees in plan.step_frees:
            self.step(step)
            self.free(frees)
        outs = [self.output(oid, strides) for oid, strides in plan.output_recipe]
        self.conforms = any(o.startswith("conform(") for o in outs)  # may copy, so reads values
        head = ["def run(args):"]
        if params:
            head.append(f"    {', '.join(params)}{',' if len(params) == 1 else ''} = args")
        lines = self.graphed_body(region.name) if self.graphs_wanted else None
        # the pointers the alignment guards read, kept for the graph's key (read once a call)
        keyed = self.key_names if lines is not None else ()
        guards += [(f"(p_{n} := {n}.data_ptr())" if n in keyed else f"{n}.data_ptr()") + f" % {align} != {rest}"
                   for n, align, rest in ((self.names[vid], a, r) for vid, a, r in _strongest(self.checks))]
        if self.cuda_device is not None:
            guards.append(f"cuda_device() != {self.cuda_device}")
        if guards:
            head.append("    if (" + "\n            or ".join(guards) + "):\n        return None")
        if lines is None:
            lines = [line if isinstance(line, str) else line.text for line in self.body]
        if self.run is not None and not self.defers:  # what the run holds launches before this code
            lines.insert(0, f"{self.const(self.run.flush, 'flush')}()")
        src = "\n".join(head + ["    " + line for line in lines] + [f"    return [{', '.join(outs)}]"]) + "\n"
        code = compile(src, f"<thunder_fuser {region.name}>", "exec")
        exec(code, self.glob)  # host code only: kernels are CuTe DSL modules, built elsewhere
        fn = self.glob["run"]
        fn.source = src
        return fn

    def graphed_body(self, name: str) -> list[str] | None:
        """The body with its launches replayed as a CUDA graph keyed on their tensors'
        pointers (``region_graphs.py``), or None where that would change what the region
        computes or holds: a torch op on values between launches, a view that may copy a
        launch's output for a later launch, temporaries held more than
        ``GRAPH_DEFER_BYTES`` longer.

        Everything but the launches runs first, in order (allocations, views: no values
        read), then the key and the launches, then what reads their values (a view that
        may copy; not where a launch after it writes in place: the copy would read the
        written values). A ``del`` of a name the launches read waits until the end."""
        launches = [line for line in self.body if isinstance(line, _Launch)]
        if len(launches) < region_graphs.MIN_LAUNCHES or any(isinstance(line, _Torch) for line in self.body):
            return None
        launched = {n for line in launches for n in line.names}
        pre, post, deferred, after = [], [], [], False
        post_reads, post_made = set(), set()
        held_bytes = 0
        last_alloc = max(self.alloc_lines, default=-1)
        for i, line in enumerate(self.body):
            if isinstance(line, _Launch):
                after = True
            elif isinstance(line, _Del):
                keep = [n for n in line.names if n not in launched and n not in post_reads and n not in post_made]
                wait = [n for n in line.names if n not in keep]
                if keep:
                    pre.append(f"del {', '.join(keep)}")
                deferred += wait
                if i < last_alloc:  # an allocation after it could have reused the memory
                    held_bytes += sum(self.alloc_bytes.get(n, 0) for n in wait)
            elif isinstance(line, _View) and ((after and line.op in _MAY_COPY and not line.view) or line.src in post_made):
                if line.out in launched:  # a launch would read a copy made before it ran
                    return None
                if any(later.writes for later in self.body[i + 1:] if isinstance(later, _Launch)):
                    return None  # the copy, made after every launch, would read what a later one writes
                post.append(line.text)
                post_reads.add(line.src)
                post_made.add(line.out)
            else:
                pre.append(line if isinstance(line, str) else line.text)
        if held_bytes > GRAPH_DEFER_BYTES:
            return None
        names = list(dict.fromkeys(n for line in launches for n in line.names))
        self.defers = self.run is not None and not post and not self.conforms
        own = self.const(region_graphs.RegionGraphs(name), "graphs")
        if self.defers:  # the run replays them with its other members', or, at its miss, ``own``
            rg = self.const(self.run.defer, "defer")
            deferred = []  # a ``del`` would unbind what the closure reads when the run launches it
        else:
            rg = own
        self.key_names = set(names)
        guarded = {self.names[vid] for vid, _, _ in self.checks}  # their pointers: read by the guards
        key = "".join(f"p_{n}, " if n in guarded else f"{n}.data_ptr(), " for n in names)
        return (pre + [f"key = ({key})", "def launches():"] + ["    " + line.text for line in launches]
                + [f"{rg}(key, launches, {own})" if self.defers else f"{rg}(key, launches)"] + post
                + ([f"del {', '.join(dict.fromkeys(deferred))}"] if deferred else []))

    # ---- steps --------------------------------------------------------------------------
    def step(self, step: list) -> None:
        plan = self.plan
        if len(step) > 1:
            if step[0].index not in plan.groups:
                raise _Unfit(f"step of segment {step[0].index} has not run yet")
            if isinstance(plan.groups[step[0].index], LaunchGroup):
                self.group(plan.groups[step[0].index])
                return
        for seg in step:
            if seg.index not in plan.kernels:
                raise _Unfit(f"segment {seg.index} has not run yet")
            k = plan.kernels[seg.index]
            if k is None:
                self.reference(seg.nodes)
                for v in seg.outputs:  # a value an output views, in the plan's layout (``Plan.viewed``)
                    if id(v) in plan.decision.viewed and self.name(id(v)) is not None:
                        name = self.name(id(v))
                        self.body.append(_Torch(f"{name} = conform({name}, {plan.decision.viewed[id(v)]})"))
            else:
                self.kernel(k, seg.index)

    def kernel(self, k: SegmentKernel, segment: int | None = None) -> None:
        if k.shared is not None:  # its parts in one launch (``segment_kernel.shares_launch``)
            self.using = []
            calls = [self.part_views(k, part, segment) for part in k.parts]
            used, self.using = self.using, None
            writes, self.writing = bool(k.write_outs) or self.writing, False
            self.note_device(k)
            self.body.append(_Launch(f"{self.const(k.shared, 'group')}(({''.join(c + ', ' for c in calls)}))", used, writes))
            self.finish(k)
            return
        for part in k.parts:
            self.using = []
            views = self.part_views(k, part, segment)
            self.launch(k, part, views)
        self.finish(k)

    # ---- outputs written over dead inputs ---------------------------------------------------
    def dead_inputs_read_by_one_segment(self) -> dict[int, int]:
        """Input value id -> the one segment that reads it, for the region's dead inputs
        (``Region.dead_inputs``) that nothing else of the region reads, directly or through
        views, and that no output is or views: an output of that segment's kernel may be
        written over them (``donor_for``)."""
        region = self.plan.decision.region
        if not region.dead_inputs or segment_kernel.FILL_NAN or not donating():
            return {}
        segment_of = {id(n): seg.index for step, _ in self.plan.step_frees for seg in step for n in seg.nodes}
        # the segments' own nodes, not only the region's: a segment may recompute ops of
        # another from the same inputs (``t1710_r3``: a norm backward's column sums apart from
        # its rows, at batch 1), and those copies read the inputs too
        consumers = region.consumers()
        own = {id(n) for n in region.nodes}
        for step, _ in self.plan.step_frees:
            for n in (n for seg in step for n in seg.nodes if id(n) not in own):
                for v in n.inputs():
                    consumers.setdefault(id(v), []).append(n)
        outputs = {id(o) for o in region.outputs}
        donors = {}
        for v in region.inputs:
            if v.name not in region.dead_inputs or id(v) not in self.meta or id(v) in outputs:
                continue
            seen, todo, segments = set(), [v], set()
            while todo:  # the input and the views taken of it
                x = todo.pop()
                if id(x) in outputs:
                    segments.add(None)
                for n in consumers.get(id(x), []):
                    segments.add(segment_of.get(id(n)))
                    if n.op in METADATA and id(n.output) not in seen:
                        seen.add(id(n.output))
                        todo.append(n.output)
            if len(segments) == 1 and None not in segments:
                donors[id(v)] = segments.pop()
        return donors

    def donor_for(self, part, segment, alloc, index: int = 0, parts=()) -> int | None:
        """A dead input this part's store ``index`` may be written over: each thread reads
        its elements before it writes them there, no other thread touches them, and no other
        of the kernel's ``parts`` reads it (a segment storing two shapes launches a part per
        shape: the second read what the first had written over). So the
        part is pointwise with one store, or a row kernel of one block per row over rows
        that are rows of its store (its full-domain stores are written in its last pass
        over the row: the two-pass loss's gradient over the logits); the input has the
        store's shape, strides and dtype, and every operand of the part that reads it reads
        it as the store is written."""
        geo = part.geo
        if segment is None or geo.stage or part.prog.select_dims:
            return None
        if part.prog.family == "pointwise":
            if len(part.prog.stores) != 1:
                return None
        elif not (part.prog.family == "rows" and not geo.flat and not geo.split_rows and not geo.splits
                  and not geo.columns):
            return None
        shape, strides, dtype = alloc
        store = geo.operands[geo.store_slot[index]]
        # a piece of a cat or pad reads elsewhere than it writes (another thread's elements)
        shifted = {part.geo.load_slot[id(ld)] for ld in part.prog.loads if ld.shifts}
        for vid, seg in self.donors.items():
            m = self.meta[vid]
            if seg != segment or m.dtype != dtype or not _same_memory(m, shape, strides):
                continue
            if any(p is not part and any(not ref[0] and ref[1] == vid for ref in p.base_refs) for p in parts):
                continue
            on_it = [i for i, (b, _) in enumerate(part.geo.call_views)
                     if not part.base_refs[b][0] and part.base_refs[b][1] == vid]
            if on_it and all(part.geo.call_views[i][1] is None and i not in shifted
                             and _reads_as_written(part.geo.operands[i], store) for i in on_it):
                del self.donors[vid]
                return vid
        return None

    def group(self, g: LaunchGroup) -> None:
        self.using = []
        calls = [self.part_views(k, part) for k, part in zip(g.kernels, g.parts)]
        used, self.using = self.using, None
        self.note_device(g.kernels[0])
        if g.fn is not None:
            self.body.append(_Launch(f"{self.const(g.fn, 'group')}(({''.join(c + ', ' for c in calls)}))", used))
        else:
            for part, views in zip(g.parts, calls):
                self.body.append(_Launch(f"run_on_torch({self.const(part, 'part')}, {views})", used))
        for k in g.kernels:
            self.finish(k)

    def part_views(self, k: SegmentKernel, part, segment: int | None = None) -> str:
        """Allocate the part's stores; the tuple of its operand views (an expression)."""
        for vid, t in k.constants.items():  # iota operands, built with the plan
            if not self.held(vid):
                self.names[vid] = self.const(t, "iota")
        stores = []
        for si, ((target, alloc), a) in enumerate(zip(part.store_recipe, part.allocs)):
            if alloc is None:  # an in-place write: into the tensor the destination holds
                if self.name(target) is None:
                    raise _Unfit("an in-place destination the code does not hold")
                stores.append(target)
                continue
            name = self.local(target)
            shape, strides, dtype = alloc
            self.alloc_bytes[name] = math.prod(shape) * dtype.itemsize
            self.laid_out[name] = torch.empty_strided(shape, strides, dtype=dtype, device="meta")
            fresh = self.allocation(shape, strides, dtype, k.device)
            donor = self.donor_for(part, segment, alloc, si, k.parts)
            self.alloc_lines.append(len(self.body))
            if donor is None:
                self.body.append(f"{name} = {fresh}")
            else:  # written over a dead input where only the trace holds it (``runtime/donation.py``)
                self.glob["donated"] = donated  # only here: constants are numbered by the globals' count
                over = self.name(donor)
                if tuple(self.meta[donor].shape) != tuple(shape):  # a row-major reshape of it (a loss's rows)
                    over = f"{over}.view({tuple(shape)})"
                d = self.names[donor]
                if self.run is not None:  # what the run's pending launches hold of it (``LaunchRun.release``)
                    self.body.append(f"{self.const(self.run.release, 'release')}({d})")
                self.body.append(f"{name} = {over} if donated({d}) else {fresh}")
                self.writing = True  # the launch writes over an input
            if segment_kernel.FILL_NAN and dtype.is_floating_point:
                self.body.append(f"{name}.fill_(nan)")
            self.fresh[target] = strides
            stores.append(target)
        bases = [stores[i] if from_store else i for from_store, i in part.base_refs]
        for b, off, align in part.checks:
            self.check(bases[b], off, align, k)
        views = []
        for b, v in part.geo.call_views:
            vid = bases[b]
            if not self.held(vid):
                raise _Unfit("an operand the code does not hold")
            if v is None and vid in self.lazy:  # a view not made yet, read only by this launch so far
                m = self.lazy[vid]
                views.append(self.strided(vid, tuple(m.shape), tuple(m.stride()), 0, view=False))
            elif v is None:
                views.append(self.name(vid))
            elif isinstance(v, int):  # the launch function builds the view (``Geometry.base_maps``)
                views.append(f"({self.name(vid)}, {v})")
            else:  # of the argument itself where the base is a view of one not made yet
                views.append(self.strided(vid, v[0], v[1], v[2], view=False))
        return "(" + "".join(x + ", " for x in views) + ")"

    def check(self, vid: int, byte_offset: int, align: int, k: SegmentKernel) -> None:
        """A base pointer's vector alignment: checked up front for an argument, known now
        for what the code allocates or the plan holds; anything else needs the general path."""
        if vid in self.args:
            self.checks.append((vid, align, -byte_offset % align))
        elif vid in self.fresh:
            if byte_offset % align:
                raise _Unfit("a fresh allocation read at a misaligned offset")
        elif vid in k.constants:
            if (k.constants[vid].data_ptr() + byte_offset) % align:
                raise _Unfit("a misaligned constant")
        elif vid in self.meta:  # a view of an argument: the argument's pointer, further on
            m = self.meta[vid]
            self.checks.append((self.root[vid], align, -(byte_offset + m.storage_offset() * m.element_size()) % align))
        else:
            raise _Unfit("a pointer only known after a launch")

    def note_device(self, k: SegmentKernel) -> None:
        """Launches to replay as a graph: CuTe DSL kernels on a CUDA device, or any in the
        tests' stand-in mode (``region_graphs.wanted``)."""
        if not self.graphs_wanted and (k.mode == "cute" or region_graphs.STAND_IN):
            self.graphs_wanted = region_graphs.wanted(k.device)

    def launch(self, k: SegmentKernel, part, views: str) -> None:
        used, self.using = self.using or [], None
        writes, self.writing = bool(k.write_outs) or self.writing, False
        self.note_device(k)
        if k.mode != "cute":
            self.body.append(_Launch(f"run_on_torch({self.const(part, 'part')}, {views})", used, writes))
        elif part.workspace is None:
            self.body.append(_Launch(f"{self.const(part.fn, 'kernel')}({views})", used, writes))
        else:  # a column reduction: its workspace and rows per split, as ``_Part.extra_args`` makes them
            ws = self.fresh_name("ws")
            self.alloc_lines.append(len(self.body))
            self.body.append(f"{ws} = {self.allocation(part.workspace, _row_major(part.workspace), torch.float32, k.device)}")
            self.body.append(_Launch(f"{self.const(part.fn, 'kernel')}({views}, {ws}, {part.per_split})", used + [ws],
                                     writes))
            self.body.append(_Del([ws]))

    def finish(self, k: SegmentKernel) -> None:
        for out, dst in k.write_outs:
            self.alias(id(out), id(dst))
        if k.post_views:
            self.reference(k.post_views)

    def reference(self, nodes) -> None:
        """Nodes torch runs (a view segment, a segment no kernel covers): views as one torch
        call each, on the locals; anything else through a small dict, as ``Plan.run`` does."""
        if all(_direct_view(n) or _identity(n) for n in nodes):
            for n in nodes:
                if _identity(n):  # its outputs are its inputs, the same tensors
                    for out, a in zip(n.outputs, n.args[0]):
                        if not self.held(id(a)):
                            raise _Unfit("a value the code does not hold")
                        self.alias(id(out), id(a))
                    continue
                if self.meta_view(n):  # a view of an argument: made where first needed
                    self.lazy[id(n.output)] = self.meta[id(n.output)]
                    continue
                src = self.name(id(n.args[0]))
                if src is None:
                    raise _Unfit("a value the code does not hold")
                fn = self.const(REFERENCE_IMPLS[n.op], n.op)
                rest = "".join(", " + self.const(a, "arg") for a in n.args[1:])
                out = self.local(id(n.output))
                self.body.append(_View(f"{out} = {fn}({src}{rest})", n.op, out, src, self.surely_view(n, src, out)))
            return
        made = {id(o) for n in nodes for o in n.outputs}
        reads = {id(v): v for n in nodes for v in n.inputs() if id(v) not in made}
        for vid in reads:
            if self.name(vid) is None:
                raise _Unfit("a value the code does not hold")
        env = self.fresh_name("env")
        entries = ", ".join(f"{vid}: {self.names[vid]}" for vid in reads)
        self.body.append(_Torch(f"{env} = {{{entries}}}"))
        self.body.append(_Torch(f"run_nodes({self.const(list(nodes), 'nodes')}, {env})"))
        for vid in made:
            name = self.local(vid)
            self.body.append(f"{name} = {env}[{vid}]")
        self.body.append(f"del {env}")

    def surely_view(self, n, src: str, out: str) -> bool:
        """Is ``n`` a view of the local ``src`` (laid out as the code allocated it), never a
        copy? Then its line reads no value."""
        m = self.laid_out.get(src)
        v = None if m is None else _view_on_meta(n, m)
        if v is None:
            return False
        self.laid_out[out] = v
        return True

    def meta_view(self, n) -> bool:
        """Record the view ``n`` takes, on the meta tensor of its source where that is an
        argument or a view of one (``self.meta``); False where it has none."""
        src = self.meta.get(id(n.args[0]))
        m = None if src is None else _view_on_meta(n, src)
        if m is None:
            return False
        self.meta[id(n.output)] = m
        self.root[id(n.output)] = self.root[id(n.args[0])]
        return True

    def free(self, frees) -> None:
        gone = []
        for vid in frees:
            self.lazy.pop(vid, None)  # never needed: never made
            name = self.names.pop(vid, None)
            owners = self.owners.get(name)
            if owners is None:
                continue
            owners.discard(vid)
            if not owners:
                del self.owners[name]
                gone.append(name)
        if gone:
            self.body.append(_Del(gone))

    def output(self, oid: int, strides) -> str:
        name = self.name(oid)
        if name is None:
            raise _Unfit("an output the code does not hold")
        if strides is None or self.fresh.get(oid) == strides:
            return name
        return f"conform({name}, {strides})"


