class EngineDeadError(RuntimeError):
    """The engine has shut down, its thread died, or a tensor-parallel rank failed: it takes no
    more requests."""
