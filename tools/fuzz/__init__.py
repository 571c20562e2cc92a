"""Mutation fuzzer for .pt2b artifacts: every mutant is loaded, lowered and run in an isolated batch process.

    python -m tools.fuzz --mutants 100000 --seed 1 --workers 2 [--json out.json]
    python -m tools.fuzz --replay 1:4711 [--out mutant.pt2b] [--run]
    python -m tools.fuzz --semantic --mutants 300 --seed 1 --workers 1   (the semantic mode)
    python -m tools.fuzz --semantic --replay 1:42 --run   (--replay=-1:I: the I-th concrete attack)

Seed artifacts: small zoo models (``--models``) exported to a temporary folder. Mutant ``i`` of seed
``s`` depends only on (s, i) and the seed artifacts (which export byte-for-byte deterministically),
so any finding is replayed with ``--replay s:i``, whatever the number of workers.

Modules, by concern:
  seeds        the seed artifacts: export, layout facts, the strings of their schema trees
  schema_tree  the only conversion between flatc's object API and torch's schema dataclasses
  slots        every field of an object tree as (parent, key, value, path)
  layout       the .pt2b header: its fields, CRC repair, a seed rebuilt around a new program
  values       mutated field values: hostile targets, expressions, code-injection payloads
  mutators     the mutation kinds (KINDS) and Mutator: mutant i of seed s
  oracle       running one mutant and the rule deciding which outcomes are allowed (allowed())
  observe      the oracle's own observers: torch's process-global state, terminal output, resident memory
  worker       a batch of mutants in one process (a sweep case), both modes: references built once
  campaign     the parent: batches on the sweep runner (exporter.sweep), totals, findings, report, replay
  cli          the command line (``python -m tools.fuzz`` runs cli.main)
the semantic mode (``--semantic``: edits of the program's meaning, every entry point run, side effects watched):
  semantic_values  callables with the arguments that make them act, grown expressions, sizes, guards
  semantic_build   schema-tree edits, packing with shared FlatBuffers offsets, the concrete ATTACKS
  semantic         the semantic kinds (SEMANTIC_KINDS) and SemanticMutator: semantic mutant i of seed s
  semantic_oracle  the phases (load ... runtime_ref), side-effect watching, the semantic rule (allowed())
"""
