"""Format versions and the operator schema table of pt2b artifacts: version constants and their
history (formats), older-major steps (majors), the op table (op_table), op-schema drift and its
upgraders (schema_drift, upgraders), stored registries of torch releases and writing for one
(registries, retarget). exporter/serialize's reader and writer call these; nothing here imports
serialize's code (only flatc's generated classes for the op table's records)."""
