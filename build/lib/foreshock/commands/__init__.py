"""One module per area; each exposes ``register(app)`` to add its commands."""
