"""Representative PyTorch samples for any operator, built from its declaration (shared by the
test_torch_* modules; they skip where PyTorch is not installed)."""
import numpy as np
import torch

import opkit
from opkit._paths import operators_dir

TORCH_DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64}
# logical sizes of the named dims; H != W and C != H so a mixed-up axis fails
DIMS = {"N": 2, "C": 3, "H": 4, "W": 6, "K": 5}


def bundled():
    return sorted(p.stem for p in operators_dir().glob("*.yaml"))


def sample(name, dtype="float32", channels_last=False, broadcast=True, requires_grad=True, seed=0):
    """(tensors, attrs) for operator `name`: a 4-d N, C, H, W first input (channels_last if asked),
    inputs with named dims at those sizes, other layout-agnostic inputs broadcast (one value per
    pixel, shared over N and C) when `broadcast`, values in each input's declared domain."""
    spec = opkit.get(name).spec
    rng = np.random.default_rng(seed)
    full = tuple(DIMS[d] for d in "NCHW")
    tensors = []
    for k, i in enumerate(spec.inputs):
        if i.shape is not None:
            shape = tuple(DIMS.get(d, 3) for d in i.shape)
        elif k > 0 and broadcast:
            shape = (1, 1) + full[2:]
        else:
            shape = full
        lo, hi = i.domain
        arr = rng.uniform(lo, hi, shape)
        if i.name == "x":  # keep away from the kink at 0, where finite differences break
            arr = np.where(np.abs(arr) < 0.05, np.copysign(0.05, arr), arr)
        t = torch.tensor(arr, dtype=TORCH_DTYPES[dtype])
        if channels_last and t.dim() == 4:
            t = t.contiguous(memory_format=torch.channels_last)
        tensors.append(t.requires_grad_(requires_grad and i.differentiable))
    attrs = {a.name: a.default for a in spec.attrs if not a.required}
    return tensors, attrs


def numpy_call(name, tensors, attrs):
    """The NumPy-level call of the same operator on the same values (logical N, C, H, W)."""
    op = opkit.get(name)
    arrays = [t.detach().numpy() for t in tensors]
    layout = None if "ND" in op.spec.layouts and all(i.shape is None for i in op.spec.inputs) \
        else "NCHW"
    return op(*arrays, layout=layout, **attrs)


def compile_backend() -> str:
    """Inductor where it can compile (its CPU code needs a C++ compiler), else aot_eager, which
    traces the same graph with the fake kernels and runs it eagerly."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        get_cpp_compiler()
        return "inductor"
    except Exception:  # noqa: BLE001  (no C++ compiler: Inductor says so in its own way)
        return "aot_eager"
