"""docker-compose.yml, nginx.conf and prometheus.yml, validated structurally (no Docker engine here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.deploy.files import DEPLOY, ENTRYPOINT, ROOT, check_env, compose, dockerfile_stages, load_yaml

API_SERVICES = ("api", "api-gpu")


def interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` with nothing set in the environment -> default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


@pytest.fixture(scope="module")
def services():
    return compose()["services"]


def env_of(service: dict) -> dict[str, str]:
    env = service["environment"]
    assert isinstance(env, dict), "use the mapping form for environment"
    return {k: interpolate(str(v)) for k, v in env.items()}


def nginx_conf() -> str:
    # Comments dropped so a commented-out directive cannot satisfy a check.
    return re.sub(r"#[^\n]*", "", (DEPLOY / "nginx" / "nginx.conf").read_text())


def test_interpolate():
    assert interpolate("${API_KEY:-}") == "" and interpolate("a${X:-b}c") == "abc"


def test_expected_services(services):
    assert {"api", "api-gpu", "nginx", "prometheus", "grafana"} <= set(services)
    assert services["api-gpu"]["profiles"] == ["gpu"]
    assert "profiles" not in services["api"]


@pytest.mark.parametrize("name", API_SERVICES)
def test_api_is_scalable(services, name):
    api = services[name]
    # A fixed host port or container name makes `--scale api=N` fail on the second replica.
    assert "ports" not in api and "container_name" not in api
    assert str(env_of(api)["PORT"]) in [str(p) for p in api["expose"]]


@pytest.mark.parametrize(("name", "target", "device"), [("api", "cpu", "cpu"), ("api-gpu", "gpu", "cuda")])
def test_api_builds_the_matching_target(services, name, target, device):
    api = services[name]
    build = api["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert context == ROOT
    assert build["target"] == target and target in dockerfile_stages(context / build["dockerfile"])
    assert api["image"] == f"bert-serving:{target}"
    assert env_of(api)["DEVICE"] == device
    assert (
        "entrypoint.sh" in " ".join(api["healthcheck"]["test"])
        and "healthcheck" in api["healthcheck"]["test"]
    )


@pytest.mark.parametrize("name", API_SERVICES)
def test_api_environment_is_real_settings(services, name):
    check_env(env_of(services[name]), f"docker-compose.yml service {name}")


def test_unknown_setting_is_caught():
    with pytest.raises(AssertionError, match="MAX_BATCH_SIZ"):
        check_env({"MAX_BATCH_SIZ": "8"}, "example")


def test_threads_match_the_cpu_limit(services):
    api = services["api"]
    assert float(env_of(api)["INTRA_OP_THREADS"]) == float(api["deploy"]["resources"]["limits"]["cpus"])


@pytest.mark.parametrize("name", API_SERVICES)
def test_stop_grace_period_covers_the_drain(services, name):
    """docker stop sends SIGKILL after stop_grace_period; the replica drains for SHUTDOWN_GRACE_S."""
    api = services[name]
    seconds = int(re.fullmatch(r"(\d+)s", api["stop_grace_period"]).group(1))
    assert seconds >= float(env_of(api)["SHUTDOWN_GRACE_S"]) + 5


def test_gpu_service_reserves_an_nvidia_gpu(services):
    (device,) = services["api-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


def test_bind_mounts_exist(services):
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name} mounts missing {source}"


def upstream_target() -> tuple[str, int]:
    match = re.search(r"upstream\s+\w+\s*\{[^}]*?\bserver\s+([\w.-]+):(\d+)\s+resolve", nginx_conf())
    assert match, "nginx needs an upstream server with `resolve` (Docker DNS, follows --scale)"
    return match.group(1), int(match.group(2))


@pytest.mark.parametrize("name", API_SERVICES)
def test_nginx_upstream_reaches_the_api(services, name):
    host, port = upstream_target()
    api = services[name]
    aliases = api.get("networks", {}).get("default", {}).get("aliases", [])
    assert host == name or host in aliases
    assert port == int(env_of(api)["PORT"])
    nginx = services["nginx"]
    assert name in nginx["depends_on"]
    # Mounted as the image's template, rendered into /etc/nginx with the container's DNS server.
    assert any(v.endswith(":/etc/nginx/templates/nginx.conf.template:ro") for v in nginx["volumes"])
    assert nginx["environment"]["NGINX_ENVSUBST_OUTPUT_DIR"] == "/etc/nginx"
    assert nginx["environment"]["NGINX_ENTRYPOINT_LOCAL_RESOLVERS"]


def test_nginx_proxy_settings(services):
    conf = nginx_conf()
    assert "resolver ${NGINX_LOCAL_RESOLVERS} " in conf  # Docker's 127.0.0.11, podman's aardvark
    assert re.search(r"proxy_set_header\s+X-Request-ID\s+\$\w+;", conf)
    for directive in (
        "proxy_connect_timeout",
        "proxy_read_timeout",
        "proxy_send_timeout",
        "client_body_timeout",
    ):
        assert re.search(rf"\b{directive}\s+\d+s;", conf), directive
    size = re.search(r"client_max_body_size\s+(\d+)([kKmM]?);", conf)
    factor = {"": 1, "k": 1024, "m": 1 << 20}[size.group(2).lower()]
    assert int(size.group(1)) * factor == int(env_of(services["api"])["MAX_BODY_BYTES"])
    # Prometheus scrapes replicas directly; the balancer must not serve one replica's metrics.
    assert re.search(r"location\s*=\s*/metrics\s*\{\s*(return\s+40\d|deny\s+all)", conf)
    # The nginx healthcheck URL is served.
    path = services["nginx"]["healthcheck"]["test"][-1].split("127.0.0.1", 1)[1]
    assert re.search(rf"location\s*=\s*{re.escape(path)}\s*\{{", conf)


def nginx_seconds(conf: str, directive: str, block: str = "") -> int:
    match = re.search(rf"{block}[^}}]*?\b{directive}\s+(\d+)s;", conf, re.S)
    assert match, directive
    return int(match.group(1))


@pytest.mark.parametrize("name", API_SERVICES)
def test_nginx_timeouts_fit_the_service(services, name):
    conf = nginx_conf()
    # A draining replica finishes its requests for up to SHUTDOWN_GRACE_S; nginx waits for them.
    assert nginx_seconds(conf, "proxy_read_timeout") > float(env_of(services[name])["SHUTDOWN_GRACE_S"])
    # nginx drops an idle upstream connection before uvicorn would, so it never reuses a closed one.
    uvicorn_keepalive = int(re.search(r"--timeout-keep-alive (\d+)", ENTRYPOINT.read_text()).group(1))
    assert nginx_seconds(conf, "keepalive_timeout", r"upstream\s+\w+\s*\{") < uvicorn_keepalive


def test_nginx_never_retries_429_and_keeps_a_backup(services):
    """429 counts toward max_fails when retried, and an upstream whose servers are all marked failed
    answers 502 to everything: docs/decisions.md (faults before the fix)."""
    conf = nginx_conf()
    (retry,) = re.findall(r"proxy_next_upstream\s+([^;]*);", conf)
    assert "http_429" not in retry and "non_idempotent" in retry and "error" in retry
    upstream = re.search(r"upstream\s+\w+\s*\{([^}]*)\}", conf).group(1)
    servers = re.findall(r"^\s*server\s+(\S+)\s+([^;]*);", upstream, re.M)
    primaries = {host for host, params in servers if "backup" not in params}
    backups = {host for host, params in servers if "backup" in params and "max_fails=0" in params}
    assert primaries and primaries == backups


def test_prometheus_scrapes_every_replica(services):
    config = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "bert-api"]
    assert job["metrics_path"] == "/metrics"
    (sd,) = job["dns_sd_configs"]
    for name in API_SERVICES:
        api = services[name]
        assert set(sd["names"]) & ({name} | set(api["networks"]["default"]["aliases"]))
        assert sd["port"] == int(env_of(api)["PORT"])
    mounts = services["prometheus"]["volumes"]
    assert "./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts


def test_grafana_is_provisioned(services):
    grafana = services["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"] if v.startswith("."))
    provisioning = DEPLOY / "grafana" / "provisioning"
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    (datasource,) = load_yaml(provisioning / "datasources" / "prometheus.yml")["datasources"]
    host, port = re.fullmatch(r"http://([\w-]+):(\d+)", datasource["url"]).groups()
    assert host in services and port in [p.split(":")[-1] for p in services[host]["ports"]]
    (provider,) = load_yaml(provisioning / "dashboards" / "dashboards.yml")["providers"]
    dashboards_dir = provider["options"]["path"]
    assert mounts["./grafana/dashboards"] == dashboards_dir
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (DEPLOY / "grafana" / "dashboards" / Path(home).relative_to(dashboards_dir)).is_file()


def test_nginx_gives_its_own_502_one_fresh_pass():
    """A retry that finds the replicas re-resolved under it gets "no live upstreams" (502) although
    live replicas serve; one more pass from a named location picks afresh (docs/decisions.md)."""
    conf = nginx_conf()
    root = re.search(r"location\s+/\s*\{([^}]*)\}", conf).group(1)
    named = re.search(r"error_page\s+502\s+=\s*(@\w+);", root).group(1)
    again = re.search(rf"location\s+{named}\s*\{{([^}}]*)\}}", conf).group(1)
    assert re.search(r"proxy_pass\s+http://api;", again)
    assert "proxy_intercept_errors on" not in conf, "a replica's own 502 is its answer, not retried"
    body = re.search(r"client_body_buffer_size\s+(\w+);", conf).group(1)
    assert body == re.search(r"client_max_body_size\s+(\w+);", conf).group(1), "the body is kept for the pass"
