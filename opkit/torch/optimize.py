"""`opkit.torch.optimize(model, config, example_input)`: one configuration dictionary applied to
a PyTorch model (docs/torch.md, "Tuning a model").

    model2, report = opkit.torch.optimize(model, {"precision_mode": "force_fp16",
                                                  "leakyrelu_fusion": True,
                                                  "alpha_quant": True, "layout": "NHWC"}, x)
    print(report)

The model is traced with torch.fx; with leakyrelu_fusion each LeakyReLU whose input is a
Conv2d, or a BatchNorm2d fed by a Conv2d, becomes one FusedConvLeakyReLU over opkit's fused
convolution operators, and every LeakyReLU that cannot fuse gets a report line saying why.
The original model is left as it is: the optimized one is a GraphModule over a copy of it,
with the same state_dict keys.
"""
from __future__ import annotations

import copy
import difflib
import operator
from typing import List, NamedTuple, Optional, Tuple

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ..config import DEFAULT_PRECISION, PRECISION_MODES
from . import nn as opnn
from . import resize
from .calibrate import Change, slopes
from .fused import CONV_CHOICES, FusedConvLeakyReLU

LAYOUTS = ("NHWC", "NCHW", None)
# conv: where the convolution of a fused chain runs in eval / in training. "auto" with an
# example input times both on the tensor each chain gets (choose.py) and takes the faster;
# without one it takes what measured faster on the benchmark shapes (docs/torch.md): PyTorch's
# conv2d (in eval with the batch norm folded into its weights and bias; in training with
# PyTorch's batch norm) and opkit's activation
CONV = ("auto",) + CONV_CHOICES
AUTO_CONV = {"eval": "torch", "train": "torch"}
DEFAULTS = {"precision_mode": DEFAULT_PRECISION, "leakyrelu_fusion": True, "alpha_quant": False,
            "layout": None, "conv": "auto", "fold_upsampling": True}
ALPHA_BITS = 7  # alpha_quant: m / 128, as opkit's quantizable attrs declare it
ALPHA_RANGE = (0.0, 1.0)  # the fused operators' alpha range


def _choices(values) -> str:
    return ", ".join(repr(v) for v in values)


