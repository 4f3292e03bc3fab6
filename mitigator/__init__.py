"""Mitigation policy, action adapters, audit log and the training-side hook."""
