"""Nearest 2x upsampling + 3x3 convolution, as PyTorch runs it and folded into phase
convolutions (opkit/torch/resize.py): eval forward and a training step (forward and the
gradients of the input and the weights), batch 64, channels_last float32, the three shapes of
the GAN example's full-size generator.

    python tools/upsampling_fold.py            # one thread, CPU time: the table in docs/torch.md
    python tools/upsampling_fold.py 2          # two threads, wall time

Rounds alternate the two forms; the figures are medians of the rounds' times in milliseconds."""
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from opkit.torch.resize import ResizeConv2d

SHAPES = [(128, 4, 64), (64, 8, 32), (32, 16, 1)]  # channels in, H = W before upsampling, out


def main(threads: int = 1, rounds: int = 9, batch: int = 64) -> None:
    torch.set_num_threads(threads)
    clock = time.process_time if threads == 1 else time.perf_counter
    cl = torch.channels_last
    print("| input → output | eval: PyTorch | eval: folded | training step: PyTorch | "
          "training step: folded |")
    print("| --- | --- | --- | --- | --- |")
    for c, h, o in SHAPES:
        x = torch.randn(batch, c, h, h).contiguous(memory_format=cl)
        conv = nn.Conv2d(c, o, 3, padding=1, bias=False).to(memory_format=cl)
        folded = ResizeConv2d(conv, 2)
        xg = x.clone().requires_grad_()
        dy = torch.randn(batch, o, 2 * h, 2 * h).contiguous(memory_format=cl)

        def plain(t):
            return conv(F.interpolate(t, scale_factor=2, mode="nearest"))

        cases = {}
        for name, fn in (("plain", plain), ("folded", folded)):
            cases["eval " + name] = lambda fn=fn: fn(x)
            cases["train " + name] = lambda fn=fn: torch.autograd.grad(fn(xg), [xg, conv.weight], dy)
        times = {k: [] for k in cases}
        for r in range(rounds + 1):
            for k in (cases if r % 2 else reversed(list(cases))):
                with torch.no_grad() if k.startswith("eval") else torch.enable_grad():
                    t0 = clock()
                    for _ in range(3):
                        cases[k]()
                    if r:  # the first round warms up
                        times[k].append((clock() - t0) / 3 * 1e3)
        ms = {k: statistics.median(v) for k, v in times.items()}
        print(f"| {c}×{h}×{h} → {o}×{2 * h}×{2 * h} | {ms['eval plain']:.2f} ms | "
              f"{ms['eval folded']:.2f} ms ({ms['eval plain'] / ms['eval folded']:.2f}×) | "
              f"{ms['train plain']:.1f} ms | {ms['train folded']:.1f} ms "
              f"({ms['train plain'] / ms['train folded']:.2f}×) |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
