"""opkit operators under DistributedDataParallel on CPU (gloo): `torchrun --nproc_per_node 2`
trains a small model for a few steps from an empty kernel cache shared by both processes. The
parameters agree across ranks and with one process training on both ranks' data, and each
kernel module was compiled once, by one rank, while the other waited at the cache's lock."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

TRAIN = textwrap.dedent("""\
    import faulthandler, json, os, sys
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    import opkit.torch
    from opkit.torch import nn as onn

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), onn.FusedBiasLeakyReLU(4),
                                   torch.nn.Conv2d(4, 2, 1), onn.LeakyReLU(0.1))

    def batches(rank, steps):
        g = torch.Generator().manual_seed(100 + rank)  # every rank its own data
        return [(torch.randn(4, 3, 8, 8, generator=g), torch.randn(4, 2, 8, 8, generator=g))
                for _ in range(steps)]

    def train(net, data):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for x, t in data:
            opt.zero_grad()
            ((net(x) - t) ** 2).mean().backward()
            opt.step()

    def flat(net):
        return torch.cat([p.detach().flatten() for p in net.parameters()])

    if __name__ == "__main__":
        faulthandler.enable()   # a crash prints where each thread was
        out, steps = sys.argv[1], int(sys.argv[2])
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        net = model()
        train(DistributedDataParallel(net), batches(rank, steps))
        params = flat(net)
        everyone = [torch.empty_like(params) for _ in range(world)]
        dist.all_gather(everyone, params)
        with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
            json.dump({"world": world, "params": params.tolist(),
                       "spread": max(float((p - params).abs().max()) for p in everyone)}, fh)
        dist.destroy_process_group()
        print(f"rank {rank} finished", flush=True)
        # Leave without the interpreter's teardown, where libtorch's threads were once seen to
        # abort both ranks ("terminate called without an active exception"); the line above
        # shows that each rank got here.
        os._exit(0)
    """)

# A compiler wrapper: it logs each module it links and holds the link until a second process
# has the cache's lock open (the other rank, waiting for this module), or gives up after 120 s.
CC = textwrap.dedent("""\
    #!/bin/sh
    case " $* " in *" -shared "*)
        waited=0
        while [ $waited -lt 1200 ]; do
            holders=0
            for fds in /proc/[0-9]*/fd; do
                if ls -l "$fds" 2>/dev/null | grep -q "$OPKIT_CACHE_DIR/.*\\.lock"; then
                    holders=$((holders + 1))
                fi
            done
            [ $holders -ge 2 ] && break
            sleep 0.1; waited=$((waited + 1))
        done
        state=alone; [ $waited -lt 1200 ] && state=contended
        echo "$state $*" >> "$OPKIT_TEST_LOG" ;;
    esac
    exec {real} "$@"
    """)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to see who waits at the lock")
def test_ddp_on_two_processes_shares_one_kernel_cache(tmp_path):
    steps = 3
    (tmp_path / "train.py").write_text(TRAIN)
    cc = tmp_path / "cc"
    cc.write_text(CC.format(real=shutil.which("gcc") or shutil.which("cc")))
    cc.chmod(0o755)
    env = dict(os.environ, OPKIT_CACHE_DIR=str(tmp_path / "cache"), CC=str(cc),
               OPKIT_TEST_LOG=str(tmp_path / "cc.log"), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    env.pop("OPKIT_PATH", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(tmp_path / "train.py"), str(tmp_path), str(steps)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert all(f"rank {k} finished" in r.stdout for k in range(2)), r.stdout[-3000:]

    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    assert all(rk["world"] == 2 for rk in ranks)
    assert ranks[0]["params"] == ranks[1]["params"] and ranks[0]["spread"] == 0.0

    # DDP averages the ranks' gradients: one process training on both ranks' batches at once
    # (the same mean loss) reaches the same parameters
    sys.path.insert(0, str(tmp_path))
    # by its path, under a name of its own: another test may have imported a module `train`
    spec = importlib.util.spec_from_file_location("opkit_ddp_train", tmp_path / "train.py")
    train = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(train)
        net = train.model()
        start = train.flat(net)
        data = [(torch.cat([x0, x1]), torch.cat([t0, t1]))
                for (x0, t0), (x1, t1) in zip(train.batches(0, steps), train.batches(1, steps))]
        train.train(net, data)
    finally:
        sys.path.remove(str(tmp_path))
    got = torch.tensor(ranks[0]["params"])
    assert not torch.allclose(got, start)
    torch.testing.assert_close(got, train.flat(net), rtol=1e-5, atol=1e-6)

    log = (tmp_path / "cc.log").read_text().splitlines()
    for op in ("fused_bias_leaky_relu", "leaky_relu"):
        links = [line for line in log if f" opkit_{op}_" in line]
        assert len(links) == 1, log                     # compiled once for both processes
        assert links[0].startswith("contended"), log    # while the other rank waited for it
