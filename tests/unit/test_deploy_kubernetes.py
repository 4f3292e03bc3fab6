"""deploy/kubernetes/ read by the official ``kubernetes`` client's models, and tied to the CLI.

No API server runs here (no kube-apiserver in the package sources), so each manifest is checked
against the client's models strictly: every key must be a field of its model with the right type
(the client itself ignores unknown keys), then the client deserializes it, which refuses a
missing required field. The rest are the promises the docs make: every container runs a valid
``foreshock`` command line, the probes, resources and budgets are there, Services select real pods
on real ports, the node collectors mount the host read-only, and Prometheus' DNS names exist.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import kubernetes.client as k8s
import pytest
import typer
import yaml

from foreshock.cli import app

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
MADE_BY_THE_OPERATOR = {"foreshock-dcgm-counters"}  # the ConfigMap 00-namespace.yaml says to create


def documents() -> list[tuple[str, dict]]:
    return [(f.name, d) for f in MANIFESTS for d in yaml.safe_load_all(f.read_text()) if d]


def of_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for _, d in documents() if d["kind"] == kind}


def strict(data, type_name: str, where: str) -> None:
    """Every key of ``data`` is a field of the model ``type_name`` (recursively), of the right type."""
    if type_name == "str":
        assert isinstance(data, str), f"{where}: expected a string, got {data!r}"
    elif type_name == "int":
        assert isinstance(data, int) and not isinstance(data, bool), f"{where}: expected an integer"
    elif type_name == "bool":
        assert isinstance(data, bool), f"{where}: expected true or false"
    elif type_name in ("object", "float", "datetime", "bytes"):
        return  # int-or-string, quantities and free-form fields
    elif m := re.fullmatch(r"[Ll]ist\[(.+)\]", type_name):
        assert isinstance(data, list), f"{where}: expected a list"
        for i, item in enumerate(data):
            strict(item, m.group(1), f"{where}[{i}]")
    elif m := re.fullmatch(r"[Dd]ict\[str, (.+)\]", type_name):
        assert isinstance(data, dict), f"{where}: expected a mapping"
        for key, value in data.items():
            strict(value, m.group(1), f"{where}.{key}")
    else:
        model = getattr(k8s, type_name)
        assert isinstance(data, dict), f"{where}: expected a {type_name} mapping"
        fields = {wire: attr for attr, wire in model.attribute_map.items()}
        for key, value in data.items():
            assert key in fields, f"{where}: {key!r} is not a field of {type_name}"
            strict(value, model.openapi_types[fields[key]], f"{where}.{key}")


def model_name(doc: dict) -> str:
    version = doc["apiVersion"].rsplit("/", 1)[-1]
    return version.capitalize() + doc["kind"]


@pytest.mark.parametrize(("name", "doc"), documents(), ids=lambda x: x if isinstance(x, str) else x["kind"])
def test_every_manifest_is_a_valid_object_of_the_official_client(name, doc):
    strict(doc, model_name(doc), f"{name}:{doc['kind']}")
    # the client's own models (pydantic) refuse a missing required field or a value of the wrong type
    obj = k8s.ApiClient().deserialize(json.dumps(doc), model_name(doc), "application/json")
    assert obj.metadata.name == doc["metadata"]["name"]
    if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding", "Namespace"):
        assert obj.metadata.namespace == "foreshock"


def pod_specs() -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"] for _, d in documents()
            if d["kind"] in ("Deployment", "DaemonSet")}


def foreshock_containers() -> list[tuple[str, dict]]:
    return [(f"{w}/{c['name']}", c) for w, spec in pod_specs().items() for c in spec["containers"]
            if c.get("command") == ["foreshock"]]


@pytest.mark.parametrize(("where", "container"), foreshock_containers(),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_every_container_runs_a_command_line_the_cli_accepts(where, container):
    group = typer.main.get_command(app)
    name, *args = container["args"]
    command = group.get_command(typer.Context(group), name)
    with command.make_context(name, list(args)) as ctx:  # click's own parsing: unknown flags, bad values
        assert ctx.params
    for var in re.findall(r"\$\((\w+)\)", " ".join(args)):
        assert var in {e["name"] for e in container.get("env", [])}, f"{where}: $({var}) is not defined"


def test_serve_and_mitigate_have_probes_resources_services_and_a_budget():
    deployments, services = of_kind("Deployment"), of_kind("Service")
    budgets = of_kind("PodDisruptionBudget")
    for name in ("foreshock-serve", "foreshock-mitigate"):
        [container] = deployments[name]["spec"]["template"]["spec"]["containers"]
        port = container["ports"][0]["containerPort"]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
        assert container["resources"]["requests"] and container["resources"]["limits"]
        labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert budgets[name]["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert services[name]["spec"]["ports"][0]["targetPort"] == port
    assert deployments["foreshock-mitigate"]["spec"]["replicas"] == 1


def test_every_service_selects_pods_on_ports_they_open():
    templates = [d["spec"]["template"] for d in {**of_kind("Deployment"), **of_kind("DaemonSet")}.values()]
    pods = [(t["metadata"]["labels"], {p["containerPort"] for c in t["spec"]["containers"]
                                       for p in c["ports"]}) for t in templates]
    for name, service in of_kind("Service").items():
        selector = service["spec"]["selector"].items()
        selected = [ports for labels, ports in pods if selector <= labels.items()]
        assert selected, f"Service {name} selects no pod"
        for port in service["spec"]["ports"]:
            assert any(port["targetPort"] in ports for ports in selected), (name, port)


def test_node_collectors_read_the_host_read_only_and_know_their_node():
    spec = pod_specs()["foreshock-collectors"]
    containers = {c["name"]: c for c in spec["containers"]}
    assert {"kmsg", "dcgm", "ib"} <= containers.keys()
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host["kmsg"] == "/dev/kmsg" and host["infiniband"] == "/sys/class/infiniband"
    for name in ("kmsg", "dcgm", "ib"):
        c = containers[name]
        node = next(e for e in c["env"] if e["name"] == "NODE_NAME")
        assert node["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        assert "--node" in c["args"] and c["args"][c["args"].index("--node") + 1] == "$(NODE_NAME)"
        for mount in c["volumeMounts"]:
            if mount["name"] in ("kmsg", "infiniband"):
                assert mount["readOnly"] is True
    dcgm = containers["dcgm"]["args"]
    assert dcgm[dcgm.index("--url") + 1].startswith("http://localhost:9400")  # the exporter beside it
    assert spec["automountServiceAccountToken"] is False


def test_secrets_and_config_maps_referenced_exist():
    secrets, maps = of_kind("Secret"), of_kind("ConfigMap")
    text = json.dumps([d for _, d in documents()])
    for name in re.findall(r'"secretName": "([^"]+)"', text):
        assert name in secrets
    for name, key in re.findall(r'"configMapKeyRef": \{"name": "([^"]+)", "key": "([^"]+)"\}', text):
        assert key in maps[name]["data"]
    for name in re.findall(r'"configMap": \{"name": "([^"]+)"\}', text):
        assert name in maps or name in MADE_BY_THE_OPERATOR
    serve = pod_specs()["foreshock-serve"]["containers"][0]["args"]
    assert serve[serve.index("--token-file") + 1] == "/etc/foreshock/token/token"


def test_prometheus_finds_every_component_through_a_headless_service():
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus-kubernetes.yml").read_text())
    services = of_kind("Service")
    for job in config["scrape_configs"]:
        for sd in job["dns_sd_configs"]:
            for dns in sd["names"]:
                name, namespace = dns.split(".")[:2]
                assert namespace == "foreshock" and services[name]["spec"]["clusterIP"] == "None", dns
                assert sd["port"] in {p["port"] for p in services[name]["spec"]["ports"]}, dns


def test_no_role_grants_more_than_the_mitigator_and_the_node_state_collector_need():
    roles = of_kind("ClusterRole")
    assert set(roles) == {"foreshock-mitigate", "foreshock-node-states"}
    bound = {b["roleRef"]["name"]: [s["name"] for s in b["subjects"]]
             for b in of_kind("ClusterRoleBinding").values()}
    assert bound == {name: [name] for name in roles}
    accounts = {spec.get("serviceAccountName") for spec in pod_specs().values()}
    assert accounts == {"foreshock-mitigate", "foreshock-node-states", "foreshock-workload"}
    assert all("*" not in json.dumps(r["rules"]) for r in roles.values())
