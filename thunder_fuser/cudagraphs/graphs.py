"""CUDA graphs over a whole step, keeping every in-place update.

A decode step at batch 1 is bound by the host: replaying it as one CUDA graph hides the
host. thunder's ``CUDAGraphTransform`` replays a KV-cache step with a wrong cache (relative
error 0.10 after four steps on the H100): an input written in place must be written where
the caller holds it, not in a copy the graph made. ``graphed(step)`` wraps any step (a
``thunder.jit`` of a model, our regions and the extern ops between them) so that:

* inputs whose storage is the same from call to call (parameters, buffers, a KV cache) are
  read and written where they live: their addresses are part of the graph's key, so an
  input at a new address captures another graph and no graph replays over stale pointers.
  "The same" is the same storage object, not only the same address: a token made anew each
  call often lands on the block its predecessor freed (the allocator hands it back), and
  taking it for a held input cost a capture at its first move. For a ``thunder.jit`` step
  that includes what the step reads besides its arguments: the tensors thunder's prologue
  fetches (a module's parameters and buffers, a transformers ``StaticCache`` the module
  holds and swaps for a new one), refetched each call without the prologue's checks
  (``cudagraphs/held_tensors.py``). What thunder's prologue only checks and bakes into
  its trace (``module.training``, a config value) is not rechecked on a replay: a graphed
  step is for a module whose settings stay as they were at capture. Of any other step only
  the arguments are seen;
* inputs that move from call to call (the token, the position, a mask) are copied into
  static buffers before each replay, and copied back after it (a step that writes one in
  place still writes the caller's tensor);
* a new shape, dtype, stride or non-tensor argument captures another graph;
* what cannot be captured runs without a graph, with the reason kept in ``ungraphed``:
  a CPU tensor among the inputs is seen before capture; a step that syncs with the host
  (``.item()``, a data-dependent shape) fails its capture, and the error (which names the
  op torch refused) is kept and warned once;
* captures allocate from one private memory pool; ``captured_bytes`` says how much.

The first ``warmup`` calls run the step as it is (they trace, compile kernels and show which
inputs keep their address), and so does any call after one that queued kernels for worker
processes (``backends/cute/compile_workers.py``: its plans ran on the reference backend, and the
next call builds their kernels outside a capture). Outputs are the graph's own tensors,
cloned on return so the next replay cannot change what the caller holds. ``backend`` is what captures and replays:
CUDA graphs by default; the tests give a recording stand-in on the CPU.
"""

from __future__ import annotations

import warnings
import weakref

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from thunder_fuser.cudagraphs.held_tensors import HeldTensors
from thunder_fuser.backends.cute import cache, compile_workers
from thunder_fuser.cudagraphs import region_graphs


MAX_GRAPHS = 16  # graphs one step keeps; beyond, a new shape or address runs without one


class GraphWarning(UserWarning):
    """A step runs without a graph (the reason is in the message and in ``ungraphed``)."""


