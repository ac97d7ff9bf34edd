"""k8s/: every overlay renders with kustomize (``kustomize build`` or ``kubectl kustomize``),
validates against the Kubernetes schemas (kubernetes-validate, strict), and runs what
``mqstore serve`` accepts: environment variables, roles, ports, probes; plus the security,
probe, disruption and network rules the deployment promises."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer.main
import yaml

from libstore import StoreConfig
from services._common.server import LIVENESS_SERVICE
from services.cli import app
from services.serve import ROLES

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
KUBERNETES_VERSION = "1.30"  # pod-index labels (apps.kubernetes.io/pod-index) need 1.28+
OVERLAYS = {"dev": ["broker-a"], "prod": ["broker-a", "broker-b"]}
ROLE_PORTS = {"commitlog": 10911, "dispatch": 10921, "index": 10931, "gateway": 8081}
METRICS_PORT = 9464
SCRAPERS = "namespaces labelled mqstore.io/metrics-scraper=true"


def _renderer() -> list[str]:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    raise AssertionError("neither kustomize nor kubectl is installed (.ci/run installs kubectl)")


def render(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run([*_renderer(), str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module", params=sorted(OVERLAYS))
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(K8S / "overlays" / request.param)


def _serve_env() -> set[str]:
    """Variables ``mqstore serve`` reads: its options' envvars and MQSTORE_<FIELD> store keys."""
    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    names = {p.envvar for p in serve.params if isinstance(p.envvar, str)}
    return names | {"MQSTORE_" + f.name.upper() for f in dataclasses.fields(StoreConfig)}


def _mqstore_containers(objs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for obj in objs:
        if obj["kind"] in ("StatefulSet", "Deployment"):
            for c in obj["spec"]["template"]["spec"]["containers"]:
                if c["image"].startswith("mqstore"):
                    yield obj, c


def _env(c: dict[str, Any], objs: list[dict[str, Any]]) -> dict[str, str]:
    """The container's variables with $(VAR) expanded as the kubelet does (earlier variables
    only), configMapKeyRef/envFrom read from the rendered ConfigMaps, POD_INDEX 1, namespace ns."""
    maps = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for src in c.get("envFrom", []):
        env.update(maps[src["configMapRef"]["name"]])
    for e in c.get("env", []):
        if "value" in e:
            undefined = set(re.findall(r"\$\((\w+)\)", e["value"])) - set(env)
            assert not undefined, f"{c['name']}: {e['name']} uses {undefined} before they are defined"
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], e["value"])
        else:
            ref = e["valueFrom"]
            if "configMapKeyRef" in ref:
                env[e["name"]] = maps[ref["configMapKeyRef"]["name"]][ref["configMapKeyRef"]["key"]]
            else:
                path = ref["fieldRef"]["fieldPath"]
                env[e["name"]] = {"metadata.namespace": "ns"}.get(path, "1")
    return env


Rendered = tuple[str, list[dict[str, Any]]]


