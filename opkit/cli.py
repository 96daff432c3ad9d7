"""`opkit` command line: build, list, show, validate, clean, bench, doctor. It only calls the stages."""
from __future__ import annotations

import argparse
import contextlib
import concurrent.futures
import json
import os
import re
import sys
import tempfile
import threading
import time
import warnings
from typing import List, Optional

from . import backend, report
from ._version import __version__
from ._options import add_path_option, attr_option
from .bench import add_parser as add_bench_parser
from .errors import BuildError, FusionWarning, SpecError
from .kinds import Layout
from .spec.model import DTYPES


class Progress:
    """One status line per operator; redrawn in place on a terminal, one line per event elsewhere."""

    def __init__(self, total: int, stream=None, quiet: bool = False):
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() and not quiet
        self.quiet = quiet
        self.lock = threading.Lock()
        self.active = {}
        self.t0 = time.perf_counter()

    def _draw(self) -> None:
        now = ", ".join(f"{n} ({s})" for n, s in self.active.items()) or "finishing"
        width = 30
        filled = int(width * self.done / max(self.total, 1))
        line = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} " \
               f"{time.perf_counter() - self.t0:5.1f}s  {now}"
        self.stream.write("\r\033[K" + line[:160])
        self.stream.flush()

    def stage(self, name: str, what: str) -> None:
        with self.lock:
            self.active[name] = what
            if self.tty:
                self._draw()
            elif not self.quiet:
                self.stream.write(f"  {name}: {what}\n")
                self.stream.flush()

    def finish(self, name: str, status: str) -> None:
        with self.lock:
            self.active.pop(name, None)
            self.done += 1
            if self.tty:
                self.stream.write("\r\033[K")
                self._draw()
            elif not self.quiet:
                self.stream.write(f"  {name}: {status} [{self.done}/{self.total}]\n")
                self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _table(rows: List[List[str]], header: List[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    fmt = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def _is_path(name: str) -> bool:
    return os.sep in name or "/" in name or name.endswith((".yaml", ".yml"))


def _select(names: List[str]):
    """The operators named (every registered one without names). A name that is a path to a
    YAML file or a folder stands for the operators declared there (loaded first)."""
    import opkit
    from .registry import REGISTRY
    if not names:
        return [opkit.get(n) for n in opkit.list_ops()]
    ops = []
    for name in names:
        known = name in opkit.list_ops()
        if _is_path(name) or (not known and os.path.exists(name)):
            ops += [opkit.get(n) for n in opkit.load(name)]
        elif not known:
            raise KeyError(REGISTRY.unknown(name, "`opkit list` lists the registered ones; name "
                                                  "its YAML file or folder instead, add --path "
                                                  "DIR, or put its folder in OPKIT_PATH"))
        else:
            ops.append(opkit.get(name))
    return ops


def _targets(paths: List[str]) -> List[str]:
    """Operator names from folders/files given on the command line (loaded first)."""
    import opkit
    names: List[str] = []
    for p in paths:
        for n in opkit.load(p):
            if n not in names:
                names.append(n)
    return names


def _validated(op, result, revalidate: bool):
    """The validation report of a build, from the cache entry when it is there."""
    from .builder.cache import write_json_atomic
    from .validate import validate_op
    path = result.entry / "validation.json"
    if _cache_root().resolve() not in result.entry.resolve().parents:
        return validate_op(op).to_dict()  # a shipped module (read-only): the report is printed
    if not revalidate and path.is_file():
        try:
            return json.loads(path.read_text())
        except ValueError:
            pass
    report = validate_op(op).to_dict()
    try:
        write_json_atomic(path, report)
    except OSError:
        pass  # a read-only cache: the report is printed, just not kept
    return report


def _longest_first(ops):
    """The operators in the order their compiles should start: the largest generated source
    first, so that the last compile to finish is a short one and the cores stay busy to the
    end (a compile's time grows with its source; in name order a cold build of the bundled
    operators on two cores ended with one core idle)."""
    def size(op):
        try:
            return len(op.source())
        except Exception:  # the build itself reports what is wrong with it
            return 0
    return sorted(ops, key=size, reverse=True)


def cmd_build(args) -> int:
    import opkit
    from .builder import compile as compile_stage
    if args.isa:
        opkit.configure(isa=args.isa)
    compile_stage.ANNOUNCE = False  # the progress display says what compiles
    names = _targets(args.paths) if args.paths else opkit.list_ops()
    ops = [opkit.get(n) for n in names]
    progress = Progress(len(ops), quiet=args.quiet)
    rows, failures = [], []
    t0 = time.perf_counter()

    def one(op):
        start = time.perf_counter()
        progress.stage(op.name, "building (a cache hit, a shipped module or a compile)")
        result = op.build(force=args.force)
        op.module()
        validation = None
        if not args.no_validate:
            progress.stage(op.name, "validating")
            validation = _validated(op, result, args.force or args.revalidate)
        status = "cached" if result.cached else f"compiled in {result.seconds:.1f}s"
        progress.finish(op.name, status)
        return op, result, validation, time.perf_counter() - start

    jobs = args.jobs or os.cpu_count() or 1
    with _fusion_notes() as notes, \
            concurrent.futures.ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
        futures = {pool.submit(one, op): op for op in _longest_first(ops)}
        for fut in concurrent.futures.as_completed(futures):
            op = futures[fut]
            try:
                op, result, validation, seconds = fut.result()
            except (BuildError, SpecError, OSError) as exc:
                progress.finish(op.name, "FAILED")
                failures.append((op.name, str(exc)))
                rows.append([op.name, ", ".join(op.spec.dtypes), "-", "-", "FAILED"])
                continue
            vtext = "skipped" if validation is None else validation["summary"]
            if validation is not None and not validation["ok"]:
                failures.append((op.name, f"validation: {validation['summary']}"))
            rows.append([op.name, ", ".join(op.spec.dtypes),
                         "hit" if result.cached else f"miss ({result.seconds:.1f}s)",
                         f"{seconds:.2f}s", vtext])
    progress.close()
    rows.sort(key=lambda r: r[0])
    print(_table(rows, ["operator", "dtypes", "cache", "time", "validation"]))
    print(f"{len(ops)} operator(s) in {time.perf_counter() - t0:.1f}s; cache {_cache_root()}")
    for line in _summarized(notes):
        print(line, file=sys.stderr)
    if failures:
        print(f"opkit build: error: {_build_failures(failures, len(ops))}", file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def _fusion_notes():
    """The FusionWarnings of a build, collected (from every build thread) instead of printed as
    Python warnings with a source line each; `_summarized` says them after the table."""
    found: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("always", FusionWarning)
        shown = warnings.showwarning

        def show(message, category, *rest, **kw):
            if issubclass(category, FusionWarning):
                found.append(str(message))
            else:
                shown(message, category, *rest, **kw)
        warnings.showwarning = show
        yield found


_NO_GEMM = re.compile(r"Cannot fuse the epilogue of \w+ \((.+?):\d+:\d+\): no GEMM backend")


def _summarized(notes) -> list:
    """One line for every epilogue unfused for want of a GEMM backend, and a line for each other
    note."""
    files = sorted({os.path.splitext(os.path.basename(m.group(1)))[0]
                    for m in map(_NO_GEMM.match, notes) if m})
    lines = [f"note: {n}" for n in sorted(set(notes)) if not _NO_GEMM.match(n)]
    if files:
        why, fix = (("OPKIT_GEMM=none", "unset OPKIT_GEMM (and OPKIT_BLAS) to fuse them")
                    if backend.blas_disabled() else
                    ("OPKIT_GEMM=blas and SciPy is not installed",
                     "pip install scipy, or unset OPKIT_GEMM for opkit's own GEMM, to fuse them"))
        lines.append(f"note: {why}, so {len(files)} operator(s) ({', '.join(files)}) run their "
                     "convolution or matmul and the elementwise work after it one after the other "
                     f"instead of fused (same results, slower): {fix}")
    return lines


def _build_failures(failures, total: int) -> str:
    """The one-line summary; the details of each failed operator go to stderr first, unless
    every operator failed for one and the same one-line reason (no compiler, no cache)."""
    failures.sort()
    texts = {text for _, text in failures}
    names = ", ".join(name for name, _ in failures)
    if len(texts) == 1 and len(failures[0][1].splitlines()) <= 1:
        return f"{names}: {failures[0][1]}" if len(failures) == 1 else \
            f"{len(failures)} of {total} operator(s) failed: {failures[0][1]}"
    for name, text in failures:
        print(f"\n{name}: {text}", file=sys.stderr)
    return f"{len(failures)} of {total} operator(s) failed ({names}); see above"


def _cache_root():
    from .builder import cache_root
    return cache_root()


def cmd_list(args) -> int:
    from .registry import REGISTRY
    rows = []
    for op in _select([]):
        s = op.spec
        ins = ", ".join(s.input_names)
        attrs = ", ".join(f"{a.name}={a.default!r}" if not a.required else a.name for a in s.attrs)
        rows.append([s.name, ins, attrs or "-", ",".join(d.replace("float", "f") for d in s.dtypes),
                     ",".join(s.layouts), REGISTRY.origin(s.name) or os.path.dirname(s.file),
                     s.summary])
    print(_table(rows, ["operator", "inputs", "attrs", "dtypes", "layouts", "from", "summary"]))
    status = 0
    packages = REGISTRY.package_errors()
    if packages:
        print("\noperator packages:")
        for problem in packages:
            print("  " + problem)
        print(f"opkit list: error: {len(packages)} problem(s) with installed operator packages "
              "(see above)", file=sys.stderr)
        status = 1
    broken = REGISTRY.broken()
    if broken:
        print("\nbroken (not loaded from OPKIT_PATH):")
        for error in broken:
            print("  " + str(error).splitlines()[0])
        where = ", ".join(f"{e.loc.file}:{e.loc.line}" for e in broken if e.loc)
        print(f"opkit list: error: {len(broken)} declaration file(s) in OPKIT_PATH could not be "
              f"loaded ({where}); fix them or take them out of OPKIT_PATH", file=sys.stderr)
        return 1
    return status


def cmd_show(args) -> int:
    ops = _select([args.name])
    if args.shape:
        print("\n\n".join(_show_schedule(op, args) for op in ops))
        return 0
    print("\n\n".join(report.describe(op, args.build) for op in ops))
    return 0


def _show_schedule(op, args) -> str:
    """`opkit show NAME --shape ...`: the shapes checked against the operator's inputs."""
    shapes = dict(_shape_option(t) for t in args.shape)
    for name, shape in shapes.items():
        if not all(isinstance(d, int) for d in shape):
            raise ValueError(f"--shape {name}: give whole sizes, as {name}=16,128,128,64, got "
                             f"{','.join(map(str, shape))}")
    unknown = sorted(set(shapes) - set(op.spec.input_names))
    missing = [i.name for i in op.spec.inputs if i.name not in shapes and not i.optional]
    if unknown or missing:
        raise ValueError(f"--shape: give NAME=D0,D1,... for each input of {op.name} "
                         f"({', '.join(op.spec.input_names)})"
                         + (f"; {', '.join(unknown)} is not one" if unknown else "")
                         + (f"; missing {', '.join(missing)}" if missing else ""))
    attrs = dict(attr_option(op, t) for t in args.attr)
    return report.schedules(op, shapes, args.dtype, args.layout, attrs)


def cmd_validate(args) -> int:
    from .validate import validate_op
    ok = True
    for op in _select(args.names):
        op.build()
        report = validate_op(op)
        print(report.format())
        ok &= report.ok
    if not ok:
        print("opkit validate: some kernels disagree with the reference (see FAIL above)", file=sys.stderr)
    return 0 if ok else 1


def cmd_clean(args) -> int:
    from .builder import clean
    n = clean(stale_only=args.stale)
    print(f"removed {n} cache entr{'y' if n == 1 else 'ies'} from {_cache_root()}")
    return 0


def _load_factory(target: str):
    """FILE.py:NAME -> the model: NAME called without arguments (a class or a function), or
    NAME itself when it is a module instance. The file is the user's own code, imported."""
    import importlib.util
    import difflib
    path, sep, name = target.rpartition(":")
    if not sep or not path or not name:
        raise ValueError(f"expected FILE.py:NAME (e.g. models.py:Discriminator), got {target!r}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist")
    module_name = "opkit_doctor_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # its own imports resolve
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    if not hasattr(module, name):
        close = difflib.get_close_matches(name, [n for n in dir(module) if not n.startswith("_")], n=1)
        raise ValueError(f"{path} has no {name!r}" + (f"; did you mean {close[0]!r}?" if close else ""))
    return getattr(module, name)


def _shape(text: str) -> List[int]:
    try:
        dims = [int(d) for d in text.split(",")]
    except ValueError:
        dims = []
    if not dims or any(d < 1 for d in dims):
        raise ValueError(f"--input must be positive sizes separated by commas, e.g. 64,1,32,32; "
                         f"got {text!r}")
    return dims


def cmd_doctor(args) -> int:
    import opkit.torch
    import torch
    shape = _shape(args.input)
    factory = _load_factory(args.target)
    model = factory if isinstance(factory, torch.nn.Module) else factory()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{args.target} gave a {type(model).__name__}, not a torch.nn.Module")
    x = torch.randn(*shape, dtype=getattr(torch, args.dtype))
    if args.layout == "NHWC":
        x = x.contiguous(memory_format=torch.channels_last)
    checkup = opkit.torch.doctor(model, x, repeat=args.repeat)
    print(checkup)
    return 1 if checkup.actionable else 0


def _shape_option(text: str):
    """`x=N,3,64,64` -> ("x", ("N", 3, 64, 64)); `x=` is a 0-d input."""
    name, eq, dims = text.partition("=")
    if not eq or not name:
        raise ValueError(f"--shape takes NAME=DIMS, as x=N,3,64,64 (sizes, or names for free "
                         f"dims), got {text!r}")
    parts = [d.strip() for d in dims.split(",") if d.strip()]
    return name, tuple(int(d) if d.isdigit() else d for d in parts)


def cmd_export(args) -> int:
    try:
        from .onnx import export
    except ImportError as exc:
        print(f"opkit export: error: {exc}", file=sys.stderr)
        return 1
    ops = _select([args.name])
    if len(ops) != 1:
        raise ValueError(f"{args.name} declares {len(ops)} operators "
                         f"({', '.join(o.name for o in ops)}); name one of them")
    op = ops[0]
    inputs = None
    if args.shape:
        shapes = dict(_shape_option(t) for t in args.shape)
        unknown = set(shapes) - set(op.spec.input_names)
        if unknown:
            raise ValueError(f"--shape {sorted(unknown)[0]}: {op.name} has no such input (its "
                             f"inputs: {', '.join(op.spec.input_names)})")
        from .onnx.export import default_shapes
        inputs = default_shapes(op.spec, shapes, args.layout)
    attrs = dict(attr_option(op, t) for t in args.attr)
    try:
        model = export(op, args.output, inputs, attrs, layout=args.layout, dtype=args.dtype,
                       opset=args.opset, backward=args.backward)
    except ImportError as exc:
        print(f"opkit export: error: {exc}", file=sys.stderr)
        return 1
    props = {p.key: p.value for p in model.metadata_props}
    ins = ", ".join(f"{i.name}{_dims(i)}" for i in model.graph.input)
    outs = ", ".join(f"{o.name}{_dims(o)}" for o in model.graph.output)
    print(f"wrote {args.output}: {op.name} ({props['pass']}, {props['dtype']}, layout "
          f"{props['layout']}, opset {args.opset}) as the function {model.functions[0].domain}."
          f"{model.functions[0].name}; inputs {ins}; outputs {outs}")
    return 0


def cmd_package(args) -> int:
    from pathlib import Path
    import opkit
    from .packaging.aot import build_ahead, parse_isas
    from .packaging.wheel import names_for, write_wheel
    folder = Path(args.folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder of YAML operator declarations")
    files = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    if not files:
        raise ValueError(f"{folder} holds no .yaml declarations")
    dist, package = names_for(folder, args.name)
    names = opkit.load(folder)  # every file checked (and refused with file:line) first
    ops = [opkit.get(n) for n in names]
    isas = parse_isas(args.isa)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="opkit-package-") as tmp:
        prebuilt = Path(tmp) / "prebuilt"
        if isas:
            print(f"building {len(ops)} operator(s) for {', '.join(isas)}", file=sys.stderr)
            build_ahead(ops, prebuilt, isas, args.jobs,
                        report=lambda line: print(line, file=sys.stderr))
        wheel = write_wheel(Path(args.output), dist, args.version, package, files,
                            prebuilt if isas else None, ", ".join(names))
    print(f"wrote {wheel} ({len(names)} operator(s): {', '.join(names)}; modules for "
          f"{', '.join(isas) or 'no ISA: compiled on first use'}; "
          f"{time.perf_counter() - t0:.0f}s); install it with pip install {wheel}")
    return 0


def _dims(value_info) -> str:
    dims = value_info.type.tensor_type.shape.dim
    return "[" + ", ".join(d.dim_param or str(d.dim_value) for d in dims) + "]"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="opkit", description="Operator development kit: "
                                     "YAML declarations → validated, compiled kernels.")
    parser.add_argument("--version", action="version", version=f"opkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    b = sub.add_parser("build", help="generate, compile and validate operators")
    b.add_argument("paths", nargs="*", help="operator folders or files (default: every registered operator)")
    b.add_argument("--force", action="store_true", help="rebuild and revalidate even when cached")
    b.add_argument("--revalidate", action="store_true", help="run validation even when a cached report exists")
    b.add_argument("--no-validate", action="store_true", help="compile only")
    b.add_argument("-j", "--jobs", type=int, default=0, help="parallel builds (default: all cores)")
    b.add_argument("--isa", choices=["native", "portable"], help="instruction set to compile for")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    b.set_defaults(func=cmd_build)
    sub.add_parser("list", help="list registered operators").set_defaults(func=cmd_list)
    s = sub.add_parser("show", help="declaration, derived backward, schedule and generated source")
    s.add_argument("name", help="an operator, or a YAML file or folder of operators")
    add_path_option(s)
    s.add_argument("--no-build", dest="build", action="store_false",
                   help="do not compile (no vectorization report)")
    s.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="print how a call on inputs of these shapes runs, forward and backward "
                        "(whole or in slices), instead of the report (repeatable, one per input)")
    s.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="with --shape: the inputs' dtype (default float32)")
    s.add_argument("--layout", default=None, choices=[str(x) for x in Layout],
                   help="with --shape: the call's layout (default: the operator's first)")
    s.add_argument("--attr", action="append", default=[], metavar="NAME=VALUE",
                   help="with --shape: an attr of the call (repeatable)")
    s.set_defaults(func=cmd_show)
    v = sub.add_parser("validate", help="check compiled kernels against the NumPy reference")
    v.add_argument("names", nargs="*", help="operators, or YAML files or folders (default: all)")
    add_path_option(v)
    v.set_defaults(func=cmd_validate)
    c = sub.add_parser("clean", help="remove the build cache")
    c.add_argument("--stale", action="store_true", help="only leftovers of builds that are no longer running")
    c.set_defaults(func=cmd_clean)
    d = sub.add_parser("doctor", help="performance checklist for a PyTorch model (exit 1 when "
                       "something is actionable)")
    d.add_argument("target", help="FILE.py:NAME, a class or function that builds the model")
    d.add_argument("--input", required=True, help="the example input's shape, e.g. 64,1,32,32")
    d.add_argument("--dtype", choices=["float32", "float64", "float16"], default="float32")
    d.add_argument("--layout", choices=["NCHW", "NHWC"], default="NCHW",
                   help="memory layout of the example input")
    d.add_argument("--repeat", type=int, default=5, help="timed forwards per precision")
    d.set_defaults(func=cmd_doctor)
    e = sub.add_parser("export", help="write an operator as an ONNX model and function")
    e.add_argument("name", help="an operator, or a YAML file of one")
    e.add_argument("-o", "--output", required=True, metavar="FILE.onnx", help="the model to write")
    from .onnx.export import DEFAULT_OPSET, MIN_OPSET
    e.add_argument("--opset", type=int, default=DEFAULT_OPSET,
                   help=f"the ONNX opset (default {DEFAULT_OPSET}, at least {MIN_OPSET})")
    e.add_argument("--layout", help="layout of 4-d inputs (default: the operator's first)")
    e.add_argument("--dtype", default="float32", choices=["float16", "float32", "float64", "bfloat16"],
                   help="dtype of the inputs (default float32)")
    e.add_argument("--shape", action="append", default=[], metavar="NAME=DIMS",
                   help="an input's shape, sizes or names of free dims: x=N,3,64,64 (repeatable; "
                        "default: the declared dims, free)")
    e.add_argument("--attr", action="append", default=[], metavar="NAME=VALUE",
                   help="an attr's value: its default in the function, and the choice of a str attr")
    e.add_argument("--backward", action="store_true", help="export the backward pass instead")
    add_path_option(e)
    e.set_defaults(func=cmd_export)
    pk = sub.add_parser("package", help="build a wheel of a folder of operators and their kernels")
    pk.add_argument("folder", help="a folder of YAML operator declarations")
    pk.add_argument("-o", "--output", required=True, metavar="DIST", help="the folder to write the wheel into")
    pk.add_argument("--name", help="the distribution name (default: the folder's name)")
    pk.add_argument("--version", default="0.1.0", help="the package version (default 0.1.0)")
    pk.add_argument("--isa", default="dist",
                    help="what the kernels are built for: dist (portable and, on x86-64, "
                         "x86-64-v3; the default), native (this CPU only), none, or a list")
    pk.add_argument("-j", "--jobs", type=int, default=0, help="parallel builds (default: all cores)")
    pk.set_defaults(func=cmd_package)
    add_bench_parser(sub)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        _load_paths(args)
        return args.func(args)
    except KeyboardInterrupt:
        print(f"opkit {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # every failure is a one-line reason (OPKIT_DEBUG=1: the traceback)
        if os.environ.get("OPKIT_DEBUG"):
            raise
        _report(args.command, exc)
        return 1


def _load_paths(args) -> None:
    import opkit
    for path in getattr(args, "path", None) or ():
        opkit.load(path)
    if args.command == "bench" and args.names:  # bench takes operator names: resolve paths
        args.names = [op.name for op in _select(args.names)]


def _report(command: str, exc: Exception) -> None:
    if isinstance(exc, KeyError) and exc.args:
        text = str(exc.args[0])
    elif isinstance(exc, (SpecError, BuildError, ValueError, TypeError, OSError)):
        text = str(exc)
    else:
        text = f"internal error: {type(exc).__name__}: {exc} (OPKIT_DEBUG=1 shows the traceback)"
    lines = text.splitlines() or [type(exc).__name__]
    print(f"opkit {command}: error: {lines[0]}", file=sys.stderr)
    for line in lines[1:]:
        print(f"  {line}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
