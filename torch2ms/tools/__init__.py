"""Tools around the conversion, not part of it: the ONNX conformance harness (``torch2ms ops
--conformance``). Nothing here is in the conversion fingerprint (``pipeline.fingerprint``), so
editing a tool does not re-convert a cached run."""
