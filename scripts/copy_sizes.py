"""Device-to-device copy bandwidth at the byte counts of the suite's workloads (dev aid; GPU
machine): the suite's reference copy uses 256 MiB and 1 GiB buffers, where a 35 us
workload such as RoPE Mistral-7B (86 MB moved) pays a launch ramp and a tail that a
1 GiB copy amortizes. Bytes are read plus written, as in ``benchmarks.run.copy_bandwidth``."""
import torch

from benchmarks.timing import device_ms


def main():
    # MiB per buffer: RoPE Mistral-7B and Llama-3-8B, gelu/softmax, rotate-half, the suite's two
    for mib in (41, 81, 64, 128, 256, 1024):
        _row(mib * 2**20 // 4)
    _row(268_375_000)  # 1 GiB less 60 KB: a size that is not a multiple of a large power of two


def _row(n: int) -> None:
    a = torch.randn(n, device="cuda")
    b = torch.empty_like(a)
    ms, _ = device_ms(lambda: b.copy_(a), [()], reps=50)
    print(f"copy of {n * 4 / 2**20:8.1f} MiB: {ms * 1e3:7.1f} us, {2 * n * 4 / ms / 1e9:.2f} TB/s (read + written)")


if __name__ == "__main__":
    main()
