"""How many rows still gain from splitting across blocks (dev aid; GPU machine): products
summed per row, bf16, for row counts up to about the SM count, as row kernels (one block
per row) and by the split rule (``geometry.row_splits``; up to 66 rows split on an H100).
Prints ms beside eager and torch.compile, and the splits the rule takes; each result is
checked against eager."""
import thunder_fuser  # noqa: F401
import thunder
import torch

from benchmarks.timing import device_ms
from thunder_fuser import fuser_ex
from thunder_fuser.kernels import geometry

SHAPES = [(1, 2**24), (16, 2**20), (48, 2**20), (66, 2**20), (67, 2**20), (96, 2**19), (128, 2**18), (264, 2**17)]


def main():
    fn = lambda x, y: (x * y).sum(-1)  # noqa: E731
    print(f"{'rows x n':>14s} {'eager':>8s} {'compile':>8s} {'rows':>8s} {'rule':>8s} splits  (ms)")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for rows, n in SHAPES:
        args = tuple(torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        want = fn(*args)
        row = [device_ms(fn, [args])[0], device_ms(torch.compile(fn), [args])[0]]
        for least in (2**31, geometry.SPLIT_MIN):
            geometry.SPLIT_MIN = least
            f = thunder.jit(fn, executors=[fuser_ex])
            torch.testing.assert_close(f(*args), want, atol=3e-2, rtol=3e-2)
            row.append(device_ms(f, [args])[0])
        splits = geometry.row_splits(rows, n, 8, sms)[0]
        print(f"{f'{rows} x {n}':>14s}" + "".join(f" {x:8.4f}" for x in row) + f" {splits if splits >= least else '-':>6}")


if __name__ == "__main__":
    main()
