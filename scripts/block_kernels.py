"""Every kernel of one transformer-block fwd+bwd step through thunder+fuser, under Nsight
Compute, named by the fuser region that launched it (dev aid; GPU machine).

    ncu --nvtx --print-nvtx-rename kernel --profile-from-start off --csv --page raw \\
        --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\\
sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size,\\
launch__registers_per_thread python scripts/block_kernels.py > k.csv
    python scripts/block_kernels.py --table k.csv

Options of the profiled run: ``--sdpa`` (thunder's sdpa executor takes the attention, as in
the suite's "with sdpa_ex" block), ``--contender KIND`` (a contender of ``benchmarks.run``
other than thunder+fuser, e.g. torch.compile, to read its kernels beside ours).

Each region call is an NVTX range (``fuserN``) so that ncu renames its kernels; the step
is profiled after a warm one (compiles and plans happen outside the profile)."""
import csv
import sys


def table(path: str) -> None:
    rows = list(csv.DictReader(line for line in open(path) if line.startswith('"')))
    rows = [r for r in rows if r.get("ID", "").isdigit()]
    total = 0.0
    print(f"{'kernel':60s} {'us':>8s} {'DRAM%':>6s} {'SM%':>5s} {'grid':>8s} {'block':>6s} {'regs':>5s}")
    for r in rows:
        us = float(r["gpu__time_duration.sum"].replace(",", "")) / 1e3  # ns, with thousands separators
        total += us
        print(f"{r['Kernel Name'][:60]:60s} {us:8.1f} {r['dram__throughput.avg.pct_of_peak_sustained_elapsed']:>6.6s} "
              f"{r['sm__throughput.avg.pct_of_peak_sustained_elapsed']:>5.5s} {r['launch__grid_size']:>8s} "
              f"{r['launch__block_size']:>6s} {r['launch__registers_per_thread']:>5s}")
    print(f"{len(rows)} kernels, {total / 1e3:.3f} ms under ncu's clocks")


def main(argv):
    import thunder_fuser  # noqa: F401
    import torch

    from benchmarks.run import _block_contender
    from benchmarks.workloads import TransformerBlock
    from thunder_fuser.runtime.region_runner import RegionRunner

    orig = RegionRunner.__call__

    def named(self, *args):
        torch.cuda.nvtx.range_push(self.region.name)
        try:
            return orig(self, *args)
        finally:
            torch.cuda.nvtx.range_pop()

    RegionRunner.__call__ = named
    torch.manual_seed(0)
    block = TransformerBlock().cuda().to(torch.bfloat16)
    x = torch.randn(8, 1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kind = argv[argv.index("--contender") + 1] if "--contender" in argv else "thunder+fuser"
    step = _block_contender(kind, block, ("sdpa",) if "--sdpa" in argv else ())
    step(x)
    step(x)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    step(x)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    table(sys.argv[2]) if sys.argv[1:2] == ["--table"] else main(sys.argv[1:])
