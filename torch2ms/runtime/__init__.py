"""Running what the stages made, on this machine: MindSpore helpers (``msutil``: build a generated
network, time it), the oneDNN CPU setting chosen before MindSpore is imported (``cpu``), memory
and latency measurement (``memory``, ``latency``) and the MindIR file layout (``mindir_layout``)."""
