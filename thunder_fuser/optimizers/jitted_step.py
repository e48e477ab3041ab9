"""``thunder.jit(optimizer.step, executors=...)`` for torch's ``Adam``, ``AdamW`` and ``SGD``.

thunder's interpreter cannot trace torch's ``step``: its state is a dict keyed by parameter
(a proxy finds nothing there and a first step's state would be built inside the trace), and
it reads the step count on the host (thunder issues 1055 and 1057). So the step is split
where torch splits it:

* on the host, as torch does: the optimizer's hooks, the closure, the step counters
  (``state["step"] += 1``, mirrored on the host: ``step_counts.py``) and what torch computes
  from them in double (bias corrections, ``1 - lr * weight_decay``, ``-lr / bias_correction1``),
  written into a few 0-d tensors on the parameters' device;
* through ``thunder.jit`` with the caller's executors: every parameter's and state tensor's
  update of a param group (``optimizers/updates.py``), one trace for the group, each write
  in place into the optimizer's own tensors.

A learning rate a schedule changes, a new step count: new numbers in that tensor, never a
new trace. What this cannot run as torch would runs as torch's own step, for that call only
(``eager_steps`` counts them): a step where a parameter has no state yet (the first: torch
builds the state, as it would), sparse or complex gradients, ``capturable`` or
``differentiable``, a step inside a CUDA graph's capture, tensor betas, a group whose
parameters are on several devices or of fp64 and other dtypes mixed. Parameters of a group at different step counts (one had no
gradient in a step) are updated in one call per count.

A step of a small model is bound by the host, so each per-step walk over the tensors
counts: the counts are read and written through a host view of them (``step_counts.py``),
and the update's calls after the first go past thunder's per-call cache lookup to the
cached computation while a guard of every tensor's metadata holds (``GuardedCall``).
GPT-2's AdamW (148 tensors), in two runs on H200 hosts (whose speed varies): 2.07 -> 1.41
ms a step queued, of which the update call 0.99 -> 0.73 (``scripts/optimizer_step_host.py``).
"""

from __future__ import annotations

import inspect
import weakref
from itertools import chain
from operator import attrgetter

import torch
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from thunder_fuser.optimizers import updates
from thunder_fuser.optimizers.step_counts import GroupCounts, TensorMirror
from thunder_fuser.runtime.guarded_call import GuardedCall

_DEVICE, _DTYPE, _LAYOUT = attrgetter("device"), attrgetter("dtype"), attrgetter("layout")
_ADAM_STEP = inspect.unwrap(torch.optim.Adam.step)
_SGD_STEP = inspect.unwrap(torch.optim.SGD.step)


def optimizer_of(step) -> torch.optim.Optimizer | None:
    """The optimizer whose ``step`` this is: a bound ``step``, or the wrapper an lr
    scheduler puts over ``opt.step`` (it holds the optimizer by a weak reference)."""
    opt = getattr(step, "__self__", None)
    if opt is None and getattr(step, "_wrapped_by_lr_sched", False):
        for cell in step.__closure__ or ():
            ref = cell.cell_contents
            if isinstance(ref, weakref.ref) and isinstance(ref(), torch.optim.Optimizer):
                opt = ref()
    return opt if isinstance(opt, torch.optim.Optimizer) and getattr(step, "__name__", None) == "step" else None


def kind_of(opt: torch.optim.Optimizer | None) -> str | None:
    """"adam" or "sgd" for an optimizer whose ``step`` is torch's own (a subclass that keeps
    it: ``AdamW`` is one), else None (thunder traces it as it would)."""
    if opt is None:
        return None
    return {_ADAM_STEP: "adam", _SGD_STEP: "sgd"}.get(inspect.unwrap(type(opt).step))


