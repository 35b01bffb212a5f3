"""Deployment, validated offline: every Kustomize overlay renders with kubectl, passes
kubernetes-validate (strict, 1.29) and the Pod Security "restricted" profile; the
probes point at the port that serves grpc.health.v1; the socket path agents are told
about is the one the daemon creates; and the image's environment, built without Docker
from the same requirements and entrypoint, serves as a non-root user."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ctxcc.v1 import (
    common_pb2,
    compile_service_pb2,
    compile_service_pb2_grpc,
    session_pb2,
    session_service_pb2_grpc,
)
from ctxcc.v1 import session_service_pb2 as spb
from server.app import LIVENESS_SERVICE
from server.config import resolve
from tests.e2e.proc import REPO, DaemonProcess
from tests.helpers import ROUTE, user

K8S = REPO / "deploy" / "kubernetes"
OVERLAYS = {"base": K8S / "base", "statefulset": K8S / "overlays" / "statefulset"}
BIN = Path(sys.executable).parent


def render(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(BIN / "kubectl"), "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (workload,) = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_renders_and_validates_strictly(overlay: str, tmp_path: Path) -> None:
    docs = render(OVERLAYS[overlay])
    kinds = sorted(d["kind"] for d in docs)
    assert {"ConfigMap", "PodMonitor", "PrometheusRule"} <= set(kinds)
    assert ("StatefulSet" if overlay == "statefulset" else "Deployment") in kinds
    rendered = tmp_path / "all.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    done = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", "-k", "1.29.0", str(rendered)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    core = [d for d in docs if not d["apiVersion"].startswith("monitoring.coreos.com")]
    assert done.stdout.count("passed for resource") == len(core)


def _restricted_violations(spec: dict[str, Any]) -> list[str]:
    """The Pod Security Standards "restricted" profile, checked field by field."""
    bad = []
    pod_sc = spec.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            bad.append(key)
    allowed_volumes = {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= allowed_volumes:
            bad.append(f"volume {v['name']}: {kinds}")
    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        sc = c.get("securityContext", {})
        name = c["name"]
        if sc.get("privileged"):
            bad.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation must be false")
        if sc.get("capabilities", {}).get("drop") != ["ALL"]:
            bad.append(f"{name}: must drop ALL capabilities")
        if set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: adds capabilities")
        if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")):
            bad.append(f"{name}: runAsNonRoot")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            bad.append(f"{name}: runs as root")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{name}: seccompProfile")
        for p in c.get("ports", []):
            if "hostPort" in p:
                bad.append(f"{name}: hostPort")
    return bad


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_pods_are_restricted_native_sidecars_with_working_probes(
    overlay: str, tmp_path: Path
) -> None:
    docs = render(OVERLAYS[overlay])
    spec = pod_spec(docs)
    assert _restricted_violations(spec) == []
    (sidecar,) = spec["initContainers"]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar
    assert all(
        c["securityContext"]["readOnlyRootFilesystem"]
        for c in [*spec["initContainers"], *spec["containers"]]
    )
    config_map = next(
        d for d in docs if d["kind"] == "ConfigMap" and "ctxcc.toml" in d.get("data", {})
    )
    # Read as the daemon reads it (--config), so its values' TOML types are checked too.
    config_file = tmp_path / "ctxcc.toml"
    config_file.write_text(config_map["data"]["ctxcc.toml"])
    cfg = resolve({"config": str(config_file)}, env={})
    health_port = int(cfg.health_listen.rsplit(":", 1)[1])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert sidecar[probe]["grpc"]["port"] == health_port
    # A full disk turns overall health NOT_SERVING: only readiness may follow it.
    assert "service" not in sidecar["readinessProbe"]["grpc"]
    for probe in ("startupProbe", "livenessProbe"):
        assert sidecar[probe]["grpc"]["service"] == LIVENESS_SERVICE
    assert cfg.listen.startswith("127.0.0.1:"), "the API must not listen on the pod IP"
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    agent = spec["containers"][0]
    agent_mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    socket = str(cfg.socket_path)
    socket_volume = next(n for n, p in mounts.items() if socket.startswith(p + "/"))
    assert agent_mounts[socket_volume] == mounts[socket_volume]
    assert {e["name"]: e["value"] for e in agent["env"]}["CTXCC_TARGET"] == f"unix://{socket}"
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    assert volumes[socket_volume]["emptyDir"]["medium"] == "Memory"
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]
    assert str(cfg.data_dir) == mounts["ctxcc-data"]
    metrics_port = {p["name"]: p["containerPort"] for p in sidecar["ports"]}["metrics"]
    assert int(cfg.metrics_listen.rsplit(":", 1)[1]) == metrics_port
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    labels = next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet"))["spec"][
        "template"
    ]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    dashboard = next(d for d in docs if d["metadata"]["name"] == "ctxcc-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    json.loads(dashboard["data"]["ctxcc-dashboard.json"])
    if overlay == "statefulset":
        sts = next(d for d in docs if d["kind"] == "StatefulSet")
        claim = sts["spec"]["volumeClaimTemplates"][0]
        assert claim["metadata"]["name"] == "ctxcc-data"
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
        base = pod_spec(render(OVERLAYS["base"]))
        assert spec["initContainers"] == base["initContainers"]
        assert spec["containers"] == base["containers"]


CHECKOV = REPO / ".tools" / "checkov" / "bin" / "checkov"
SKIPS = K8S / "components" / "checkov-skips" / "kustomization.yaml"


def _checkov(path: Path, framework: str) -> dict[str, Any]:
    assert CHECKOV.exists(), "run `make test`: it installs checkov into .tools/checkov"
    done = subprocess.run(
        [str(CHECKOV), "-f", str(path), "--framework", framework, "--skip-download", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["summary"]["parsing_errors"] == 0, report["summary"]
    return report


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_checkov_passes_every_rendered_kustomization(overlay: str, tmp_path: Path) -> None:
    patches = yaml.safe_load(SKIPS.read_text())["patches"]
    per_kind = {
        p["target"]["kind"]: yaml.safe_load(p["patch"])["metadata"]["annotations"] for p in patches
    }
    # The same skips on each kind of workload, and on nothing else an overlay renders.
    assert set(per_kind) == {"Deployment", "StatefulSet"}
    annotations = per_kind["Deployment"]
    assert per_kind["StatefulSet"] == annotations
    listed = dict(
        v.split("=", 1) for k, v in annotations.items() if k.startswith("checkov.io/skip")
    )
    assert listed and all(reason.strip() for reason in listed.values())
    for doc in render(OVERLAYS[overlay]):
        skipping = any(k.startswith("checkov.io/") for k in doc["metadata"].get("annotations", {}))
        assert skipping == (doc["kind"] in per_kind), doc["kind"]
    kustomization = yaml.safe_load((OVERLAYS[overlay] / "kustomization.yaml").read_text())
    assert any(c.endswith("components/checkov-skips") for c in kustomization["components"])
    rendered = tmp_path / "all.yaml"
    rendered.write_text(yaml.safe_dump_all(render(OVERLAYS[overlay])))
    results = _checkov(rendered, "kubernetes")["results"]
    assert [(c["check_id"], c["resource"]) for c in results["failed_checks"]] == []
    # Every skip is still needed, and nothing is skipped that is not listed with a reason.
    assert {c["check_id"] for c in results["skipped_checks"]} == set(listed)


def test_checkov_passes_the_dockerfile() -> None:
    results = _checkov(REPO / "deploy" / "Dockerfile", "dockerfile")["results"]
    assert [c["check_id"] for c in results["failed_checks"]] == []
    inline = dict(re.findall(r"^# checkov:skip=(CKV_\w+):(.+)$", _dockerfile(), re.M))
    assert {c["check_id"] for c in results["skipped_checks"]} == set(inline)
    assert any(c["check_id"] == "CKV_DOCKER_2" for c in results["passed_checks"])  # HEALTHCHECK


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_manifests_are_namespaced_labelled_and_fenced(overlay: str) -> None:
    docs = render(OVERLAYS[overlay])
    for d in docs:
        meta = d["metadata"]
        assert meta.get("namespace") == "agents", (d["kind"], meta["name"])
        assert meta.get("labels", {}).get("app.kubernetes.io/part-of") == "ctxcc", meta["name"]
    spec = pod_spec(docs)
    assert spec["automountServiceAccountToken"] is False
    (workload,) = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    pod_labels = workload["spec"]["template"]["metadata"]["labels"]
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    allowed = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    sidecar_ports = {p["name"] for p in spec["initContainers"][0]["ports"]}
    assert allowed == ["metrics"] and "metrics" in sidecar_ports
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    if overlay == "statefulset":
        (pdb,) = budgets
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        assert pdb["spec"]["maxUnavailable"] == 1
    else:
        assert budgets == []


def test_prometheus_rule_spec_passes_promtool(tmp_path: Path) -> None:
    rule = next(d for d in render(OVERLAYS["base"]) if d["kind"] == "PrometheusRule")
    f = tmp_path / "rules.yaml"
    f.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run(
        [str(REPO / ".tools" / "promtool"), "check", "rules", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _dockerfile() -> str:
    return (REPO / "deploy" / "Dockerfile").read_text()


def _healthcheck_command() -> list[str]:
    """The exec-form CMD of the Dockerfile's HEALTHCHECK (its continuation lines joined)."""
    text = _dockerfile().replace("\\\n", " ")
    match = re.search(r"^HEALTHCHECK\b[^\n]*?\bCMD\s+(\[[^\n]*\])", text, re.M)
    assert match, "the Dockerfile has no exec-form HEALTHCHECK"
    command: list[str] = json.loads(match.group(1))
    return command


