"""Mitigation policy, action adapters, audit log and the training-side hook.

Import what you need from its module (``foreshock.mitigator.engine``, ``foreshock.mitigator.hook``, …):
this package imports nothing by itself, so a training job that imports :mod:`foreshock.mitigator.hook`
loads torch and the tiers, not the Kafka client, the policy or the scheduler adapters.
"""
