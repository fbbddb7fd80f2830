"""Per-op converter tests against onnxruntime (a package, so its conftest does not shadow tests/conftest.py)."""