def _image_env() -> dict[str, str]:
    """The variables the Dockerfile's runtime stage sets (its last ENV, lines joined)."""
    text = _dockerfile().replace("\\\n", " ")
    env_lines = re.findall(r"^ENV\s+(.*)$", text, re.M)
    assert env_lines, "the Dockerfile sets no ENV"
    pairs = re.findall(r"([A-Z_][A-Z0-9_]*)=(\S*)", env_lines[-1])
    return dict(pairs)


def test_the_configmap_mounted_over_the_images_file_is_what_the_daemon_reads(
    tmp_path: Path,
) -> None:
    """The image's settings are the sidecar's ConfigMap file, copied to where a pod mounts
    that ConfigMap: with the image's environment, every value of a changed ConfigMap
    holds (a CTXCC_* variable for it in the image would win over the file, so an edit of
    the ConfigMap's listen or paths would do nothing)."""
    env = _image_env()
    assert {k for k in env if k.startswith("CTXCC_")} == {"CTXCC_CONFIG"}, env
    copied = re.search(r"^COPY\s+deploy/kubernetes/base/ctxcc\.toml\s+(\S+)$", _dockerfile(), re.M)
    assert copied and copied.group(1) == env["CTXCC_CONFIG"]
    spec = pod_spec(render(OVERLAYS["base"]))
    sidecar = next(c for c in spec["initContainers"] if c["name"] == "ctxcc")
    assert sidecar["args"] == ["--config", env["CTXCC_CONFIG"]]
    config_mount = next(
        m["mountPath"] for m in sidecar["volumeMounts"] if m["name"] == "ctxcc-config"
    )
    assert config_mount == str(Path(env["CTXCC_CONFIG"]).parent)
    shipped = (K8S / "base" / "ctxcc.toml").read_text()
    image = resolve({}, env={**env, "CTXCC_CONFIG": str(K8S / "base" / "ctxcc.toml")})
    volume_line = re.search(r"^VOLUME (.*)$", _dockerfile(), re.M)
    assert volume_line
    volumes = set(re.findall(r'"(/[^"]+)"', volume_line.group(1)))
    assert {str(image.data_dir), str(Path(str(image.socket_path)).parent)} == volumes
    assert image.log_format == "json"
    edited = tmp_path / "ctxcc.toml"
    edited.write_text(
        shipped.replace('listen = "127.0.0.1:50551"', 'listen = "none"')
        .replace('"0.0.0.0:9464"', '"0.0.0.0:9999"')
        .replace('"/run/ctxcc/ctxcc.sock"', '"/run/ctxcc/other.sock"')
    )
    cfg = resolve({"config": str(edited)}, env={**env, "CTXCC_CONFIG": str(edited)})
    assert (cfg.listen, cfg.metrics_listen) == ("none", "0.0.0.0:9999")
    assert str(cfg.socket_path) == "/run/ctxcc/other.sock"


