"""Collectors: NVML, dcgm-exporter, kernel log (Xid), InfiniBand sysfs, and the node states of a
Slurm or Kubernetes cluster, each registered by name.

``create_collector(name, CollectorOptions(...))`` builds one; ``parser_for(name)`` gives the parser
of a captured file of that source (``kmsg``, ``dcgm``, ``ib``). Importing this package registers
all of them.
"""

from foreshock.ingest.collectors import dcgm, infiniband, kmsg, kube_nodes, nvml, slurm  # noqa: F401 - registration
from foreshock.ingest.collectors.base import (
    Collector,
    CollectorOptions,
    CollectorUnavailable,
    Draining,
    ParseReport,
    ParseResult,
    collector_names,
    create_collector,
    parser_for,
    parser_names,
)

__all__ = [
    "Collector",
    "CollectorOptions",
    "CollectorUnavailable",
    "Draining",
    "ParseReport",
    "ParseResult",
    "collector_names",
    "create_collector",
    "parser_for",
    "parser_names",
]
