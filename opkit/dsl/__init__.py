"""Stage 2: expressions → graphs; dtype and dims inference; backward derivation."""
from .graph import Graph, OpGraphs, build_graphs
from .ir import Node, format_expr, topo_order
from .library import LIBRARY
from .primitives import PRIMITIVES

__all__ = ["Graph", "OpGraphs", "build_graphs", "Node", "format_expr", "topo_order", "LIBRARY",
           "PRIMITIVES"]
