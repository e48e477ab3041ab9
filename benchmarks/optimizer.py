"""The optimizer step alone, measured as the seed measured it (thunder's "Add
``prims.copy_to_out_``": an Adam step, eager against ``torch.compile(adam.step, backend=thunder)``):

    python -m benchmarks.optimizer --out DIR [--models Llama-3.2-1B,hf-GPT2] [--master fp32]

Every contender steps torch's ``AdamW`` (lr 1e-3, weight decay 0.1) over the parameters of a
whole zoo model at its full depth (``--layers``), bf16 parameters and moments:

* ``eager``: torch's default (``foreach`` on CUDA), ``eager fused``: ``fused=True``;
* ``torch.compile``: ``torch.compile(opt.step)`` (Inductor);
* ``thunderfx``: ``torch.compile(opt.step, backend=ThunderCompiler())``, thunder's default executors;
* ``thunderfx+fuser``: the same with ``executors=thunder_fuser.executors()``;
* ``thunder.jit+fuser``: ``thunder.jit(opt.step, executors=thunder_fuser.executors())``, the
  README's call (``thunder_fuser/optimizers/``: torch's host part on the host, the updates
  traced; with ``--master fp32`` the copies around it stay torch's).

Each contender steps its own copy of the parameters with the same gradients. Its first step
(compile included) and two more run first; after them every contender's parameters and
moments are checked against ``eager``'s (bf16 rounding apart). Then the contenders take turns
(``--rounds`` rounds of ``--steps`` steps each, queued as a training loop queues them) and a
step's time is the median between CUDA events. The bytes a step must move (parameters,
moments read and written, gradients read) over a device-to-device copy's bandwidth measured in
the same run give the limit a step is compared with. One step runs under torch.profiler (GPU
kernels and their time), and the memory a step allocates beyond what it holds is its extra.

``--master fp32``: the mixed-precision recipe instead: the model's parameters and gradients
bf16, the optimizer's own parameters (master weights) and moments fp32; a step copies the
gradients into the masters' fp32 gradients, steps, and copies the masters back into the
model's bf16 parameters. The whole step function is what each contender compiles.

On a machine without a GPU, ``--tiny`` runs the same steps on the CPU (tiny models, the
eager and thunder contenders; its timings mean nothing). Writes ``optimizer.json`` and prints
a table last.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import traceback

import torch

from benchmarks import cli

CONTENDERS = ("eager", "eager fused", "torch.compile", "thunderfx", "thunderfx+fuser", "thunder.jit+fuser")
TINY_CONTENDERS = ("eager", "thunderfx", "thunderfx+fuser", "thunder.jit+fuser")
MODELS = {"Llama-3.2-1B": 16, "hf-GPT2": 12}  # name -> full depth
LR, WEIGHT_DECAY = 1e-3, 0.1


def _model_parameters(name: str, layers: int, tiny: bool, device) -> list[torch.Tensor]:
    """The distinct parameters of zoo model ``name``, bf16, as plain tensors on ``device``."""
    from benchmarks import model_zoo

    built = model_zoo.build(name, layers, tiny, device, torch.bfloat16, made_on_device=True)
    return [p.detach() for p in built.module.parameters()]


class Stepper:
    """One contender: its parameters (and masters), its optimizer, its compiled step."""

    def __init__(self, kind: str, params: list, grads: list, master: str):
        self.kind, self.master = kind, master
        self.params = [torch.nn.Parameter(p.clone()) for p in params]
        for p, g in zip(self.params, grads):
            p.grad = g
        if master == "fp32":
            self.masters = [torch.nn.Parameter(p.detach().float()) for p in self.params]
            for m in self.masters:
                m.grad = torch.empty_like(m)
            stepped = self.masters
        else:
            stepped = self.params
        flags = {"fused": True} if kind == "eager fused" else {}
        self.opt = torch.optim.AdamW(stepped, lr=LR, weight_decay=WEIGHT_DECAY, **flags)
        self.step = self._compiled(self._step_function())

    def _step_function(self):
        opt_step = self.opt.step
        if self.kind == "thunder.jit+fuser":
            import thunder

            import thunder_fuser

            opt_step = self.jitted = thunder.jit(self.opt.step, executors=thunder_fuser.executors())
        if self.master != "fp32":
            return opt_step
        params, masters = self.params, self.masters

        @torch.no_grad()
        def step():
            torch._foreach_copy_([m.grad for m in masters], [p.grad for p in params])
            opt_step()
            torch._foreach_copy_([p.data for p in params], masters)

        return step

    def _compiled(self, fn):
        if self.kind.startswith("eager") or self.kind == "thunder.jit+fuser":
            return fn
        if self.kind == "torch.compile":
            return torch.compile(fn)
        from thunder.dynamo import ThunderCompiler

        import thunder_fuser

        executors = thunder_fuser.executors() if self.kind == "thunderfx+fuser" else None
        self.backend = ThunderCompiler(executors=executors) if executors else ThunderCompiler()
        return torch.compile(fn, backend=self.backend)

    def tensors(self) -> list:
        """What a step leaves that every contender must agree on: parameters, then moments."""
        state = [s[k] for s in self.opt.state.values() for k in ("exp_avg", "exp_avg_sq")]
        return list(self.params) + state

    def held_bytes(self) -> int:
        """What this contender holds between steps, by its tensors' storages: its parameters,
        its masters and their gradients (``--master fp32``), and the optimizer's state (the
        model's gradients, which every contender is handed, not counted)."""
        tensors = list(self.params) + [s for state in self.opt.state.values() for s in state.values()
                                       if isinstance(s, torch.Tensor)]
        if self.master == "fp32":
            tensors += [t for m in self.masters for t in (m, m.grad)]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(storages.values())

    def regions(self) -> int | None:
        """Our regions in what thunder ran (``thunderfx+fuser``, ``thunder.jit+fuser``), else ``None``."""
        if self.kind not in ("thunderfx+fuser", "thunder.jit+fuser"):
            return None
        import thunder

        fns = ([self.jitted] if self.kind == "thunder.jit+fuser" else
               [f for info in self.backend.subgraph_infos for f in info.thunder_compiled_fns])
        traces = [thunder.last_traces(f)[-1] for f in fns]
        return sum(1 for t in traces for b in t.bound_symbols if b.sym.name.startswith("fuser"))


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _bytes_per_step(params: list, master: str) -> int:
    """What a step must read and write: per parameter its value, both moments (read and
    written) and its gradient (read); with fp32 masters the model's bf16 gradient is read and
    its bf16 parameter written besides the fp32 master, moments and master gradient."""
    n = sum(p.numel() for p in params)
    if master == "fp32":
        return n * (2 + 4 * 2 + 4 * 2 * 2 + 2)  # bf16 grad read, master r/w, moments r/w, bf16 param written
    return n * 2 * 7