def test_every_object_validates_against_the_kubernetes_schemas(overlay: Rendered) -> None:
    name, objs = overlay
    for obj in objs:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    kinds = {o["kind"] for o in objs}
    assert {"StatefulSet", "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds
    assert {"NetworkPolicy", "ConfigMap", "Namespace"} <= kinds
    names = [o["metadata"]["name"] for o in objs if o["kind"] == "StatefulSet"]
    groups = sorted(n.removesuffix("-commitlog") for n in names if n.endswith("-commitlog"))
    assert groups == OVERLAYS[name]
    namespace = "mqstore-dev" if name == "dev" else "mqstore"
    assert all(o["metadata"].get("namespace") == namespace for o in objs if o["kind"] != "Namespace")
    assert render(K8S / "base")  # the base renders on its own too


ADDRESS_KEYS = ("MQSTORE_COMMITLOG_ADDR", "MQSTORE_DISPATCH_ADDR", "MQSTORE_INDEX_ADDR", "MQSTORE_HA_PEERS")


def test_containers_run_what_mqstore_serve_accepts(overlay: Rendered) -> None:
    _, objs = overlay
    accepted = _serve_env()
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    pods = {o["metadata"]["name"]: o for o in objs if o["kind"] == "StatefulSet"}
    seen_roles = set()
    for workload, c in _mqstore_containers(objs):
        env = _env(c, objs)
        mq = {k for k in env if k.startswith("MQSTORE_")}
        assert mq <= accepted, f"{c['name']}: mqstore serve does not read {sorted(mq - accepted)}"
        assert "command" not in c and "args" not in c  # the image's entry point: mqstore serve
        role = env["MQSTORE_ROLE"]
        assert role in ROLES
        seen_roles.add(role)
        store_env = {k: v for k, v in env.items() if k.startswith("MQSTORE_")}
        StoreConfig.from_sources(env=store_env, overrides={})  # the store keys parse
        port = int(env["MQSTORE_LISTEN"].rpartition(":")[2])
        assert port == ROLE_PORTS[role]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["grpc"] == port
        # The Prometheus endpoint: the port mqstore serve listens on, named and annotated.
        metrics_port = int(env["MQSTORE_METRICS_LISTEN"].rpartition(":")[2])
        assert ports["metrics"] == metrics_port == METRICS_PORT
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(metrics_port)
        assert annotations["prometheus.io/path"] == "/metrics"
        if role == "commitlog":
            assert ports["ha"] == int(env["MQSTORE_HA_LISTEN"].rpartition(":")[2]) == port + 1
            assert env["MQSTORE_BROKER_ID"] == "1"  # pod 1 starts as SLAVE, as --master-role says
            assert env["MQSTORE_MASTER_ROLE"] in ("SYNC_MASTER", "ASYNC_MASTER")
        # Probes: gRPC health on the service port (on the plaintext health-only port when the
        # service port speaks TLS, which the kubelet's gRPC probes cannot); liveness/startup on
        # the always-SERVING liveness service, readiness on the overall status.
        probe_port = port
        if "MQSTORE_HEALTH_LISTEN" in env:
            probe_port = int(env["MQSTORE_HEALTH_LISTEN"].rpartition(":")[2])
            assert ports["health"] == probe_port != port
        for probe in ("startupProbe", "livenessProbe"):
            assert c[probe]["grpc"] == {"port": probe_port, "service": LIVENESS_SERVICE}
        assert c["readinessProbe"]["grpc"] == {"port": probe_port}
        # Every address a container dials names a pod of a StatefulSet through its headless
        # Service (pod <sts>-<n>.<serviceName>), on a port that pod listens on.
        for key in ADDRESS_KEYS:
            for address in filter(None, env.get(key, "").split(",")):
                host, _, p = address.rpartition(":")
                pod, svc, ns, suffix = host.split(".", 3)
                sts_name, _, ordinal = pod.rpartition("-")
                sts = pods[sts_name]
                assert (svc, ns, suffix) == (sts["spec"]["serviceName"], "ns", "svc") and svc in services
                assert int(ordinal) < sts["spec"]["replicas"]
                (container,) = sts["spec"]["template"]["spec"]["containers"]
                assert int(p) in {q["containerPort"] for q in container["ports"]}
        host, _, p = env["OTEL_EXPORTER_OTLP_ENDPOINT"].removeprefix("http://").rpartition(":")
        assert host in services and int(p) in {q["port"] for q in services[host]["spec"]["ports"]}
    assert seen_roles == set(ROLE_PORTS)


def test_security_termination_and_disruption(overlay: Rendered) -> None:
    name, objs = overlay
    for workload, c in _mqstore_containers(objs):
        spec = workload["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])  # the writable scratch
        assert "memory" in c["resources"]["limits"] and "cpu" in c["resources"]["requests"]
        pause = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
        assert spec["terminationGracePeriodSeconds"] >= pause + 20  # room to flush and checkpoint
        if workload["kind"] == "StatefulSet":
            assert any(m["mountPath"] == "/data" for m in c["volumeMounts"])
            assert workload["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
        if name == "prod":
            assert "podAntiAffinity" in spec["affinity"]
    pdbs = {o["metadata"]["name"] for o in objs if o["kind"] == "PodDisruptionBudget"}
    hpas = [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]
    for group in OVERLAYS[name]:
        assert {f"{group}-{r}" for r in ROLE_PORTS} <= pdbs
    assert {h["spec"]["scaleTargetRef"]["name"] for h in hpas} == {f"{g}-gateway" for g in OVERLAYS[name]}


def _sources(policies: dict[str, Any], group: str, policy: str, port: int) -> set[str]:
    """Components allowed to reach ``port`` of ``group``'s ``policy`` pods ("*": anyone)."""
    out = set()
    for rule in policies[f"{group}-{policy}"]["ingress"]:
        if any(p["port"] == port for p in rule["ports"]):
            for peer in rule.get("from", [{"podSelector": {"matchLabels": {}}}]):
                if "podSelector" not in peer:
                    assert peer == {
                        "namespaceSelector": {"matchLabels": {"mqstore.io/metrics-scraper": "true"}}
                    }
                    out.add(SCRAPERS)
                    continue
                labels = peer["podSelector"]["matchLabels"]
                if labels:
                    assert labels.get("mqstore.io/broker-group") == group  # never another group's pods
                out.add(labels.get("app.kubernetes.io/component", "*"))
    return out


def test_network_policies_keep_internal_ports_internal(overlay: Rendered) -> None:
    name, objs = overlay
    policies = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "NetworkPolicy"}
    for g in OVERLAYS[name]:
        assert _sources(policies, g, "commitlog", 10912) == {"commitlog"}  # replication: members only
        assert _sources(policies, g, "commitlog", 10911) == {"gateway", "dispatch", "index", "commitlog"}
        assert _sources(policies, g, "dispatch", 10921) == {"gateway"}
        assert _sources(policies, g, "index", 10931) == {"gateway"}
        assert _sources(policies, g, "gateway", 8081) == {"*"}  # clients from anywhere
        for role in ROLE_PORTS:  # metrics: only from the namespace Prometheus runs in
            assert _sources(policies, g, role, METRICS_PORT) == {SCRAPERS}


TLS_FILES = {"MQSTORE_TLS_CERT": "tls.crt", "MQSTORE_TLS_KEY": "tls.key", "MQSTORE_TLS_CA": "ca.crt"}


def _tls_secret(workload: dict[str, Any], c: dict[str, Any], env: dict[str, str]) -> str | None:
    """The Secret the container's MQSTORE_TLS_* files come from (None: TLS off); asserts the
    three variables point into one read-only mount of that Secret, at its standard keys."""
    if not any(k in env for k in TLS_FILES):
        return None
    folders = {env[k].rpartition("/")[0] for k in TLS_FILES}
    assert len(folders) == 1 and all(env[k].rpartition("/")[2] == f for k, f in TLS_FILES.items())
    folder = folders.pop()
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == folder]
    assert mount.get("readOnly") is True
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    secret = volumes[mount["name"]]["secret"]
    assert secret.get("defaultMode", 0o644) & 0o007 == 0  # the key is not world-readable
    assert workload["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 10001
    return str(secret["secretName"])


def test_prod_turns_tls_on_everywhere_and_dev_stays_plaintext(overlay: Rendered) -> None:
    name, objs = overlay
    for workload, c in _mqstore_containers(objs):
        env = _env(c, objs)
        secret = _tls_secret(workload, c, env)
        if name == "dev":
            assert secret is None
            continue
        group = env["BROKER_GROUP"]
        assert secret == f"{group}-tls", f"{workload['metadata']['name']} mounts {secret}"
        # With the CA set, every internal port requires client certificates and every channel
        # presents the pod's; the gateway does not demand clients' certificates.
        assert "MQSTORE_TLS_CLIENT_CA" not in env
        assert "MQSTORE_TLS_SERVER_NAME" not in env  # certificates name the addresses dialled


def _matches(pattern: str, host: str) -> bool:
    if pattern.startswith("*."):
        return host.partition(".")[2] == pattern[2:] and "." not in host.partition(".")[0]
    return pattern == host


def test_cert_manager_overlay_certifies_every_address_dialled() -> None:
    objs = render(K8S / "overlays" / "prod-cert-manager")
    certs = {o["spec"]["secretName"]: o["spec"] for o in objs if o["kind"] == "Certificate"}
    issuers = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "Issuer"}
    for obj in objs:
        assert obj["metadata"].get("namespace") == "mqstore" or obj["kind"] == "Namespace"
        if not obj["apiVersion"].startswith("cert-manager.io/"):
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    assert certs["mqstore-ca"]["isCA"] is True
    assert issuers["mqstore-ca"]["ca"]["secretName"] == "mqstore-ca"
    for workload, c in _mqstore_containers(objs):
        env = _env(c, objs)
        secret = _tls_secret(workload, c, env)
        assert secret is not None and secret in certs
        spec = certs[secret]
        assert spec["issuerRef"]["name"] == "mqstore-ca"
        assert {"server auth", "client auth"} <= set(spec["usages"])
        assert "127.0.0.1" in spec["ipAddresses"]  # `mqstore ha ...` inside the pod
        dialled = [a for k in ADDRESS_KEYS for a in filter(None, env.get(k, "").split(","))]
        dialled += [env[k] for k in ("MQSTORE_ADVERTISE", "MQSTORE_HA_ADVERTISE") if k in env]
        for address in dialled:
            host = address.rpartition(":")[0].replace(".ns.", ".mqstore.")
            assert any(_matches(n, host) for n in spec["dnsNames"]), f"{secret} does not name {host}"


def test_dockerfile_builds_a_non_root_image_running_mqstore_serve() -> None:
    text = (REPO / "Dockerfile").read_text()
    for src in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):
        for path in src.split():
            assert (REPO / path).exists(), f"Dockerfile copies {path}, which does not exist"
    assert re.search(r"^FROM python:3\.11-slim", text, re.M)
    user = re.findall(r"^USER (\S+)", text, re.M)[-1]
    assert user.split(":")[0] not in ("0", "root")
    assert 'ENTRYPOINT ["mqstore", "serve"]' in text
    # No CMD: its flags would win over the MQSTORE_* variables every manifest configures with.
    assert not re.search(r"^CMD ", text, re.M)
    assert "services._protogen" in text  # generated protos built into the image
    exposed = re.search(r"^EXPOSE (.+)$", text, re.M)
    assert exposed is not None
    assert {str(p) for p in [*ROLE_PORTS.values(), METRICS_PORT]} <= set(exposed.group(1).split())


