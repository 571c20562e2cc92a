"""What a retrace of an exported program takes from torch's private modules: the decomposition registry
(torch._decomp) and its decompositions module, torch.export's helpers for CompositeImplicitAutograd ops,
fake modes and subgraph names (torch._export.utils) and for a rebuilt program's shape environment, call
graph and ranges (torch.export.exported_program), the higher-order ops (torch._higher_order_ops) and the
autocast calls a pre-dispatch program makes (torch.amp.autocast_mode)."""

from torch._decomp import decomposition_table
from torch._decomp import decompositions
from torch._export.utils import _collect_all_valid_cia_ops_for_aten_namespace as collect_all_valid_cia_ops_for_aten_namespace
from torch._export.utils import _detect_fake_mode_from_gm as detect_fake_mode_from_gm
from torch._export.utils import _get_decomp_for_cia as get_decomp_for_cia
from torch._export.utils import _is_cia_op as is_cia_op
from torch._export.utils import _is_preservable_cia_op as is_preservable_cia_op
from torch._export.utils import _materialize_cpp_cia_ops as materialize_cpp_cia_ops
from torch._export.utils import _name_hoo_subgraph_placeholders as name_hoo_subgraph_placeholders
from torch._export.utils import _special_op_to_preserve_cia as special_op_to_preserve_cia
from torch._higher_order_ops.cond import cond_op
from torch._higher_order_ops.effects import has_effects, with_effects
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.map import map_dense, map_impl
from torch._higher_order_ops.while_loop import while_loop, while_loop_dense, while_loop_op
from torch._higher_order_ops.wrap import wrap_with_autocast, wrap_with_set_grad_enabled
from torch.amp.autocast_mode import _enter_autocast as enter_autocast
from torch.amp.autocast_mode import _exit_autocast as exit_autocast
from torch.export.exported_program import _get_shape_env as get_shape_env
from torch.export.exported_program import _get_updated_module_call_graph as get_updated_module_call_graph
from torch.export.exported_program import _get_updated_range_constraints as get_updated_range_constraints

__all__ = ["collect_all_valid_cia_ops_for_aten_namespace", "cond_op", "decomposition_table", "decompositions",
           "detect_fake_mode_from_gm", "enter_autocast", "exit_autocast", "get_decomp_for_cia", "get_shape_env",
           "get_updated_module_call_graph", "get_updated_range_constraints", "has_effects", "hop_map",
           "is_cia_op", "is_preservable_cia_op", "map_dense", "map_impl", "materialize_cpp_cia_ops",
           "name_hoo_subgraph_placeholders", "special_op_to_preserve_cia", "while_loop", "while_loop_dense",
           "while_loop_op", "with_effects", "wrap_with_autocast", "wrap_with_set_grad_enabled"]
