"""The GEMM micro-kernels of fused convolutions, generated for the target's vector registers.

A fused convolution multiplies a block of output pixels' receptive fields by the packed weights
(templates/opkit_conv.h). Its inner step is a register tile: `m` rows (pixels; output channels
in NCHW's channel-major tiles; input channels for the weight gradient) × `nv` vectors, held in
`m * nv` accumulator registers over the whole reduction (every kernel tap × every channel it
sums), each step one vector load per column vector, one broadcast per row and `m * nv` fused
multiply-adds; the tile is stored row by row, or each lane to its channel's row (NCHW blocks),
or added to what is there (the weight gradient's partial sums). The tile's shape follows the
register file: the largest `m` (up to MAX_ROWS) with `m * nv` accumulators + `nv` loaded vectors
+ one broadcast in the registers the ISA has, so AVX-512 (32 registers of 16 floats) runs
6 pixels × 64 channels and AVX2 (16 of 8) 6 × 16.

The source is written out with one named variable per accumulator, so the compiler keeps each
in a register; the vectors are GCC/Clang vector extensions, so the same text compiles for any
ISA the target names. The module gets the declarations (gemm_declarations); the kernels are
compiled once per toolchain into an object of their own that only the modules calling them
link (gemm_definitions; builder/runtime.py's objects_for), with multiply-adds contracted (one
rounding) inside these functions only: the rest keeps -ffp-contract=off.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

MAX_ROWS = 6          # rows per tile: their pointers stay in general-purpose registers (and each
                      # tile shape is one more function to compile into the GEMM object)
C_TYPES = (("f", "float", 4), ("d", "double", 8))
GEMM_TABLES = "opk_ukrs_"  # the kernel tables' name: a module that declares them links them


@dataclass(frozen=True)
class TileShape:
    """The register tiles of one compute type on one target."""
    vector_bytes: int
    registers: int
    elem: int                      # bytes per element

    @property
    def lanes(self) -> int:
        return max(1, self.vector_bytes // self.elem)

    @property
    def max_nv(self) -> int:
        """Column vectors of the widest tile: as many (up to 4) as keep MAX_ROWS rows in
        registers."""
        nv = 1
        while self.rows(nv + 1) >= MAX_ROWS and nv < 4:
            nv += 1
        return nv

    def rows(self, nv: int) -> int:
        return max(1, min(MAX_ROWS, (self.registers - nv - 1) // nv))


def tile_shape(vector_bytes: int, elem: int) -> TileShape:
    # 32 vector registers with AVX-512, else 16 as SSE/AVX have (AArch64's 32 unused)
    return TileShape(vector_bytes, 32 if vector_bytes >= 64 else 16, elem)


def _kernel(tag: str, ctype: str, m: int, nv: int) -> str:
    """c[i][0:nv*L] (=, or += with `add`) the sum over taps t and k < K of
    a[i][toff[t] + k * sa] * b[boff[t] + k * ldb + 0:nv*L], for the tile's m rows."""
    acc = [[f"c{i}_{v}" for v in range(nv)] for i in range(m)]
    lanes = f"OPK_GL_{tag.upper()}"
    vec, vecu = f"opk_gv{tag}", f"opk_gv{tag}u"
    lines = [f"static void opk_ukr_{tag}_{m}x{nv}(const {ctype} *const *a, const Py_ssize_t *toff, "
             f"int ntaps, Py_ssize_t K, Py_ssize_t sa, const {ctype} *b, const Py_ssize_t *boff, "
             f"Py_ssize_t ldb, "
             f"{ctype} *c, Py_ssize_t ldc, Py_ssize_t ldo, int add)",
             "{",
             "#if defined(__clang__)",
             "#pragma clang fp contract(fast)",
             "#endif",
             f"    {vec} " + ", ".join(x for row in acc for x in row) + ";"]
    lines += ["    " + " ".join(f"{x} = ({vec}){{0}};" for x in row) for row in acc]
    lines += ["    for (int t = 0; t < ntaps; t++) {"]
    lines += [f"        const {ctype} *a{i} = a[{i}] + toff[t];" for i in range(m)]
    lines += [f"        const {ctype} *bt = b + boff[t];",
              "        for (Py_ssize_t k = 0; k < K; k++, bt += ldb) {"]
    lines += [f"            const {vec} b{v} = *(const {vecu} *)(bt + {v} * {lanes});"
              for v in range(nv)]
    for i in range(m):
        lines.append(f"            {{ const {ctype} s = *a{i}; a{i} += sa; "
                     + " ".join(f"{acc[i][v]} += b{v} * s;" for v in range(nv)) + " }")
    lines += ["        }", "    }", "    if (ldo == 1) {"]
    for i in range(m):
        ptrs = [f"({vecu} *)(c + {i} * ldc + {v} * {lanes})" for v in range(nv)]
        lines.append("        if (add) { " + " ".join(f"{acc[i][v]} += *{ptrs[v]};" for v in range(nv))
                     + " }")
        lines.append("        " + " ".join(f"*{ptrs[v]} = {acc[i][v]};" for v in range(nv)))
    # channel-major blocks (NCHW): each lane to its channel's row
    lines += ["    } else {",
              f"        for (int l = 0; l < {lanes}; l++) {{"]
    for i in range(m):
        lines.append("            " + " ".join(
            f"c[{i} * ldc + ({v} * {lanes} + l) * ldo] = {acc[i][v]}[l] + "
            f"(add ? c[{i} * ldc + ({v} * {lanes} + l) * ldo] : 0);" for v in range(nv)))
    lines += ["        }", "    }", "}"]
    return "\n".join(lines)