def test_prod_gateways_require_signed_calls_from_their_groups_acl_secret(overlay: Rendered) -> None:
    name, objs = overlay
    gateways = [(w, c) for w, c in _mqstore_containers(objs) if w["kind"] == "Deployment"]
    assert gateways
    for workload, c in gateways:
        env = _env(c, objs)
        if name == "dev":
            assert "MQSTORE_ACL_FILE" not in env  # a try-out: open, and the gateway says so
            continue
        folder, _, file = env["MQSTORE_ACL_FILE"].rpartition("/")
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == folder]
        assert file == "plain_acl.yml" and mount.get("readOnly") is True
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        secret = volumes[mount["name"]]["secret"]
        assert secret["secretName"] == f"{env['BROKER_GROUP']}-acl"
        assert secret.get("defaultMode", 0o644) & 0o007 == 0  # secrets are not world-readable
    for workload, c in _mqstore_containers(objs):
        if workload["kind"] != "Deployment":
            assert "MQSTORE_ACL_FILE" not in _env(c, objs)  # only gateways take client calls


def test_prod_dispatch_pods_share_their_groups_receipt_key(overlay: Rendered) -> None:
    name, objs = overlay
    dispatches = [
        (w, c)
        for w, c in _mqstore_containers(objs)
        if w["metadata"]["labels"].get("app.kubernetes.io/component") == "dispatch"
    ]
    assert dispatches
    for workload, c in dispatches:
        env = _env(c, objs)
        if name == "dev":
            assert "MQSTORE_POP_RECEIPT_KEY_FILE" not in env  # one member: its own key will do
            continue
        folder = env["MQSTORE_POP_RECEIPT_KEY_FILE"].rpartition("/")[0]
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == folder]
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        assert mount.get("readOnly") is True
        assert volumes[mount["name"]]["secret"]["secretName"] == f"{env['BROKER_GROUP']}-receipt-key"


