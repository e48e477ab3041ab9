"""Device-to-device copy bandwidth at the byte counts of the suite's workloads (dev aid; GPU
machine): the suite's reference copy uses 256 MiB and 1 GiB buffers, where a 35 us
workload such as RoPE Mistral-7B (86 MB moved) pays a launch ramp and a tail that a
1 GiB copy amortizes. Bytes are read plus written, as in ``benchmarks.run.copy_bandwidth``."""
import torch

from benchmarks.timing import device_ms


def main():
    for mb in (86, 134, 170, 268, 537, 2147):  # Mistral, gelu/softmax, Llama, rotate-half, rmsnorm, 1 GiB
        n = mb * 10**6 // 2 // 4  # fp32 elements per buffer
        a = torch.randn(n, device="cuda")
        b = torch.empty_like(a)
        ms, _ = device_ms(lambda: b.copy_(a), [()], reps=50)
        print(f"copy of {2 * n * 4 / 1e6:7.0f} MB moved: {ms * 1e3:7.1f} us, {2 * n * 4 / ms / 1e9:.2f} TB/s")
        del a, b


if __name__ == "__main__":
    main()
