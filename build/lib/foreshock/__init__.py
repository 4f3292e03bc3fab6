"""The composition root: CLI, configuration and the embedded demo wiring."""
