"""tagma: contiguous-range KV cache placement for vLLM (the system under test).

`tagma.engine` binds the C++ range engine; importing this package never requires the engine to be built.
"""

__version__ = "0.1.0"
