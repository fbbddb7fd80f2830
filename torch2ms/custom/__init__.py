"""A user's own ops: converter plugins (``plugins``) and their AOT C++ kernels (``aot``)."""
