"""Tools around the conversion, not part of it: the supported-operator table (``ops_table``,
``torch2ms ops``) and new weights for a converted network (``load_weights``, ``torch2ms
load-weights``). Nothing here is in the conversion fingerprint (``pipeline.fingerprint``), so
editing a tool does not re-convert a cached run."""
