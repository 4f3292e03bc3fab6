"""Mitigation policy, action adapters, audit log and the training-side hook.

Import the hook from :mod:`mitigator.hook` (it needs torch); everything here is torch-free.
"""

from mitigator.audit import AuditLog
from mitigator.channels import CHANNELS, Command, FileChannel, TopicChannel
from mitigator.engine import MitigationEngine
from mitigator.executor import Executor, Outcome
from mitigator.jobs import FileJobs, StaticJobs
from mitigator.lifecycle import NodeState
from mitigator.plan import Action, JobView, NodeView, Plan
from mitigator.policy import POLICIES, ExpectedLossPolicy, PolicyConfig, PolicyContext
from mitigator.schedulers import SCHEDULERS, NoScheduler, SlurmAdapter
from mitigator.service import MitigationService, pin_request

__all__ = [
    "Action", "AuditLog", "CHANNELS", "Command", "ExpectedLossPolicy", "Executor", "FileChannel", "FileJobs",
    "JobView", "MitigationEngine", "MitigationService", "NodeState", "NodeView", "NoScheduler", "Outcome",
    "POLICIES", "Plan", "PolicyConfig", "PolicyContext", "SCHEDULERS", "SlurmAdapter", "StaticJobs",
    "TopicChannel", "pin_request",
]