class CudaGraphs:
    """Captures with ``torch.cuda.graph`` into one private pool, with TVM-FFI's launch stream
    (our kernels') set to the capture stream too.

    That stream is torch's one default capture stream, whose cuBLAS workspace every graph
    captured on it uses, and which torch drops when any of them is destroyed
    (``runtime/region_graphs.Retirement`` says how, and keeps launch runs clear of it). Here
    that is harmless while one graphed step's graphs live and die together: the workspace
    goes back into this pool, where only this step's next captures take it. Not guarded:
    one graphed step dropped, then the allocator's cache emptied, while another graphed
    step (or another library's graph) captured on that stream still replays."""

    def __init__(self):
        self.pool = None

    @staticmethod
    def refuses(tensors: dict) -> str | None:
        """Why these inputs cannot be captured, before any capture; None if they can."""
        cpu = [i for i, t in tensors.items() if t.device.type != "cuda"]
        if cpu:
            return f"inputs {cpu} are not on a CUDA device (a graph replays device work only)"
        return None

    def capture(self, run, inputs):
        """(replay, outputs, bytes) of ``run()`` captured (nothing runs until a replay;
        ``inputs``, what the step reads and may write, are a stand-in's to protect)."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        before = torch.cuda.memory_allocated()
        ctx = torch.cuda.graph(graph, pool=self.pool)
        try:
            import tvm_ffi

            ctx = tvm_ffi.use_torch_stream(ctx)
        except (ImportError, AttributeError):
            pass
        with ctx:
            out = run()
        return graph.replay, out, torch.cuda.memory_allocated() - before


class _Place:
    """Where an input lives: its storage (by a weak reference, so a freed one is seen as gone
    even when a new tensor takes over its block) and its address within it."""

    def __init__(self, t: torch.Tensor):
        self.ptr = t.data_ptr()
        try:
            self.storage = weakref.ref(t.untyped_storage())
        except (TypeError, RuntimeError, NotImplementedError):  # no storage to refer to: the address alone
            self.storage = None

    def holds(self, t: torch.Tensor) -> bool:
        """(each call, for each input read in place: no weak reference made here)"""
        if t.data_ptr() != self.ptr:
            return False
        if self.storage is None:
            return True
        try:
            return self.storage() is t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # another kind of tensor at this argument
            return False


class _Graph:
    def __init__(self, replay, outputs, static: dict, nbytes: int):
        self.replay, self.outputs, self.static, self.nbytes = replay, outputs, static, nbytes
        self.held = None  # held_tensors.FrozenSignature of the capture, for a thunder step


class GraphedStep:
    def __init__(self, step, backend=None, warmup: int = 2):
        self.step = step
        self.backend = backend
        self.warmup = warmup
        self.calls = 0
        self.graphs: dict = {}
        self.places: dict[int, _Place] = {}  # flat index -> its storage and address, while they hold still
        self.moves: dict[int, int] = {}  # flat index -> how often an input read in place moved
        self.ungraphed: dict = {}  # key -> why that call runs without a graph
        self.held: dict = {}  # key of the arguments -> HeldTensors of a thunder step
        self.captures = 0
        self.queued_last = False  # did the last call run as it is queue kernels for workers?

    @property
    def captured_bytes(self) -> int:
        return sum(g.nbytes for g in self.graphs.values())

    def __call__(self, *args, **kwargs):
        flat, spec = tree_flatten((args, kwargs))
        tensors = {i: t for i, t in enumerate(flat) if isinstance(t, torch.Tensor)}
        self.calls += 1
        if self.calls <= self.warmup or self.queued_last:
            self._note_places(tensors)
            before = cache.stats["queued"]
            out = self.step(*args, **kwargs)
            # kernels still compiling in workers: the next call runs as it is too, building them
            self.queued_last = cache.stats["queued"] != before
            return out
        self._note_moves(tensors)
        key = self._key(flat, tensors, spec)
        held, sig = self.held.get(key), None
        if held is not None:
            try:
                sig = held.signature(args, kwargs)
            except Exception:  # noqa: BLE001 - thunder's trace changed: learn its fetches anew
                del self.held[key]
                return self.step(*args, **kwargs)
            key = (key, sig.ptrs, sig.values)
        if key in self.ungraphed:
            return self.step(*args, **kwargs)
        g = self.graphs.get(key)
        if g is not None and sig is not None and not sig.same_tensors(g.held):
            del self.graphs[key]  # other tensors at the captured addresses, of other shapes
            g = None
        if g is None:
            if self.backend is None:
                self.backend = CudaGraphs()
            refuses = getattr(self.backend, "refuses", None)
            why = refuses(tensors) if refuses else None
            if why is None and len(self.graphs) >= MAX_GRAPHS:
                why = f"{MAX_GRAPHS} graphs captured already (shapes or addresses keep changing)"
            if why is None:
                try:
                    g = self._capture(flat, tensors, spec)
                except Exception as e:  # noqa: BLE001 - a step that cannot be captured runs as it is
                    why = f"capture failed: {type(e).__name__}: {str(e)[:300]}"
            if why is not None:
                self.ungraphed[key] = why
                warnings.warn(f"a step runs without a CUDA graph: {why}", GraphWarning)
                return self.step(*args, **kwargs)
            if held is None:  # the first capture for these arguments: what else it read
                held = HeldTensors.of(self.step, args, kwargs, tensors.values())
                if held is not None:
                    self.held[key] = held
                    sig = held.signature(args, kwargs)
                    key = (key, sig.ptrs, sig.values)
            if sig is not None:
                g.held = sig.frozen()
            self.graphs[key] = g
        for i, buf in g.static.items():
            buf.copy_(tensors[i])
        g.replay()
        for i, buf in g.static.items():  # a step that writes a moving input writes the caller's
            tensors[i].copy_(buf)
        return tree_unflatten([o.clone() if isinstance(o, torch.Tensor) else o for o in g.outputs[0]], g.outputs[1])

    def _note_places(self, tensors: dict) -> None:
        for i, t in tensors.items():
            seen = self.places.get(i)
            if seen is None and self.calls == 1:
                self.places[i] = _Place(t)
            elif seen is not None and not seen.holds(t):
                del self.places[i]

    def _note_moves(self, tensors: dict) -> None:
        """An input read in place that moves: once (a cache handed over anew) it captures
        another graph; a second time it is taken to move from call to call (an input held
        through the warm-up, made anew at each call since), and goes through a static buffer
        from then on, so that graphs stay few."""
        for i, t in tensors.items():
            at = self.places.get(i)
            if at is not None and not at.holds(t):
                self.moves[i] = self.moves.get(i, 0) + 1
                if self.moves[i] > 1:
                    del self.places[i]
                else:
                    self.places[i] = _Place(t)

    def _fixed(self, tensors: dict) -> set:
        """The inputs read where they live: kept their address through the warm-up, share
        storage with another input (a copy would break the aliasing), or overlap themselves."""
        # an input whose elements share memory (an expanded mask) cannot be copied into a
        # buffer of its strides, nor written: read where it lives too
        fixed = {i for i, t in tensors.items() if i in self.places or torch._debug_has_internal_overlap(t) != 0}
        storages: dict = {}
        for i, t in tensors.items():
            storages.setdefault(t.untyped_storage().data_ptr(), []).append(i)
        for group in storages.values():
            if len(group) > 1:
                fixed.update(group)
        return fixed

    def _key(self, flat, tensors, spec) -> tuple:
        fixed = self._fixed(tensors)
        parts = []
        for i, x in enumerate(flat):
            if i in tensors:
                t = tensors[i]
                parts.append((tuple(t.shape), t.stride(), t.dtype, str(t.device), t.storage_offset(),
                              t.data_ptr() if i in fixed else None))
            else:
                parts.append(("value", repr(x)))
        return (repr(spec), tuple(parts))

    def _capture(self, flat, tensors, spec) -> _Graph:
        fixed = self._fixed(tensors)
        static = {i: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
                  for i, t in tensors.items() if i not in fixed}
        call = list(flat)
        for i, buf in static.items():
            call[i] = buf
        args, kwargs = tree_unflatten(call, spec)
        backend = self.backend or CudaGraphs()
        self.backend = backend
        inputs = [static.get(i, t) for i, t in tensors.items()]
        # a plan first met here builds its kernels, so they are captured; a region's own
        # graphs (``cudagraphs/region_graphs.py``) launch plainly into this one
        with compile_workers.paused(), region_graphs.suspended():
            replay, out, nbytes = backend.capture(lambda: self.step(*args, **kwargs), inputs)
        self.captures += 1
        return _Graph(replay, tree_flatten(out), static, nbytes)


def graphed(step, *, warmup: int = 2, backend=None) -> GraphedStep:
    """``step`` replayed as CUDA graphs, keeping every in-place update (module docstring)."""
    return GraphedStep(step, backend=backend, warmup=warmup)
