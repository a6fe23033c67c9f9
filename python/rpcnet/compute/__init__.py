"""Device executors, graph plans and kernels."""
