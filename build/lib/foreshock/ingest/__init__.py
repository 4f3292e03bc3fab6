"""Telemetry contract, collectors, the bus (Kafka and in-memory) and the cluster simulator.

Imports nothing else of Foreshock: everything downstream reads what this package defines.
"""
