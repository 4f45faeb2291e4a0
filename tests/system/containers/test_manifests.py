"""The deployment files, checked without an engine: Kubernetes manifests against a vendored
structural schema plus cross-references, `docker-compose config`, the Dockerfile's base."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sidecar.config import build_config
from tests.system.containers import k8s_schema

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
DOCKER = ROOT / "deploy" / "docker"
COMPOSE = ROOT / "compose" / "docker-compose.yml"


def _k8s_docs() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def _by_kind(kind: str) -> list[dict]:
    return [d for _, d in _k8s_docs() if d.get("kind") == kind]


def _metrics_port_from_image_config() -> int:
    text = (DOCKER / "node.toml").read_text()
    return int(re.search(r'metrics\s*=\s*"[^"]*:(\d+)"', text).group(1))


def _exposed_ports() -> set[int]:
    text = (DOCKER / "Dockerfile").read_text()
    node_stage = text[text.index("AS node"):]
    return {int(p) for p in re.search(r"^EXPOSE (.+)$", node_stage, re.M).group(1).split()}


def test_k8s_manifests_match_the_schema():
    docs = _k8s_docs()
    assert {d["kind"] for _, d in docs} >= {"StatefulSet", "Service", "PodDisruptionBudget",
                                             "ConfigMap", "Kustomization"}
    errors = [e for name, d in docs for e in k8s_schema.validate(d, f"{name}: ")]
    assert not errors, "\n".join(errors)
    kustomization = _by_kind("Kustomization")[0]
    listed = set(kustomization["resources"])
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == files, f"kustomization resources {listed} != files {files}"


def test_the_schema_catches_mistakes():
    sts = yaml.safe_load((K8S / "statefulset.yaml").read_text())
    container = sts["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    container["ports"][0]["containerPort"] = "1883"
    errors = k8s_schema.validate(sts)
    assert any("unknown field 'readinesProbe'" in e for e in errors), errors
    assert any("containerPort: expected integer" in e for e in errors), errors
    assert k8s_schema.validate({"apiVersion": "apps/v1beta1", "kind": "StatefulSet"})


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_k8s_references_are_consistent():
    services = {s["metadata"]["name"]: s for s in _by_kind("Service")}
    configmaps = {c["metadata"]["name"]: c for c in _by_kind("ConfigMap")}
    statefulsets = {s["metadata"]["name"]: s for s in _by_kind("StatefulSet")}
    node = statefulsets["mqfed"]
    for sts in statefulsets.values():
        spec = sts["spec"]
        labels = spec["template"]["metadata"]["labels"]
        assert _matches(spec["selector"]["matchLabels"], labels)
        assert spec["serviceName"] in services, f"no Service {spec['serviceName']}"
        pod = spec["template"]["spec"]
        volumes = {v["name"] for v in pod.get("volumes", [])}
        volumes |= {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
        for c in pod["containers"]:
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, f"{c['name']}: volume {m['name']} not defined"
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                assert port is None or port in ports or isinstance(port, int), (probe, port)
            defined: set[str] = set()
            for env in c.get("env", []):
                for ref in re.findall(r"\$\((\w+)\)", env.get("value", "")):
                    assert ref in defined, f"{env['name']} uses $({ref}) before it is defined"
                defined.add(env["name"])
            for src in c.get("envFrom", []):
                if "configMapRef" in src:
                    assert src["configMapRef"]["name"] in configmaps
    # every Service selects pods of some StatefulSet and targets ports they name
    for name, svc in services.items():
        owners = [s for s in statefulsets.values()
                  if _matches(svc["spec"]["selector"], s["spec"]["template"]["metadata"]["labels"])]
        assert owners, f"Service {name} selects no pods"
        named = {p["name"] for s in owners for c in s["spec"]["template"]["spec"]["containers"]
                 for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert isinstance(target, int) or target in named, f"{name}: no port {target}"
    assert services[node["spec"]["serviceName"]]["spec"].get("clusterIP") == "None", \
        "the StatefulSet's service must be headless (stable per-pod DNS names for peers)"
    assert services[node["spec"]["serviceName"]]["spec"].get("publishNotReadyAddresses")
    # the PDB covers the nodes
    pdb = _by_kind("PodDisruptionBudget")[0]
    assert _matches(pdb["spec"]["selector"]["matchLabels"],
                    node["spec"]["template"]["metadata"]["labels"])


def test_k8s_node_container_matches_the_image_and_the_sidecar_config():
    node = next(s for s in _by_kind("StatefulSet") if s["metadata"]["name"] == "mqfed")
    c = node["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert set(ports.values()) <= _exposed_ports()
    # readiness and liveness from the sidecar's health endpoints on its metrics listener
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert ports[c[probe]["httpGet"]["port"]] == _metrics_port_from_image_config()
    # the etcd endpoints and every other setting are valid sidecar configuration
    env = dict(_by_kind("ConfigMap")[0]["data"])
    env.update({e["name"]: e["value"].replace("$(POD_NAME)", "mqfed-0")
                .replace("$(POD_NAMESPACE)", "default") for e in c["env"] if "value" in e})
    config = build_config({}, env={k: v for k, v in env.items() if k.startswith("MQFED_")})
    assert config.node_id == "mqfed-0"
    assert config["membership"]["etcd"], "no etcd endpoints configured"
    for key in ("grpc", "admin"):  # what peers dial: the pod's stable name, never 0.0.0.0
        assert config[key]["listen"].startswith(
            f"mqfed-0.{node['spec']['serviceName']}.default.svc.cluster.local:")


def _compose_config(**env: str) -> dict:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed (`make install` installs Debian's)")
    result = subprocess.run([binary, "-f", str(COMPOSE), "config"], capture_output=True,
                            text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **env})
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    return yaml.safe_load(result.stdout)


def test_compose_file_validates_and_matches_the_design():
    cfg = _compose_config()
    services = cfg["services"]
    assert set(services) == {"etcd", "n1", "n2", "n3", "front", "prometheus"}
    # published ports: the front on 1883, admin and metrics per node; dev default loopback
    published = {name: [str(p) for p in svc.get("ports", [])] for name, svc in services.items()}
    assert "127.0.0.1:1883:1883/tcp" in published["front"]
    for name in ("n1", "n2", "n3"):
        assert any(p.endswith(":7101/tcp") for p in published[name]), published[name]
    for name, ports in published.items():
        for p in ports:
            assert p.startswith("127.0.0.1:"), f"{name} publishes {p} beyond loopback"
    assert "ports" not in services["etcd"]
    assert cfg["networks"]["cluster"].get("internal") is True
    # HAProxy's backend lists exactly the node services; each node's config is valid
    haproxy = (DOCKER / "haproxy.cfg").read_text()
    servers = re.findall(r"^\s*server (\S+) (\S+):1883", haproxy, re.M)
    assert {s for s, _ in servers} == {"n1", "n2", "n3"}
    for name in ("n1", "n2", "n3"):
        svc = services[name]
        env = {k: str(v) for k, v in svc["environment"].items()}
        config = build_config({}, env=env)
        assert config.node_id == name
        peer_host = config["grpc"]["listen"].rpartition(":")[0]
        assert peer_host in svc["networks"]["cluster"]["aliases"], \
            f"{name}: its gRPC address {peer_host} is not its name on the cluster network"
        assert set(svc["networks"]) == {"front", "cluster"}
        admin_host = config["admin"]["listen"].rpartition(":")[0]
        assert admin_host in svc["networks"]["front"]["aliases"], \
            f"{name}: its admin address {admin_host} is not its name on the front network"
    assert set(services["front"]["networks"]) == {"front"}


def test_compose_prometheus_scrapes_each_node_and_stays_on_loopback():
    """The Prometheus service scrapes exactly the node services, by their names on the
    network it shares with them, and is published on 127.0.0.1 even when MQFED_BIND exposes
    the rest (its UI and API have no login)."""
    cfg = _compose_config(MQFED_BIND="0.0.0.0")
    services = cfg["services"]
    prom = services["prometheus"]
    assert [str(p) for p in prom["ports"]] == ["127.0.0.1:9090:9090/tcp"]
    assert any(str(p).startswith("0.0.0.0:") for p in services["front"]["ports"])
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert scrape["rule_files"] == ["alerts.yml"]
    [job] = scrape["scrape_configs"]
    targets = {t["labels"]["node"]: t["targets"] for t in job["static_configs"]}
    nodes = {n for n in services if re.fullmatch(r"n\d+", n)}
    assert set(targets) == nodes
    port = _metrics_port_from_image_config()
    for name, [target] in targets.items():
        host, _, target_port = target.rpartition(":")
        assert int(target_port) == port
        shared = set(prom["networks"]) & set(services[name]["networks"])
        assert any(host in (services[name]["networks"][net] or {}).get("aliases", [])
                   for net in shared), f"Prometheus cannot reach {target} on {shared}"
    # the image is built with those two files, side by side, and checks them while it builds
    text = (DOCKER / "Dockerfile").read_text()
    stage = text[text.index("AS prometheus"):text.index("AS build")]
    assert "COPY prometheus.yml alerts.yml /etc/mqfed/prometheus/" in stage
    assert "promtool check config" in stage


def test_dockerfile_takes_the_base_image_as_an_argument():
    text = (DOCKER / "Dockerfile").read_text()
    first = next(line for line in text.splitlines() if line and not line.startswith("#"))
    assert first == "ARG BASE_IMAGE=debian:bookworm-slim"
    assert "FROM ${BASE_IMAGE} AS base" in text


def test_k8s_pods_drain_before_they_stop():
    """Issue 20: a rolling update replaces one pod at a time, each drained first by its
    preStop hook, within the termination grace period; the next waits for readiness."""
    sts = next(s for s in _by_kind("StatefulSet") if s["metadata"]["name"] == "mqfed")
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    command = " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    assert "mqfed ctl" in command and 'drain "$MQFED_NODE_ID"' in command and "--wait" in command
    names = {e["name"] for e in container["env"]}
    assert {"MQFED_NODE_ID", "MQFED_ADMIN_LISTEN", "MQFED_ADMIN_TOKEN"} <= names
    wait = int(re.search(r"--wait-timeout (\d+)", command).group(1))
    assert pod["terminationGracePeriodSeconds"] >= wait + 20  # then the graceful leave
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert spec["updateStrategy"]["type"] == "RollingUpdate" and spec["minReadySeconds"] >= 5
    pdb = next(p for p in _by_kind("PodDisruptionBudget") if p["metadata"]["name"] == "mqfed")
    assert pdb["spec"]["maxUnavailable"] == 1


def test_the_compose_front_checks_readiness():
    """A draining node fails /readyz: the front stops sending it clients."""
    haproxy = (DOCKER / "haproxy.cfg").read_text()
    assert re.search(r"^\s*option httpchk GET /readyz$", haproxy, re.M)
    port = int(re.search(r"check port (\d+)", haproxy).group(1))
    assert port == _metrics_port_from_image_config()
