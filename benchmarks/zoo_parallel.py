"""The zoo one model a GPU: ``benchmarks.zoo`` in a process per model, as many at once as
the machine has GPUs, each process seeing one GPU.

    python -m benchmarks.zoo_parallel --models Llama-3.2-1B,phi-2,hf-ViT [zoo options...]

Each model's contenders still share one process and one GPU (their turns interleave there);
models share nothing but the host, so a machine of eight GPUs runs eight models in the time
of one. Each process writes its ``zoo-<model>.json`` into ``--out`` and its output into
``zoo-<model>.log`` there; the table of every model that finished is printed last.
``--limit`` stops the models still running after that many seconds (what they wrote so far
stays: ``zoo-<model>.json.partial``) and starts no more; ``--bundle`` packs the folder's
results and logs into one ``.tar.gz`` (a machine that hands back few files).
``--per-gpu N`` runs N models on each GPU at once: a coverage run (does every model step,
and match eager?) whose timings are shared with the other models on that GPU, so read
none of them as a step's time.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import tarfile
import time

from benchmarks import cli


def main(argv=None) -> int:
    ap = cli.parser("benchmarks.zoo_parallel", __doc__)
    ap.add_argument("--models", required=True, help="comma-separated zoo models")
    ap.add_argument("--out", default="benchmarks/results", help="folder for zoo-<model>.json and .log")
    ap.add_argument("--gpus", type=int, help="processes at once (default: the GPUs torch sees)")
    ap.add_argument("--limit", type=float, help="seconds after which the running models stop and no more start")
    ap.add_argument("--per-gpu", type=int, default=1,
                    help="models at once on each GPU (default 1; more for a coverage run, whose timings are shared)")
    ap.add_argument("--bundle", help="a .tar.gz to pack every zoo-<model>.json, .json.partial and .log of --out into")
    a, rest = ap.parse_known_args(argv)
    if a.gpus is None:
        import torch

        a.gpus = max(1, torch.cuda.device_count())
    os.makedirs(a.out, exist_ok=True)
    waiting = a.models.split(",")
    running: dict[int, tuple[str, subprocess.Popen]] = {}
    codes: dict[str, int] = {}
    start = time.monotonic()
    while waiting or running:
        if a.limit is not None and time.monotonic() - start > a.limit:
            for slot, (name, proc) in running.items():
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                print(f"[gpu {slot % a.gpus}] {name} stopped at the {a.limit:g} s limit", flush=True)
                codes[name] = -9
            for name in waiting:
                print(f"{name} not started: the {a.limit:g} s limit", flush=True)
                codes[name] = -9
            running, waiting = {}, []
            break
        for slot in range(a.gpus * a.per_gpu):
            gpu = slot % a.gpus
            if slot not in running and waiting:
                name = waiting.pop(0)
                log = open(os.path.join(a.out, f"zoo-{name}.log"), "w")
                env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
                cmd = [sys.executable, "-m", "benchmarks.zoo", "--models", name, "--out", a.out, *rest]
                # a session of its own: at the limit its compile workers stop with it
                running[slot] = (name, subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                       start_new_session=True))
                print(f"[gpu {gpu}] {name} ...", flush=True)
        for slot, (name, proc) in list(running.items()):
            if proc.poll() is not None:
                codes[name] = proc.returncode
                print(f"[gpu {slot % a.gpus}] {name} exited {proc.returncode}", flush=True)
                del running[slot]
        time.sleep(1)
    from benchmarks.zoo import report

    results = []
    for name in a.models.split(","):
        path = os.path.join(a.out, f"zoo-{name}.json")
        if codes.get(name) == 0 and os.path.exists(path):
            with open(path) as f:
                results.append(json.load(f))
    print(report(results))
    if a.bundle:
        with tarfile.open(a.bundle, "w:gz") as tar:
            for path in sorted(glob.glob(os.path.join(a.out, "zoo-*"))):
                tar.add(path, arcname=os.path.basename(path))
    failed = [n for n, c in codes.items() if c != 0]
    if failed:
        print("failed (see their logs):", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
