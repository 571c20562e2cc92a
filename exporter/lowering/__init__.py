"""Lowering after load: decomposition presets and supported-ops closure, the engines that apply the
table through functionalization (engines/), the opset check of the result. Each step is a small
module of its own."""
