"""Device-to-device copy bandwidth by size (dev aid; GPU machine). The suite's reference
copy is the best of 256 MiB and 1 GiB buffers; a 35 us workload such as RoPE Mistral-7B
(82 MiB moved) pays a launch ramp and a tail that such a copy amortizes, and the suite
reads each large workload beside a copy of its own bytes too (``same_size_copy``)."""
from benchmarks.run import same_size_copy


def main():
    # MiB per buffer: RoPE Mistral-7B and Llama-3-8B, gelu/softmax, rotate-half, the suite's two
    for mib in (41, 81, 64, 128, 256, 1024):
        print(f"copy of {mib:5d} MiB: {same_size_copy(2 * mib * 2**20):.2f} TB/s (read + written)")
    # 1 GiB less 60 KB: a size that is not a multiple of a large power of two
    print(f"copy of 1023.9 MiB: {same_size_copy(2 * 268_375_000 * 4):.2f} TB/s")


if __name__ == "__main__":
    main()
