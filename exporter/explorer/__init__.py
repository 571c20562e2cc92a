"""The opset explorer: what lowering a corpus of programs to a preset or a backend's supported ops gives,
for `pt2b opset coverage|page|closure|audit` (exporter/cli/opset.py). An upper layer: it drives the
lowering, which never imports it. Why and how: docs/explorer.md.

  corpus.py       the corpus programs and their routes (traced, or as shipped)
  route_trace.py  the routes of one program, recorded during one real lowering
  selection.py    a selection evaluated over the routes; `pt2b opset closure`
  page.py         the page's data and its HTML file
  coverage.py     `pt2b opset coverage`: the corpus lowered for real
  audit.py        `pt2b opset audit`: the numerics of every preset decomposition"""
