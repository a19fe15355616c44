"""The device-copy bandwidth the GPU figures are set against: a 1 GiB device-to-device copy,
counted as read + write (2N / t), the median of 10 copies each timed between two CUDA events
after 3 untimed. Imported by the PyTorch scripts here (copy_bandwidth()); run alone it prints
one line. Usage: python3 bench/gpu/copy_bandwidth.py"""
import torch


def copy_bandwidth(n=1 << 30, runs=10):
    """Bytes a second: 2 n / the median time of one n-byte device-to-device copy."""
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(runs):
        e0.record(); dst.copy_(src); e1.record(); e1.synchronize(); ts.append(e0.elapsed_time(e1))
    return 2 * n / (sorted(ts)[runs // 2] * 1e-3)


if __name__ == "__main__":
    print(f"copy bandwidth {copy_bandwidth() / 1e9:.0f} GB/s (2N / t, 1 GiB, the median of 10 copies)")
