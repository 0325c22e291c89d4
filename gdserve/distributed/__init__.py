"""Tensor parallelism's process group and its collectives. Imports only torch: the layers use it
inside the forward, the engine to start and stop the group."""
