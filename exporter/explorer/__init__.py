"""The opset explorer: what lowering a corpus of programs to a preset or a backend's supported ops
gives, for `pt2b opset coverage|page|closure|audit` (exporter/cli/opset.py). An upper layer: it
drives the lowering (exporter/lowering/), which never imports it. See docs/explorer.md.

  corpus.py       the corpus programs and their decomposition routes (traced, or as shipped)
  route_trace.py  the routes of one program, recorded during one real lowering
  selection.py    a selection evaluated over the routes as the page does it; `pt2b opset closure`
  page.py         the page's data and the self-contained HTML file (page.html)
  coverage.py     `pt2b opset coverage`: the corpus lowered for real, the ops to implement next
  audit.py        `pt2b opset audit`: the measured numerics of every preset decomposition
"""
