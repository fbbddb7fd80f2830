"""Where each op of a converted network runs on an Ascend 310, and the Atlas tuning advice.

``ascend310.json`` holds the facts derived from CANN's AI Core op list and MindSpore's AI CPU
kernels (``generate.py`` rebuilds it), ``lowering.py`` maps MindSpore calls to CANN ops,
``placement.py`` places a graph, ``advice.py`` measures the tuning rules, ``report.py`` prints both.
"""
