"""Lowering after load: functionalization, decomposition presets and supported-ops closure,
verification against the declared opset. Each step is a small module of its own."""
