"""The Procfile and every deploy file name the same processes and run the same commands."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.support.ports import default_port_busy  # noqa: F401 - a fixture, used by pytestmark
from tests.support.redis_server import free_port

# Port 8000 (fx web's default) is busy throughout: fx web checks its port first, so the
# tests that start it give it a free one (`{port}`) and pass whatever else runs here.
pytestmark = pytest.mark.usefixtures("default_port_busy")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent


def procfile() -> dict[str, str]:
    entries: dict[str, str] = {}
    for raw in (ROOT / "Procfile").read_text().splitlines():
        if raw.strip() and not raw.startswith("#"):
            name, _, command = raw.partition(":")
            entries[name.strip()] = command.strip()
    return entries


def test_procfile_names_web_and_worker() -> None:
    assert procfile() == {"web": "fx web --host 0.0.0.0", "worker": "fx worker"}


@pytest.mark.parametrize("name", ["web", "worker"])
def test_each_procfile_command_resolves_and_its_help_runs(name: str) -> None:
    argv = shlex.split(procfile()[name])
    executable = shutil.which(argv[0], path=str(BIN)) or shutil.which(argv[0])
    assert executable, f"{argv[0]} is not on PATH"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FX_") and k != "REDIS_URL"}
    done = subprocess.run([executable, *argv[1:], "--help"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "Usage: fx " + argv[1] in done.stdout


def test_docker_compose_runs_redis_and_the_procfile_processes() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"redis", "web", "worker"}
    for name, command in procfile().items():
        assert services[name]["command"] == command
        assert services[name]["build"]["dockerfile"] == "deploy/Dockerfile"
        assert services[name]["environment"]["REDIS_URL"] == "redis://redis:6379/0"
    assert "noeviction" in services["redis"]["command"]


def test_heroku_app_json_formation_is_the_procfile() -> None:
    app = json.loads((DEPLOY / "app.json").read_text())
    assert set(app["formation"]) == set(procfile())
    assert any(addon["plan"].startswith("heroku-redis") for addon in app["addons"])
    assert app["env"]["FX_API_TOKEN"]["generator"] == "secret"


def test_render_blueprint_starts_the_procfile_commands() -> None:
    blueprint = yaml.safe_load((DEPLOY / "render.yaml").read_text())
    by_type = {service["type"]: service for service in blueprint["services"]}
    assert by_type["web"]["startCommand"] == procfile()["web"]
    assert by_type["worker"]["startCommand"] == procfile()["worker"]
    assert by_type["keyvalue"]["maxmemoryPolicy"] == "noeviction"
    redis_env = [e for e in by_type["worker"]["envVars"] if e["key"] == "REDIS_URL"]
    assert redis_env[0]["fromService"]["name"] == by_type["keyvalue"]["name"]


def test_fly_processes_are_the_procfile() -> None:
    fly = tomllib.loads((DEPLOY / "fly.toml").read_text())
    assert fly["processes"] == procfile()
    assert fly["http_service"]["processes"] == ["web"]
    assert fly["http_service"]["internal_port"] == int(fly["env"]["PORT"])
    assert (DEPLOY / fly["build"]["dockerfile"]).is_file()


def test_dockerfile_default_command_is_the_procfile_web() -> None:
    lines = (DEPLOY / "Dockerfile").read_text().splitlines()
    cmd = [line for line in lines if line.startswith("CMD ")]
    assert len(cmd) == 1
    assert " ".join(json.loads(cmd[0][4:])) == procfile()["web"]
    assert any(line.startswith("FROM python:3.11") for line in lines)


@pytest.mark.redis
def test_fx_worker_builds_the_celery_command_from_the_agents_module(tmp_path: Path, redis_url: str) -> None:
    (tmp_path / "two_agents.py").write_text(
        "from fxworker.agent import Agent\n"
        "Agent('support', model='scripted', provider={'name': 'x', 'base_url': 'http://127.0.0.1:9/v1', 'models': {'scripted': {}}})\n"
        "Agent('coding', model='scripted', provider={'name': 'x', 'base_url': 'http://127.0.0.1:9/v1', 'models': {'scripted': {}}})\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FX_")}
    # A Redis that answers: the start checks (store and broker) run before the command is printed.
    env.update(REDIS_URL=redis_url, FX_AGENTS="two_agents", FX_WORKER_CONCURRENCY="7",
               PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    done = subprocess.run(
        [str(BIN / "fx"), "worker", "--print-command"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    argv = done.stdout.split()
    assert argv[argv.index("-A") + 1] == "fxworker.celery_app"
    assert argv[argv.index("-P") + 1] == "threads"
    assert argv[argv.index("-c") + 1] == "7"
    assert sorted(argv[argv.index("-Q") + 1].split(",")) == ["fx.coding", "fx.support"]


@pytest.mark.parametrize(
    ("command", "env", "message"),
    [
        (["web", "--port", "{port}"], {}, "needs REDIS_URL"),
        (["worker"], {}, "needs REDIS_URL"),
        (["web", "--host", "0.0.0.0"], {"REDIS_URL": "redis://127.0.0.1:9/0", "FX_AGENTS": "x"}, "without FX_API_TOKEN"),
    ],
)
def test_fx_web_and_worker_refuse_a_missing_setting_with_exit_2(command: list[str], env: dict[str, str], message: str) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FX_") and k != "REDIS_URL"}
    argv = [a.format(port=free_port()) for a in command]
    done = subprocess.run([str(BIN / "fx"), *argv], capture_output=True, text=True, timeout=60, env={**base, **env})
    assert done.returncode == 2
    assert message in done.stderr


@pytest.mark.parametrize("name", ["agents.py", "fastapi_app.py", "flask_app.py", "django_views.py"])
def test_each_example_compiles(name: str) -> None:
    source = (ROOT / "examples" / name).read_text()
    compile(source, name, "exec")
    assert "fxworker" in source or "examples.agents" in source


def test_the_sentinel_compose_file_names_the_sentinels_master_for_store_and_broker() -> None:
    from fxworker.broker import broker_config
    from fxworker.store import parse_store_url

    compose = yaml.safe_load((DEPLOY / "docker-compose.sentinel.yml").read_text())
    services = compose["services"]
    for name, command in procfile().items():
        assert services[name]["command"] == command
        assert services[name]["environment"]["FX_ACK"] == "replica"
    url = services["web"]["environment"]["REDIS_URL"]
    address = parse_store_url(url)
    sentinels = {name for name in services if name.startswith("sentinel-")}
    assert address.kind == "sentinel" and {host for host, _ in address.nodes} == sentinels
    assert f"sentinel monitor {address.master} redis-a 6379 2" in services["sentinel-1"]["command"][-1]
    assert broker_config(url).options["master_name"] == address.master
    assert "--replicaof" in services["redis-b"]["command"]
    assert all("noeviction" in services[r]["command"] for r in ("redis-a", "redis-b"))


@pytest.mark.redis
def test_fx_worker_imports_the_agents_module_from_the_working_directory(tmp_path: Path, redis_url: str) -> None:
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "agents.py").write_text(
        "from fxworker import Agent\n"
        "Agent('mine', model='scripted', provider={'name': 'x', 'base_url': 'http://127.0.0.1:9/v1', 'models': {'scripted': {}}})\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FX_") and k != "PYTHONPATH"}
    env.update(REDIS_URL=redis_url, FX_AGENTS="myapp.agents")
    done = subprocess.run([str(BIN / "fx"), "worker", "--print-command"], capture_output=True, text=True, timeout=60,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "-Q fx.mine" in done.stdout


@pytest.mark.redis
@pytest.mark.parametrize("command", ["web", "worker", "dev"])
def test_an_agents_module_that_cannot_be_imported_is_one_line_and_exit_2(command: str, redis_url: str,
                                                                          tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FX_") and k != "REDIS_URL"}
    env.update(REDIS_URL=redis_url, FX_AGENTS="nosuch.agents")
    args = [command, "--port", str(free_port())] if command != "worker" else [command]  # fx web reads 0 as 8000
    done = subprocess.run([str(BIN / "fx"), *args], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    said = [line for line in done.stderr.splitlines() if "nosuch" in line]
    assert len(said) == 1 and said[0].startswith("fx: ") and "PYTHONPATH" in said[0], done.stderr
    assert "Traceback" not in done.stderr