class JittedOptimizerStep:
    """A torch optimizer's ``step`` whose updates run through ``thunder.jit``; call it as the
    step. ``last_traces``/``thunder.last_traces(it)`` show the update's trace."""

    def __init__(self, optimizer: torch.optim.Optimizer, kind: str, jit, **jit_kwargs):
        self.optimizer, self.kind = optimizer, kind
        self.update = jit(updates.adam if kind == "adam" else updates.sgd, **jit_kwargs)
        # thunder.last_traces(step) and compile_stats read these
        self._lc_cd, self._lc_cs = getattr(self.update, "_lc_cd", None), getattr(self.update, "_lc_cs", None)
        # the update's calls past thunder's per-call lookup of its hundreds of tensors, where that is safe
        self.guarded_update = GuardedCall(self.update)
        self.eager_steps = self.jitted_steps = 0
        self._scalars: dict = {}  # (group, device, dtype, count) -> the scalars' tensors there
        self._staging: dict = {}  # the same keys -> the pinned buffers their numbers come from (GPU)
        self._counts: dict = {}  # id(group) -> its step counts as the host last left them
        self._mirror = TensorMirror()  # each step tensor's count, for a group's new view

    def __call__(self, closure=None):
        opt = self.optimizer
        args, kwargs = (opt,), ({"closure": closure} if closure is not None else {})
        for hook in chain(_global_optimizer_pre_hooks.values(), opt._optimizer_step_pre_hooks.values()):
            result = hook(opt, args, kwargs)
            if result is not None:
                args, kwargs = result
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            calls = [self._group_call(group) for group in opt.param_groups]
            if any(c is False for c in calls):
                self._torch_step()
                self.eager_steps += 1
            else:
                for call in calls:
                    if call is not None:
                        call()
                self.jitted_steps += 1
        opt._opt_called = True  # what an lr scheduler's wrapper of ``opt.step`` would mark
        opt._optimizer_step_code()
        for hook in chain(opt._optimizer_step_post_hooks.values(), _global_optimizer_post_hooks.values()):
            hook(opt, args, kwargs)
        return loss

    def _torch_step(self) -> None:
        """torch's own step, without its hooks (they ran) and its closure (evaluated)."""
        step = type(self.optimizer).step
        inner = step.__wrapped__ if getattr(step, "hooked", False) else step
        inner(self.optimizer)

    def _group_call(self, group: dict):
        """A call running ``group``'s update through thunder; None where no parameter has a
        gradient, False where this step must be torch's own."""
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return None
        if group.get("differentiable") or group.get("capturable"):
            return False
        if params[0].is_cuda and torch.cuda.is_current_stream_capturing():
            return False  # a graph would keep this step's numbers: torch's step says what it needs
        grads = [p.grad for p in params]
        # the kinds of tensors met, one C-level pass each (a step checks hundreds of them)
        dtypes, grad_dtypes = set(map(_DTYPE, params)), set(map(_DTYPE, grads))
        if set(map(_LAYOUT, grads)) != {torch.strided} or any(d.is_complex for d in dtypes | grad_dtypes):
            return False  # sparse or complex gradients, complex parameters
        if len(set(map(_DEVICE, params))) != 1 or len({updates.math_dtype(d) for d in dtypes}) != 1:
            return False  # several devices, fp64 beside fp32
        states = list(map(self.optimizer.state.get, params))
        if self.kind == "adam":
            return self._adam_call(group, params, grads, states)
        return self._sgd_call(group, params, grads, states)

    def _adam_call(self, group, params, grads, states):
        beta1, beta2 = group["betas"]
        if isinstance(beta1, torch.Tensor) or isinstance(beta2, torch.Tensor):
            return False
        amsgrad = group["amsgrad"]
        try:
            steps = [s["step"] for s in states]
            moments = ([s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                       [s["max_exp_avg_sq"] for s in states] if amsgrad else [])
        except (KeyError, TypeError):  # a state without them, or none (None): torch builds it
            return False
        lr, wd, fused = _number(group["lr"]), group["weight_decay"], bool(group.get("fused"))
        decoupled = bool(group.get("decoupled_weight_decay", isinstance(self.optimizer, torch.optim.AdamW)))
        constants = dict(beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=wd, decoupled=decoupled,
                         amsgrad=amsgrad, maximize=group["maximize"], fused=fused)
        # parameters at one step count share their scalars and their trace: a parameter that
        # had no gradient in some step is a count behind the others from then on
        calls = []
        counts = self._group_counts(group, steps)
        by_count = counts.by_count()
        for k, (step, members) in enumerate(sorted(by_count.items())):
            step += 1
            bc1, bc2 = 1 - beta1 ** step, 1 - beta2 ** step
            if fused:  # fused_adam_utils.cuh: param -= lr * wd * param; param -= lr / bc1 * m / denom
                values = (lr * wd, lr / bc1, bc2 ** 0.5)
            else:  # _single_tensor_adam: param.mul_(1 - lr * wd); param.addcdiv_(m, denom, value=-lr / bc1)
                values = (1 - lr * wd, -(lr / bc1), bc2 ** 0.5)
            scalars = self._scalars_on((id(group), k), params[members[0]], values)
            if len(by_count) == 1:  # the common case: every parameter at one count
                lists = (params, grads, *moments)
            else:
                lists = tuple([xs[i] for i in members] if xs else [] for xs in (params, grads, *moments))
            calls.append((lists, scalars))

        def call():
            counts.count()
            for lists, scalars in calls:
                self.guarded_update(*lists, scalars, **constants)

        return call

    def _sgd_call(self, group, params, grads, states):
        momentum = group["momentum"]
        buffers = [s.get("momentum_buffer") if s else None for s in states] if momentum != 0 else []
        if momentum != 0 and any(b is None for b in buffers):
            return False  # a first step: torch makes the buffers from the gradients
        scalars = self._scalars_on(id(group), params[0], (-_number(group["lr"]),))
        constants = dict(momentum=momentum, dampening=group["dampening"], weight_decay=group["weight_decay"],
                         nesterov=group["nesterov"], maximize=group["maximize"])

        def call():
            self.guarded_update(params, grads, buffers, scalars, **constants)

        return call

    def _group_counts(self, group: dict, steps: list) -> GroupCounts:
        """``group``'s step counts: the view the last step left while it holds (nothing read),
        else a new one (``step_counts.py``)."""
        counts = self._counts.get(id(group))
        if counts is None or not counts.holds(steps):
            if counts is not None:
                counts.retire()
            counts = self._counts[id(group)] = GroupCounts(steps, self._mirror)
        return counts

    def _scalars_on(self, owner, param, values: tuple) -> list:
        """``values`` in ``param``'s math dtype as 0-d tensors on its device, kept from call to
        call for ``owner`` (a group, or a group's parameters at one step count: the trace
        reads the same tensors; only their numbers change).
        Separate tensors, not one vector: slices of a vector in the trace made its first
        kernel a resize of its own. On a GPU the numbers travel from pinned memory
        (``_Staging``): a copy from pageable memory may hold the host until the stream
        reaches it, so the host could not queue the update while the backward still runs."""
        dtype = updates.math_dtype(param.dtype)
        key = (owner, param.device, dtype, len(values))
        host = torch.tensor(values, dtype=torch.float64).to(dtype)
        kept = self._scalars.get(key)
        if kept is None:
            kept = self._scalars[key] = [torch.empty((), dtype=dtype, device=param.device) for _ in values]
        if param.device.type != "cuda":
            torch._foreach_copy_(kept, list(host.unbind()))
            return kept
        staging = self._staging.get(key)
        if staging is None:
            staging = self._staging[key] = _Staging(host)
        staging.copy(host, kept, torch.cuda.current_stream(param.device))
        return kept


class _Staging:
    """Pinned host buffers that a step's scalars are copied to the GPU from, a few in turn;
    a buffer is written again only once the copy that read it has run (its event), so a
    host running steps ahead of the GPU never changes numbers a queued copy still reads."""

    SLOTS = 4

    def __init__(self, like: torch.Tensor):
        self.buffers = [torch.empty_like(like).pin_memory() for _ in range(self.SLOTS)]
        self.events = [torch.cuda.Event() for _ in range(self.SLOTS)]  # unrecorded: synchronize returns
        self.next = 0

    def copy(self, values: torch.Tensor, out: list, stream) -> None:
        i, self.next = self.next, (self.next + 1) % self.SLOTS
        self.events[i].synchronize()
        self.buffers[i].copy_(values)
        torch._foreach_copy_(out, list(self.buffers[i].unbind()), non_blocking=True)
        self.events[i].record(stream)


def _number(x) -> float:
    """A hyperparameter as the host computes with it (torch's single-tensor step squeezes a
    tensor learning rate; its arithmetic with Python numbers is the same in double)."""
    return float(x) if isinstance(x, torch.Tensor) else x
