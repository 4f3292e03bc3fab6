"""Feature definitions, the batch engine and the online engine: one spec, two executors."""