def check_config(config: Optional[dict]) -> dict:
    """The configuration with defaults filled in; ValueError naming the valid keys or values."""
    if config is None:
        return dict(DEFAULTS)
    if not isinstance(config, dict):
        raise TypeError(f"opkit.torch.optimize: config must be a dict with keys "
                        f"{', '.join(DEFAULTS)}, got {type(config).__name__}")
    for key in config:
        if key not in DEFAULTS:
            close = difflib.get_close_matches(str(key), list(DEFAULTS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"opkit.torch.optimize: unknown config key {key!r}{hint}; valid "
                             f"keys: {', '.join(DEFAULTS)}")
    out = dict(DEFAULTS, **config)
    allowed = {"precision_mode": PRECISION_MODES, "layout": LAYOUTS, "conv": CONV,
               "leakyrelu_fusion": (True, False), "alpha_quant": (True, False),
               "fold_upsampling": (True, False)}
    for key, values in allowed.items():
        v = out[key]
        if not any(v is c or (type(v) is type(c) and v == c) for c in values):
            raise ValueError(f"opkit.torch.optimize: config[{key!r}] must be one of "
                             f"{_choices(values)}; got {v!r}")
    return out


# ----------------------------------------------------------------------------- the report

class Entry:
    """One LeakyReLU's fate: fused (with `producer`, into `operator`) or not (with `reason`)."""

    def __init__(self, node: str, fused: bool, producer: str, reason: str = "",
                 operator: str = "", chain: Tuple[str, ...] = ()):
        self.node, self.fused, self.producer = node, fused, producer
        self.reason, self.operator, self.chain = reason, operator, chain

    def __str__(self) -> str:
        if self.fused:
            return (f"{self.node}: fused {' -> '.join(self.chain)} -> LeakyReLU into "
                    f"{self.operator}")
        return f"{self.node}: Cannot fuse LeakyReLU with preceding op {self.producer}: {self.reason}"

    def __repr__(self) -> str:
        return f"Entry({str(self)!r})"


class Fold(NamedTuple):
    """A nearest upsampling before a convolution: folded into it (reason "") or why not."""
    upsample: str
    conv: str
    r: int
    reason: str = ""

    def __str__(self) -> str:
        if self.reason:
            return f"upsampling {self.upsample} not folded into {self.conv}: {self.reason}"
        return (f"upsampling {self.upsample} (nearest x{self.r}) folded into {self.conv}: "
                f"{self.r * self.r} phase convolutions over the image before upsampling")


class Report(list):
    """The fusion decisions (a list of Entry: .fused, .node, .reason), then the slopes
    alpha_quant snapped (.alphas: old -> new per module) and the settings applied (.notes).
    Printing it gives one line per decision."""

    def __init__(self):
        super().__init__()
        self.alphas: List[Change] = []
        self.folds: List[Fold] = []
        self.notes: List[str] = []

    @property
    def fused(self) -> List[Entry]:
        return [e for e in self if e.fused]

    @property
    def not_fused(self) -> List[Entry]:
        return [e for e in self if not e.fused]

    def __str__(self) -> str:
        lines = [str(e) for e in self] + [str(c) for c in self.alphas] + self.notes + \
            [str(f) for f in self.folds]
        return "\n".join(lines) if lines else "nothing to do"


# ----------------------------------------------------------------------------- the graph

_SHAPE_METHODS = {"view", "reshape", "flatten", "permute", "transpose", "unsqueeze", "squeeze",
                  "unflatten", "view_as", "reshape_as", "expand", "expand_as", "t"}
_SHAPE_FUNCTIONS = {torch.flatten, torch.reshape, torch.permute, torch.transpose,
                    torch.unsqueeze, torch.squeeze, torch.unflatten}
_LAYOUT_METHODS = {"contiguous", "to"}
_F_LEAKY = {F.leaky_relu, torch.nn.functional.leaky_relu}


def _opkit_leaky():
    return {torch.ops.opkit.leaky_relu, torch.ops.opkit.leaky_relu.default}


def _name(node: fx.Node) -> str:
    return str(node.target) if node.op == "call_module" else node.name


def _describe(node, modules) -> str:
    """What a node is, for a report line: a module's class, a function's or method's name."""
    if not isinstance(node, fx.Node):
        return f"the constant {node!r}"
    if node.op == "call_module":
        return type(modules[node.target]).__name__
    if node.op == "call_method":
        return f".{node.target}()"
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    if node.op == "placeholder":
        return "a model input"
    return node.op


def _leaky_alpha(node: fx.Node, modules) -> Optional[Tuple[float, str]]:
    """(alpha, how it is held) when `node` is a LeakyReLU, else None."""
    if node.op == "call_module":
        m = modules[node.target]
        if isinstance(m, nn.LeakyReLU):
            return float(m.negative_slope), "module"
        if isinstance(m, opnn.LeakyReLU):
            return float(m.alpha), "module"
    elif node.op == "call_function":
        if node.target in _F_LEAKY:
            a = node.args[1] if len(node.args) > 1 else node.kwargs.get("negative_slope", 0.01)
            return (float(a), "function") if isinstance(a, (int, float)) else None
        if node.target in _opkit_leaky():
            a = node.args[1] if len(node.args) > 1 else node.kwargs.get("alpha", 0.2)
            return (float(a), "function") if isinstance(a, (int, float)) else None
    return None


def _is_shape(node, modules) -> bool:
    if node.op == "call_module":
        return isinstance(modules[node.target], (nn.Flatten, nn.Unflatten))
    if node.op == "call_method":
        return node.target in _SHAPE_METHODS
    return node.op == "call_function" and node.target in _SHAPE_FUNCTIONS


def _is_layout(node) -> bool:
    """A memory-format conversion: .contiguous(...) or .to(memory_format=...)."""
    if node.op != "call_method" or node.target not in _LAYOUT_METHODS:
        return False
    return node.target == "contiguous" or "memory_format" in node.kwargs


def _pair(v) -> Tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _conv_problem(conv: nn.Module) -> Optional[str]:
    """Why the fused operators cannot run this convolution (None: they can). A transposed
    convolution's chain always runs PyTorch's transposed convolution (fused.py): any one with
    groups=1 fuses (the batch norm's scale folds into the weights' output-channel dim)."""
    if isinstance(conv, nn.ConvTranspose2d):
        return None if conv.groups == 1 else (
            f"unsupported transposed convolution: groups={conv.groups} (the batch norm folds into "
            "a transposed convolution's weights with groups=1)")
    if conv.groups != 1:
        return f"unsupported convolution: groups={conv.groups} (the fused operators take groups=1)"
    if _pair(conv.dilation) != (1, 1):
        return (f"unsupported convolution: dilation={tuple(conv.dilation)} (the fused operators "
                "take dilation=1)")
    if conv.padding_mode != "zeros":
        return (f"unsupported convolution: padding_mode={conv.padding_mode!r} (the fused "
                "operators pad with zeros)")
    if isinstance(conv.padding, str) and conv.padding != "valid":
        return (f"unsupported convolution: padding={conv.padding!r} (give the padding as a "
                "number)")
    stride = _pair(conv.stride)
    padding = (0, 0) if isinstance(conv.padding, str) else _pair(conv.padding)
    if stride[0] != stride[1]:
        return f"unsupported convolution: stride={stride} (the fused operators take one stride for both axes)"
    if padding[0] != padding[1]:
        return (f"unsupported convolution: padding={padding} (the fused operators take one "
                "padding for both axes)")
    if not 1 <= stride[0] <= 64 or not 0 <= padding[0] <= 64:
        return f"unsupported convolution: stride={stride[0]}, padding={padding[0]} (range: stride 1..64, padding 0..64)"
    return None


def _geometry(conv: nn.Conv2d) -> Tuple[int, int]:
    padding = 0 if isinstance(conv.padding, str) else _pair(conv.padding)[0]
    return _pair(conv.stride)[0], padding


def _bn_problem(bn: nn.BatchNorm2d) -> Optional[str]:
    if not bn.track_running_stats:
        return ("unsupported batch norm: track_running_stats=False (it normalizes with batch "
                "statistics in eval too)")
    if not 0 < bn.eps <= 1:
        return f"unsupported batch norm: eps={bn.eps} (the fused operators take eps in (0, 1])"
    return None


def _layout_problem(node: fx.Node) -> Optional[str]:
    """With an example input: the convolution's input must be NCHW or NHWC in memory."""
    meta = node.meta.get("tensor_meta")
    if meta is None or len(meta.shape) != 4:
        return None
    if meta.memory_format in (torch.contiguous_format, torch.channels_last):
        return None
    return (f"memory-layout mismatch: the convolution's input is neither NCHW nor NHWC "
            f"(channels_last) in memory (strides {tuple(meta.stride)}); make it contiguous")


class _Decision:
    def __init__(self, entry: Entry, conv: Optional[fx.Node] = None, bn: Optional[fx.Node] = None,
                 add: Optional[fx.Node] = None, residual: Optional[fx.Node] = None):
        self.entry, self.conv, self.bn = entry, conv, bn
        self.add, self.residual = add, residual


_ADDS = {operator.add, torch.add}


def _residual(src: fx.Node, modules) -> Optional[Tuple[fx.Node, fx.Node]]:
    """(the convolution's or batch norm's node, the residual) when `src` adds a tensor to the
    output of a convolution or batch norm that nothing else reads: `conv(x) + r`."""
    plain = (src.op == "call_function" and src.target in _ADDS) or \
        (src.op == "call_method" and src.target in ("add", "__add__"))
    if not plain or src.kwargs or len(src.args) != 2:
        return None
    a, b = src.args
    for mine, other in ((a, b), (b, a)):
        if isinstance(mine, fx.Node) and isinstance(other, fx.Node) and mine is not other \
                and _kind(mine, modules) and len(mine.users) == 1:
            return mine, other
    return None


def _decide(node: fx.Node, alpha: float, modules) -> _Decision:
    """Whether the LeakyReLU `node` fuses with what precedes it, and why not."""
    me = _name(node)
    src = node.args[0] if node.args else node.kwargs.get("input", node.kwargs.get("x"))

    def no(producer, reason):
        return _Decision(Entry(me, False, producer, reason))

    if not isinstance(src, fx.Node):
        return no(repr(src), "the preceding op is not a convolution or batch norm")
    add = residual = None
    found = _residual(src, modules)
    if found is not None:  # conv(x) [-> bn] + r -> LeakyReLU: the addition joins the chain
        if len(src.users) > 1:
            return no(_name(src), _other_users(src, node))
        add, (src, residual) = src, found
    p, between = src, []
    while isinstance(p, fx.Node) and (_is_shape(p, modules) or _is_layout(p)):
        between.append(p)
        p = p.args[0] if p.args else None
    kind = _kind(p, modules) if isinstance(p, fx.Node) else None
    if between and kind:
        shapes = [b for b in between if _is_shape(b, modules)]
        if shapes:
            b = shapes[-1]
            return no(_name(p), f"a shape transform between them ({_describe(b, modules)}, "
                                f"{_name(b)})")
        b = between[-1]
        return no(_name(p), f"memory-layout mismatch: {_describe(b, modules)} ({_name(b)}) "
                            "converts the memory format between them")
    if kind is None:
        return no(_name(src), f"the preceding op is not a convolution or batch norm "
                              f"({_describe(src, modules)})")
    if not ALPHA_RANGE[0] <= alpha <= ALPHA_RANGE[1]:
        return no(_name(p), f"the slope {alpha:g} is outside the fused operators' alpha range "
                            f"[{ALPHA_RANGE[0]:g}, {ALPHA_RANGE[1]:g}]")
    bn = None
    if kind == "bn":
        bn, p = p, p.args[0]
        if not (isinstance(p, fx.Node) and _kind(p, modules) == "conv"):
            return no(_name(bn), f"the preceding op is a batch norm whose input is not a "
                                 f"convolution ({_describe(p, modules)})")
        why = _bn_problem(modules[bn.target])
        if why:
            return no(_name(bn), why)
        if len(bn.users) > 1:
            return no(_name(bn), _other_users(bn, node))
    conv = p
    why = _conv_problem(modules[conv.target])
    if why:
        return no(_name(conv), why)
    if len(conv.users) > 1:
        return no(_name(conv), _other_users(conv, bn or node))
    why = _layout_problem(conv.args[0]) if isinstance(conv.args[0], fx.Node) else None
    if why:
        return no(_name(conv), why)
    chain = (_name(conv),) + ((_name(bn),) if bn is not None else ()) + \
        ((_name(add),) if add is not None else ())
    # (the operator is named once the chain's module says what it runs)
    return _Decision(Entry(me, True, _name(conv), chain=chain), conv, bn, add, residual)


def _other_users(producer: fx.Node, ours: fx.Node) -> str:
    others = [_name(u) for u in producer.users if u is not ours]
    return (f"its output is also used by {', '.join(others)}, which needs the value before the "
            "LeakyReLU")


def _kind(node: fx.Node, modules) -> Optional[str]:
    if node.op != "call_module":
        return None
    m = modules[node.target]
    if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
        return "conv"
    if isinstance(m, nn.BatchNorm2d):
        return "bn"
    return None


# ----------------------------------------------------------------------------- passes

def _as_layout(x, layout: str):
    """A 4-d tensor input in the layout asked for (anything else as it is)."""
    if isinstance(x, torch.Tensor) and x.dim() == 4:
        fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
        return x.contiguous(memory_format=fmt)
    return x


def _apply_layout(gm: fx.GraphModule, layout: str, report: Report) -> None:
    for ph in [n for n in gm.graph.nodes if n.op == "placeholder"]:
        with gm.graph.inserting_after(ph):
            conv = gm.graph.call_function(_as_layout, (ph, layout))
        ph.replace_all_uses_with(conv, delete_user_cb=lambda u: u is not conv)
    if layout == "NHWC":  # PyTorch's own convolutions run fastest on channels_last weights too
        gm.to(memory_format=torch.channels_last)
    report.notes.append(f"layout: 4-d inputs converted to {layout}"
                        + (" (channels_last), conv weights channels_last" if layout == "NHWC" else ""))


def _propagate(gm: fx.GraphModule, example_input) -> None:
    """Record each node's tensor shape and strides from one run on the example input, leaving
    the batch norms' running statistics as they were."""
    from torch.fx.passes.shape_prop import ShapeProp
    inputs = example_input if isinstance(example_input, tuple) else (example_input,)
    saved = {k: v.clone() for k, v in gm.state_dict().items()}
    try:
        with torch.no_grad():
            ShapeProp(gm).propagate(*inputs)
    finally:
        gm.load_state_dict(saved)


def _fuse(gm: fx.GraphModule, config: dict, report: Report) -> None:
    modules = dict(gm.named_modules())
    taken = set(modules)
    for m in modules.values():  # fused before (an optimized model optimized again): the new config
        if isinstance(m, FusedConvLeakyReLU):
            m.precision_mode = config["precision_mode"]
            if not (m.transposed or m.residual):
                m.eval_conv, m.train_conv = _conv_choice(config)
    for node in list(gm.graph.nodes):
        found = _leaky_alpha(node, modules)
        if found is None:
            continue
        if not config["leakyrelu_fusion"]:
            continue
        d = _decide(node, found[0], modules)
        report.append(d.entry)
        if not d.entry.fused:
            continue
        conv = modules[d.conv.target]
        bn = modules[d.bn.target] if d.bn is not None else None
        stride, padding = _geometry(conv)
        eval_conv, train_conv = _conv_choice(config)
        fused = FusedConvLeakyReLU(
            conv, bn, found[0], stride, padding,
            names=(str(d.conv.target), str(d.bn.target) if d.bn is not None else None),
            precision_mode=config["precision_mode"], eval_conv=eval_conv,
            train_conv=train_conv, residual=d.add is not None).train(conv.training)
        d.entry.operator = fused.describe()
        target = "opkit_fused." + str(d.conv.target).replace(".", "_")
        while target in taken:
            target += "_"
        taken.add(target)
        gm.add_submodule(target, fused)
        with gm.graph.inserting_before(node):
            new = gm.graph.call_module(target, (d.conv.args[0],) +
                                       ((d.residual,) if d.residual is not None else ()))
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        if d.add is not None:
            gm.graph.erase_node(d.add)
        if d.bn is not None:
            gm.graph.erase_node(d.bn)
        gm.graph.erase_node(d.conv)
        if node.op == "call_module" and not any(n.op == "call_module" and n.target == node.target
                                                for n in gm.graph.nodes):
            gm.delete_submodule(node.target)  # no state; its slope lives on in the fused module


def _fold_upsampling(gm: fx.GraphModule, report: Report) -> None:
    """Nearest upsampling whose only consumer is a convolution (fused or not) runs as phase
    convolutions over the image before upsampling (resize.py)."""
    modules = dict(gm.named_modules())
    taken = set(modules)
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or resize.scale_factor(modules[node.target]) is None:
            continue
        r = resize.scale_factor(modules[node.target])
        users = list(node.users)
        if len(users) != 1 or users[0].op != "call_module" or users[0].args[:1] != (node,) \
                or len(users[0].args) != 1 or users[0].kwargs:
            continue
        user = users[0]
        consumer = modules[user.target]
        fused = isinstance(consumer, FusedConvLeakyReLU)
        conv = consumer.conv if fused else consumer
        name = consumer.conv_name if fused else str(user.target)
        problem = resize.fold_problem(conv)
        if fused and problem is None and consumer.eval_conv == consumer.train_conv == "opkit":
            problem = "its fused chain runs opkit's convolution (conv='opkit'), which takes the upsampled image"
        if problem is not None:
            if isinstance(conv, nn.Conv2d):
                report.folds.append(Fold(str(node.target), name, r, problem))
            continue
        if fused:
            consumer.fold_upsampling(r)
        else:
            target = "opkit_resize." + str(user.target).replace(".", "_")
            while target in taken:
                target += "_"
            taken.add(target)
            modules[target] = resize.ResizeConv2d(conv, r, name).train(conv.training)
            gm.add_submodule(target, modules[target])
            user.target = target
        user.args = (node.args[0],)
        gm.graph.erase_node(node)
        report.folds.append(Fold(str(node.target), name, r))


def _choose_convs(gm: fx.GraphModule, example_input, report: Report) -> None:
    """conv="auto" with an example: each chain's convolution where it measured faster here."""
    from .choose import choose
    inputs = example_input if isinstance(example_input, tuple) else (example_input,)
    gm.recompile()
    report.notes += choose(gm, inputs)
    chains = {m.conv_name: m for m in gm.modules() if isinstance(m, FusedConvLeakyReLU)}
    for entry in report.fused:
        if entry.chain and entry.chain[0] in chains:
            entry.operator = chains[entry.chain[0]].describe()


def _conv_choice(config: dict) -> Tuple[str, str]:
    """(eval, training): where a fused chain's convolution runs."""
    if config["conv"] == "auto":
        return AUTO_CONV["eval"], AUTO_CONV["train"]
    return config["conv"], config["conv"]


def _quantize_functions(gm: fx.GraphModule, report: Report) -> None:
    """alpha_quant for slopes given in F.leaky_relu / torch.ops.opkit.leaky_relu calls."""
    from ..quantize import fixed_point
    modules = dict(gm.named_modules())
    for node in gm.graph.nodes:
        found = _leaky_alpha(node, modules)
        if found is None or found[1] != "function":
            continue
        old = found[0]
        new = fixed_point(old, ALPHA_BITS)[2]
        key = "negative_slope" if node.target in _F_LEAKY else "alpha"
        if len(node.args) > 1:
            node.args = (node.args[0], new) + tuple(node.args[2:])
        else:
            node.kwargs = dict(node.kwargs, **{key: new})
        report.alphas.append(Change(node.name, "fixed", old, new, abs(new - old), ALPHA_BITS))


# ----------------------------------------------------------------------------- the entry point

class _Tracer(fx.Tracer):
    """opkit's activation modules stay modules (their slopes stay attributes to snap)."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, (opnn.LeakyReLU, opnn.SpatialLeakyReLU, opnn.ConditionalLeakyReLU,
                              opnn.FreqLeakyReLU, opnn.FusedBiasLeakyReLU, opnn.Op,
                              FusedConvLeakyReLU, resize.ResizeConv2d)) or super().is_leaf_module(m, qualname)


def optimize(model: nn.Module, config: Optional[dict] = None,
             example_input=None) -> Tuple[fx.GraphModule, Report]:
    """(optimized_model, report): `model` traced and rewritten as `config` says (report: the
    fusion decisions, report.alphas, report.folds, report.notes).

    config keys (all optional): precision_mode (the five modes; they govern the opkit
    operators the model then calls: a float32 model under force_fp16 runs them in float16 and
    gets float32 back), leakyrelu_fusion (bool, default True), alpha_quant (bool: every slope
    snapped to m/128), layout ("NHWC", "NCHW" or None: 4-d inputs converted at the entry),
    conv ("auto", "opkit" or "torch": where a fused chain's convolution runs; "auto" with an
    example input times both for each chain and takes the faster, saying so in report.notes),
    fold_upsampling
    (bool, default True: nearest upsampling before a convolution runs as phase convolutions
    over the image before upsampling).
    example_input (a tensor or a tuple) lets optimize check the memory layout each
    convolution sees."""
    config = check_config(config)
    if not isinstance(model, nn.Module):
        raise TypeError(f"opkit.torch.optimize: model must be a torch.nn.Module, got "
                        f"{type(model).__name__}")
    copied = copy.deepcopy(model)
    try:
        gm = fx.GraphModule(copied, _Tracer().trace(copied), type(model).__name__)
    except Exception as exc:  # noqa: BLE001  (any tracing failure: say what to do)
        raise ValueError(f"opkit.torch.optimize: torch.fx cannot trace {type(model).__name__}: "
                         f"{type(exc).__name__}: {exc}. Data-dependent control flow stops the "
                         "tracer; optimize the traceable submodules instead") from exc
    gm.training = model.training  # the modules inside keep their own modes
    report = Report()
    if config["layout"] is not None:
        _apply_layout(gm, config["layout"], report)
        gm.recompile()
    if example_input is not None:
        _propagate(gm, example_input)
    _fuse(gm, config, report)
    if config["fold_upsampling"]:
        _fold_upsampling(gm, report)
    if config["conv"] == "auto" and example_input is not None:
        _choose_convs(gm, example_input, report)
    if config["alpha_quant"]:
        _quantize_functions(gm, report)
        called = {n.target for n in gm.graph.nodes if n.op == "call_module"}
        report.alphas += [s.snap(ALPHA_BITS) for s in slopes(gm) if s.name in called]
    if config["precision_mode"] != DEFAULT_PRECISION:
        report.notes.append(f"precision_mode: {config['precision_mode']} for the opkit "
                            "operators (fused convolutions)")
    gm.graph.lint()
    gm.recompile()
    return gm, report
