"""The mapping between torch's export schema and pt2b's, used by both directions: schema_map (how a
dataclass field goes on the wire), dtypes (torch dtype <-> ScalarType), return_types (serialized
names of torch.return_types), module_stacks (nn_module_stack text torch cannot round-trip)."""
