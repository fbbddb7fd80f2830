"""The converter plugin being imported (``plugins.load``): what its ``@converter`` calls and its
``AotKernel`` declarations are recorded under."""

LOADING_PLUGIN: list[str] = []