def _copy_tb_s(device, nbytes: int = 1 << 30) -> float | None:
    """TB/s of a device-to-device copy (bytes read plus written), median of 20."""
    if device.type != "cuda":
        return None
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(25):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    del a, b
    return 2 * nbytes / (statistics.median(times[5:]) * 1e-3) / 1e12


def _time_steps(stepper: Stepper, steps: int, device) -> list[float]:
    """Milliseconds of each of ``steps`` steps queued back to back (events on the GPU, the
    wall clock on the CPU)."""
    if device.type != "cuda":
        out = []
        for _ in range(steps):
            t0 = time.perf_counter()
            stepper.step()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    pairs = []
    for _ in range(steps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        stepper.step()
        e.record()
        pairs.append((s, e))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in pairs]


def _profile(stepper: Stepper, device) -> dict:
    """GPU kernels of one step and their total time (us)."""
    if device.type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile

    _sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        stepper.step()
        _sync(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"kernels": len(kernels), "gpu_ms": round(sum(e.device_time for e in kernels) / 1e3, 3)}


def _extra_bytes(stepper: Stepper, device) -> int | None:
    """Bytes a step allocates above what is allocated before it (temporaries)."""
    if device.type != "cuda":
        return None
    _sync(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    stepper.step()
    _sync(device)
    return torch.cuda.max_memory_allocated(device) - before


def _mismatch(ours: Stepper, ref: Stepper) -> str | None:
    """Where ``ours`` differs from ``ref`` beyond bf16 rounding, else ``None``."""
    a, b = ours.tensors(), ref.tensors()
    if len(a) != len(b):
        return f"{len(a)} tensors against {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        x, y = x.float(), y.float()
        err = ((x - y).abs() - 1e-3 - 2e-2 * y.abs()).max().item()
        if err > 0:
            what = "parameter" if i < len(ours.params) else "moment"
            return f"{what} {i} {tuple(x.shape)} off by {err:.3g} beyond bf16 rounding"
    return None


def run_model(name: str, layers: int, contenders, a, device) -> dict:
    params = _model_parameters(name, layers, a.tiny, device)
    g = torch.Generator(device=device).manual_seed(0)
    grads = [torch.randn(p.shape, generator=g, device=device, dtype=p.dtype) * 1e-2 for p in params]
    nbytes = _bytes_per_step(params, a.master)
    res = {"model": name, "layers": layers, "parameters": sum(p.numel() for p in params), "tensors": len(params),
           "master": a.master, "bytes_per_step": nbytes, "contenders": {}}
    steppers = {}
    for kind in contenders:
        row = res["contenders"][kind] = {}
        try:
            s = Stepper(kind, params, grads, a.master)
            _sync(device)
            t0 = time.perf_counter()
            s.step()
            _sync(device)
            row["first_step_s"] = round(time.perf_counter() - t0, 2)
            t0 = time.perf_counter()
            s.step()
            _sync(device)
            row["second_step_s"] = round(time.perf_counter() - t0, 3)
            s.step()
            steppers[kind] = s
        except Exception as e:  # noqa: BLE001 - a contender that fails says why in its row
            row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            traceback.print_exc()
        print(f"{name} {kind}: {row}", flush=True)
    ref = steppers.get("eager")
    for kind, s in list(steppers.items()):
        if ref is not None and s is not ref:
            bad = _mismatch(s, ref)
            if bad:
                res["contenders"][kind]["error"] = f"wrong after 3 steps: {bad}"
                del steppers[kind]
    times = {k: [] for k in steppers}
    for _ in range(a.rounds):
        for kind, s in steppers.items():
            times[kind] += _time_steps(s, a.steps, device)
    for kind, s in steppers.items():
        row = res["contenders"][kind]
        row["step_ms"] = round(statistics.median(times[kind]), 3)
        row.update(_profile(s, device))
        row["extra_bytes"] = _extra_bytes(s, device)
        row["held_bytes"] = s.held_bytes()
        row["regions"] = s.regions()
    return res


def _limits(res: dict, copy: float | None) -> None:
    """Each step against the copy-bandwidth limit of its bytes."""
    if copy is None:
        return
    limit = res["bytes_per_step"] / (copy * 1e12) * 1e3
    res["limit_ms"] = round(limit, 3)
    for row in res["contenders"].values():
        if "step_ms" in row:
            row["x_limit"] = round(row["step_ms"] / limit, 2)


def _first_two(row: dict):
    """The first two steps' seconds: compile time wherever it lands (``thunder.jit+fuser``'s
    first step is torch's own, building the state; its second traces and compiles)."""
    if "second_step_s" not in row:
        return row.get("first_step_s", "")
    return round(row["first_step_s"] + row["second_step_s"], 2)


def table(doc: dict) -> str:
    lines = [f"{doc['device']}; torch {doc['torch']}; the copy limit of each model's bytes at the copy bandwidth "
             f"measured in its run", "",
             "| model | params | master | contender | step ms | x copy limit | GPU ms | kernels | extra MiB "
             "| held MiB | regions | first two steps s | error |", "|" + " --- |" * 13]
    for res in doc["results"]:
        for kind, row in res["contenders"].items():
            extra, held = row.get("extra_bytes"), row.get("held_bytes")
            lines.append(" | ".join(str(x) for x in (
                f"| {res['model']} ({res['layers']} layers, {res['tensors']} tensors)"
                + (f", {res['run']}" if "run" in res else ""),
                f"{res['parameters'] / 1e6:.0f}M", res["master"], kind, row.get("step_ms", ""),
                row.get("x_limit", ""), row.get("gpu_ms", ""), row.get("kernels", ""),
                "" if extra is None else round(extra / 2**20, 1), "" if held is None else round(held / 2**20, 1),
                row.get("regions") or "",
                _first_two(row), row.get("error", ""))) + " |")
        if "limit_ms" in res:
            lines.append(f"| {res['model']} copy limit ({res.get('copy_tb_s', doc['copy_tb_s'])} TB/s) | | | | "
                         f"{res['limit_ms']} | 1.0 | | | | | | | |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = cli.parser(__name__, __doc__)
    ap.add_argument("--out", default="benchmarks/results", help="folder for optimizer.json")
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated zoo models, each at its full depth ({MODELS})")
    ap.add_argument("--layers", type=int, help="layers of every model (default: each model's full depth)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated, of: " + ", ".join(CONTENDERS))
    ap.add_argument("--master", choices=("none", "fp32"), default="none",
                    help="fp32: fp32 master weights and moments for bf16 parameters")
    ap.add_argument("--steps", type=int, default=10, help="steps per turn")
    ap.add_argument("--rounds", type=int, default=3, help="turns of every contender")
    ap.add_argument("--tiny", action="store_true", help="the CPU smoke test: tiny models, " + ", ".join(TINY_CONTENDERS))
    a = ap.parse_args(argv)
    if not a.tiny:
        cli.require_cuda(__name__, "--tiny runs the CPU smoke test.")
    device = torch.device("cpu" if a.tiny else "cuda")
    contenders = TINY_CONTENDERS if a.tiny and a.contenders == ",".join(CONTENDERS) else a.contenders.split(",")
    import thunder_fuser  # noqa: F401  (torch compat stubs before thunder)

    copy = _copy_tb_s(device)
    doc = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "copy_tb_s": None if copy is None else round(copy, 3), "results": []}
    os.makedirs(a.out, exist_ok=True)
    suffix = "" if a.master == "none" else f"-master-{a.master}"
    for name in a.models.split(","):
        res = run_model(name, a.layers or MODELS.get(name, 2), contenders, a, device)
        _limits(res, copy)
        res["copy_tb_s"] = doc["copy_tb_s"]
        doc["results"].append(res)
        with open(os.path.join(a.out, f"optimizer{suffix}.json"), "w") as f:  # each model's as it ends
            json.dump(doc, f, indent=1)
        print(table(dict(doc, results=[res])), flush=True)
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(table(doc))


if __name__ == "__main__":
    main()