def _table(tag: str, shape: TileShape) -> List[str]:
    rows = MAX_ROWS
    out = [f"OPK_GEMM_FN const opk_ukr_{tag} {GEMM_TABLES}{tag}[{shape.max_nv + 1}][{rows + 1}] = {{",
           "    {" + ", ".join(["NULL"] * (rows + 1)) + "},"]
    for nv in range(1, shape.max_nv + 1):
        names = ["NULL"] + [f"opk_ukr_{tag}_{m}x{nv}" if m <= shape.rows(nv) else "NULL"
                            for m in range(1, rows + 1)]
        out.append("    {" + ", ".join(names) + "},")
    out.append("};")
    return out


def _shapes(vector_bytes: int):
    """(tag, C type, element bytes, tile shape) of each compute type."""
    return [(tag, ctype, elem, tile_shape(vector_bytes, elem)) for tag, ctype, elem in C_TYPES]


def gemm_declarations(vector_bytes: int) -> str:
    """What a module's fused calls need of the micro-kernels: the tile constants, the vector
    types and the tables of kernels by [channel vectors][rows], which the runtime defines."""
    out = ["/* @generated by opkit/codegen/gemm.py: the GEMM micro-kernels' declarations */",
           f"#define OPK_GEMM_MAXROWS {MAX_ROWS}",
           "#if defined(__GNUC__)",
           '#define OPK_GEMM_FN __attribute__((visibility("hidden")))',
           "#else",
           "#define OPK_GEMM_FN",
           "#endif"]
    for tag, ctype, elem, shape in _shapes(vector_bytes):
        out += [f"#define OPK_GL_{tag.upper()} {shape.lanes}",
                f"#define OPK_GNV_{tag.upper()} {shape.max_nv}",
                f"typedef {ctype} opk_gv{tag} __attribute__((vector_size({shape.lanes * elem})));",
                f"typedef {ctype} opk_gv{tag}u __attribute__((vector_size({shape.lanes * elem}), "
                f"aligned({elem})));",
                f"typedef void (*opk_ukr_{tag})(const {ctype} *const *, const Py_ssize_t *, int, "
                f"Py_ssize_t, Py_ssize_t, const {ctype} *, const Py_ssize_t *, Py_ssize_t, {ctype} *, "
                f"Py_ssize_t, Py_ssize_t, int);",
                f"OPK_GEMM_FN extern const opk_ukr_{tag} "
                f"{GEMM_TABLES}{tag}[{shape.max_nv + 1}][{MAX_ROWS + 1}];"]
    return "\n".join(out) + "\n"


def gemm_definitions(vector_bytes: int) -> str:
    """The micro-kernels (float and double) and their tables: compiled once per toolchain into
    an object of their own (builder/runtime.py), after gemm_declarations, and linked by the
    modules that call them."""
    out = ["/* @generated by opkit/codegen/gemm.py: register-tiled GEMM micro-kernels */",
           "#if defined(__GNUC__) && !defined(__clang__)",
           "#pragma GCC push_options",
           '#pragma GCC optimize("fp-contract=fast")',
           "#endif"]
    for tag, ctype, _, shape in _shapes(vector_bytes):
        for nv in range(1, shape.max_nv + 1):
            for m in range(1, shape.rows(nv) + 1):
                out.append(_kernel(tag, ctype, m, nv))
        out += _table(tag, shape)
    out += ["#if defined(__GNUC__) && !defined(__clang__)", "#pragma GCC pop_options", "#endif"]
    return "\n".join(out) + "\n"


def describe(vector_bytes: int) -> str:
    f = tile_shape(vector_bytes, 4)
    return (f"opkit micro-kernel, {f.rows(f.max_nv)} pixels x {f.max_nv * f.lanes} channels "
            f"float32 tile ({vector_bytes}-byte vectors, {f.registers} registers)")
