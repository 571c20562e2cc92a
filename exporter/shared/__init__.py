"""The shared core: what exporter/ and runtime_ref/ both stand on (op names, graph walks, region markers,
dim names, mutation predicates, the caller's process state); runtime_ref takes exporter's internals from here alone."""

from .. import dims
from ..mutation import is_mutating, updates_hidden_state
from ..graph_walk import call_nodes, count_calls, subgraph_of, walk_graphs
from ..ops import OpSpec, normalize_text, op_name, resolve_op
from ..util.process_state import preserved
from .regions import (REGION_HOP_NAMES, autocast_devices, autocast_steps, has_regions, is_autocast_marker, is_region,
                      is_region_marker)

__all__ = ["OpSpec", "REGION_HOP_NAMES", "autocast_devices", "autocast_steps", "call_nodes", "count_calls", "dims",
           "has_regions", "is_autocast_marker", "is_mutating", "is_region", "is_region_marker", "normalize_text",
           "op_name", "preserved", "resolve_op", "subgraph_of", "updates_hidden_state", "walk_graphs"]
