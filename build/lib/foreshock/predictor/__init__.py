"""Stream scoring service, the risk HTTP API and Prometheus metrics."""
