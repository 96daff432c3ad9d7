"""Peak memory of an in-place LeakyReLU on a 1 x 4096 x 4096 x 64 float16 tensor (2 GiB).

    python tools/inplace_memory.py            # the direct call
    python tools/inplace_memory.py NHWC       # the checked call (a layout is named)

The tensor is filled in chunks (no float64 copy of it ever exists), then the peak resident set
size is read before and after `leaky_relu(x, out=x)`: in place means no second tensor."""
import resource
import sys
import time

import numpy as np

import opkit


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    layout = sys.argv[1] if len(sys.argv) > 1 else None
    lr = opkit.get("leaky_relu")
    lr(np.ones(4, np.float16))  # built and loaded before measuring
    before = peak_mib()
    x = np.empty((1, 4096, 4096, 64), np.float16)
    flat = x.reshape(-1)
    rng = np.random.default_rng(0)
    chunk = 1 << 22
    for i in range(0, flat.size, chunk):
        flat[i:i + chunk] = rng.standard_normal(min(chunk, flat.size - i), dtype=np.float32)
    probe = flat[:1 << 20].astype(np.float32)
    filled = peak_mib()
    t0 = time.perf_counter()
    y = lr(x, out=x, layout=layout) if layout else lr(x, out=x)
    seconds = time.perf_counter() - t0
    after = peak_mib()
    assert y is x
    want = np.where(probe > 0, probe, np.float32(0.2) * probe).astype(np.float16)
    assert np.array_equal(flat[:1 << 20], want)
    print(f"tensor {x.nbytes / 2 ** 30:.2f} GiB; peak RSS {before:.0f} MiB before it, "
          f"{filled:.0f} MiB filled, {after:.0f} MiB after the in-place call "
          f"(+{after - filled:.0f} MiB); {seconds:.2f} s, {2 * x.nbytes / seconds / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
