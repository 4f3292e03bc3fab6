"""The training-side state tiers: host memory, a peer node's memory, durable storage.

Imported by a training job through :mod:`foreshock.mitigator.hook`; needs torch and nothing of the
cluster-side services (no Kafka client, no policy, no scheduler adapters).
"""