def test_files_cited_by_deploy_and_docs_exist() -> None:
    texts = [p for p in (REPO / "deploy").rglob("*") if p.is_file() and p.suffix != ".json"]
    cited = {
        (p.relative_to(REPO), ref)
        for p in [*texts, REPO / "README.md", REPO / "deploy" / "Dockerfile"]
        for ref in re.findall(
            r"\b((?:tests|scripts|deploy|server)/[\w./-]+\.(?:py|sh|yaml))", p.read_text()
        )
    }
    assert cited
    assert [(str(p), ref) for p, ref in sorted(cited) if not (REPO / ref).exists()] == []


def test_image_environment_serves_as_a_non_root_user(short_tmp: Path) -> None:
    text = _dockerfile()
    assert 'ENTRYPOINT ["ctxcc", "serve"]' in text and "USER 10001:10001" in text
    assert "pip install -r deploy/requirements.txt" in text and "--no-deps ." in text
    wheels = REPO / ".tools" / "wheels"
    assert (wheels / ".stamp").exists(), "run `make test`: it fetches the wheels first"
    # The image's build stage, without Docker: a clean venv from the same requirements
    # and the package copied as the Dockerfile copies it.
    src = short_tmp / "src"
    src.mkdir()
    for item in ("pyproject.toml", "README.md", "ctxcc", "server", "storage"):
        (shutil.copytree if (REPO / item).is_dir() else shutil.copy)(REPO / item, src / item)
    venv = short_tmp / "opt-ctxcc"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [
        str(venv / "bin" / "pip"),
        "install",
        "--quiet",
        "--no-index",
        "--find-links",
        str(wheels),
    ]
    subprocess.run([*pip, "-r", str(REPO / "deploy" / "requirements.txt")], check=True, timeout=600)
    subprocess.run([*pip, "--no-deps", str(src)], check=True, timeout=600)
    # The build stage's proof that every tokenizer table loads from the installed packages.
    build_check = re.search(r'/opt/ctxcc/bin/python -c\s+"([^"]+)"', text.replace("\\\n", " "))
    assert build_check, "the Dockerfile no longer checks the tokenizers at build time"
    subprocess.run(
        [str(venv / "bin" / "python"), "-c", build_check.group(1)],
        check=True,
        timeout=120,
        cwd=short_tmp,
        env={"PATH": "/usr/bin:/bin", "TIKTOKEN_CACHE_DIR": ""},
    )
    # The runtime stage: read-only code, a non-root user, data and socket in volumes.
    data, run_dir = short_tmp / "var-lib-ctxcc", short_tmp / "run-ctxcc"
    for volume in (data, run_dir):
        volume.mkdir()
        os.chown(volume, 65534, 65534)
    for root, dirs, files in os.walk(short_tmp):
        for name in dirs + files:
            p = os.path.join(root, name)
            if not p.startswith((str(data), str(run_dir))) and not os.path.islink(p):
                os.chmod(
                    p,
                    os.stat(p).st_mode & ~0o222 | 0o555
                    if os.path.isdir(p)
                    else os.stat(p).st_mode & ~0o222 | 0o444,
                )
    os.chmod(short_tmp, 0o755)
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "TIKTOKEN_CACHE_DIR": "",
        "CTXCC_DATA_DIR": str(data),
        "CTXCC_SOCKET": str(run_dir / "ctxcc.sock"),
        "CTXCC_LISTEN": "127.0.0.1:0",
        "CTXCC_HEALTH_LISTEN": "127.0.0.1:0",
        "CTXCC_METRICS_LISTEN": "127.0.0.1:0",
        "CTXCC_UI_LISTEN": "127.0.0.1:0",
    }
    cmd = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
        str(venv / "bin" / "ctxcc"),
        "serve",
    ]
    d = DaemonProcess(data, command=cmd, env=env, cwd=Path("/"), log_path=short_tmp / "image.log")
    d.start()
    try:
        d.wait_ready()
        health = d.endpoints["health"]
        with grpc.insecure_channel(str(health)) as ch:
            stub: Any = health_pb2_grpc.HealthStub(ch)
            resp = stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
            # The probe port serves health only, never the API.
            api: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            with pytest.raises(grpc.RpcError) as exc:
                api.GetSession(spb.GetSessionRequest(session_id="x"), timeout=5)
            assert exc.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # A compile loads the tokenizer: from the installed package, with nothing written.
        with grpc.insecure_channel(d.target) as ch:
            sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            sessions.CreateSession(
                spb.CreateSessionRequest(session=session_pb2.Session(session_id="img")), timeout=10
            )
            sessions.AppendEvents(
                spb.AppendEventsRequest(session_id="img", events=[user("hello world")]), timeout=10
            )
            compiles: Any = compile_service_pb2_grpc.CompileServiceStub(ch)
            view = compiles.Compile(
                compile_service_pb2.CompileRequest(session_id="img", route=ROUTE), timeout=30
            ).view
            assert view.messages[0].tokens > 0
            # And o200k_base (bpe-openai's bundled ranks) for a GPT-4o route.
            gpt = common_pb2.Route(connection="c", protocol="openai", endpoint="e", model="gpt-4o")
            view = compiles.Compile(
                compile_service_pb2.CompileRequest(session_id="img", route=gpt), timeout=30
            ).view
            assert view.messages[0].tokens > 0
            assert view.budget.route_model.counter_kind == "exact"
        assert (run_dir / "ctxcc.sock").stat().st_uid == 65534
        # The image's HEALTHCHECK, run as Docker runs it: same user, same environment.
        probe = [*cmd[:-2], *_healthcheck_command()]
        healthy = subprocess.run(
            probe, check=False, env=env, capture_output=True, text=True, timeout=60
        )
        assert healthy.returncode == 0, healthy.stderr
        assert healthy.stdout.startswith(f"SERVING (unix:{run_dir / 'ctxcc.sock'})")
        assert d.terminate() == 0
        gone = subprocess.run(
            probe, check=False, env=env, capture_output=True, text=True, timeout=60
        )
        assert gone.returncode == 1 and "unreachable" in gone.stderr, gone.stderr
    finally:
        d.ensure_stopped()
        for root, dirs, _ in os.walk(short_tmp):  # let the fixture clean up
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)


