"""What the export stage (``stages/export.py``) does, one concern per module:

- ``pytorch``: run the PyTorch model on the samples (with the ``hooks``) for the reference outputs;
- ``exporters``: the exporter fallback chain that writes ``model.onnx``;
- ``hooks``: BatchNorm calls and the activation range, counted while PyTorch runs;
- ``floor``: the float32 noise floor (PyTorch float32 against float64).
"""