def test_commitlog_members_elect_their_master_through_the_namespaces_etcd(overlay: Rendered) -> None:
    """Every commitlog runs the election against the three etcd members of its namespace (their
    stable names, through the headless Service), and only the commitlog pods reach etcd."""
    name, objs = overlay
    (etcd,) = [o for o in objs if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "etcd"]
    assert etcd["spec"]["replicas"] == 3 and etcd["spec"]["serviceName"] == "etcd-hl"
    (container,) = etcd["spec"]["template"]["spec"]["containers"]
    etcd_env = {e["name"]: e.get("value", "") for e in container["env"]}
    members = [f"etcd-{i}" for i in range(3)]
    assert etcd_env["ETCD_INITIAL_CLUSTER"] == ",".join(
        f"{m}=http://{m}.etcd-hl.$(POD_NAMESPACE).svc:2380" for m in members
    )
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    assert {p["port"] for p in services["etcd-hl"]["spec"]["ports"]} == {2379, 2380}
    assert any(
        o["kind"] == "PodDisruptionBudget"
        and o["metadata"]["name"] == "etcd"
        and o["spec"]["maxUnavailable"] == 1
        for o in objs
    )
    electing = 0
    for workload, c in _mqstore_containers(objs):
        env = _env(c, objs)
        if env["MQSTORE_ROLE"] != "commitlog":
            assert "MQSTORE_ELECTION" not in env, f"{workload['metadata']['name']}: only commitlogs elect"
            continue
        electing += 1
        assert env["MQSTORE_ELECTION"] == "etcd"
        assert env["MQSTORE_ETCD"].split(",") == [f"{m}.etcd-hl:2379" for m in members]
        assert env["MQSTORE_MASTER_ROLE"] in ("ASYNC_MASTER", "SYNC_MASTER")
    assert electing == len(OVERLAYS[name])
    (policy,) = [o["spec"] for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "etcd"]
    by_port = {
        rule["ports"][0]["port"]: [
            src["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for src in rule["from"]
        ]
        for rule in policy["ingress"]
    }
    assert by_port == {2379: ["commitlog"], 2380: ["etcd"]}