def _limit_bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", quantity)
    assert match, quantity
    return int(match.group(1)) * units[match.group(2)]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_sidecars_largest_requests_fit_its_memory_limit(overlay: str, short_tmp: Path) -> None:
    """With the shipped settings (max_message_bytes 64 MiB then) one allowed append of 60
    events of 1 MiB took the daemon from ~100 MB to ~500 MB, and the next ones to ~900 MB:
    the 512Mi container would have been OOM-killed. The daemon, with the image's
    environment and the sidecar's file, takes four appends of the largest size its
    settings allow at once, three times over; its peak RSS (VmHWM) stays under the
    container's memory limit."""
    spec = pod_spec(render(OVERLAYS[overlay]))
    sidecar = next(c for c in spec["initContainers"] if c["name"] == "ctxcc")
    limit = _limit_bytes(sidecar["resources"]["limits"]["memory"])
    shipped = K8S / "base" / "ctxcc.toml"
    cfg = resolve({"config": str(shipped)}, env={})
    data = short_tmp / "data"
    d = DaemonProcess(
        data,
        "--config",
        str(shipped),
        "--socket",
        str(short_tmp / "s.sock"),
        "--health-listen",
        "127.0.0.1:0",
        env={**os.environ, **{k: v for k, v in _image_env().items() if k.startswith("MALLOC")}},
    )
    d.start()
    try:
        d.wait_ready()
        assert d.proc is not None
        events = (cfg.max_message_bytes - (64 << 10)) // cfg.max_event_bytes
        text = "abcdefgh " * ((cfg.max_event_bytes - 1024) // 9)
        with grpc.insecure_channel(
            d.target, options=[("grpc.max_send_message_length", cfg.max_message_bytes)]
        ) as ch:
            sessions: Any = session_service_pb2_grpc.SessionServiceStub(ch)
            for i in range(4):
                session = session_pb2.Session(session_id=f"big{i}")
                sessions.CreateSession(spb.CreateSessionRequest(session=session))
            for _ in range(3):
                calls = [
                    sessions.AppendEvents.future(
                        spb.AppendEventsRequest(
                            session_id=f"big{i}", events=[user(text) for _ in range(events)]
                        ),
                        timeout=300,
                    )
                    for i in range(4)
                ]
                assert [c.result().last_seq - c.result().first_seq + 1 for c in calls] == [
                    events
                ] * 4
        status = Path(f"/proc/{d.proc.pid}/status").read_text()
        peak = int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M).group(1)) << 10  # type: ignore[union-attr]
    finally:
        d.ensure_stopped()
    assert events * cfg.max_event_bytes > cfg.max_message_bytes // 2  # requests near the cap
    assert peak < limit, f"peak RSS {peak >> 20} MiB over the {limit >> 20} MiB limit"
