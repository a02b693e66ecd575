"""Out-of-cluster access: a kubeconfig's context (pure parsing and ``kube.access``), the
EndpointSlice version chosen by API discovery, and the operator CLI's one-line exit 2."""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from warmfleet.core.errors import ConfigError
from warmfleet.core.kubeapi import KubeApiSpec
from warmfleet.core.kubeconfig import kube_context
from warmfleet.kube.access import KubeAccess, KubeAccessError
from warmfleet.kube.endpointslices import served_versions, slice_version

CA_PEM = ssl.DER_cert_to_PEM_cert(b"not a real certificate")


def config(user: dict[str, Any], cluster: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [
            {"name": "c", "cluster": {"server": "https://127.0.0.1:6443/", **(cluster or {})}},
            {"name": "other", "cluster": {"server": "https://10.0.0.1:443"}},
        ],
        "users": [{"name": "u", "user": user}, {"name": "v", "user": {"token": "vvv"}}],
        "contexts": [
            {"name": "main", "context": {"cluster": "c", "user": "u", "namespace": "models"}},
            {"name": "second", "context": {"cluster": "other", "user": "v"}},
        ],
        "current-context": "main",
    }


def test_current_context_token_and_ca(tmp_path: Path) -> None:
    data = base64.b64encode(CA_PEM.encode()).decode()
    ctx = kube_context(
        config({"token": "abc"}, {"certificate-authority-data": data}), "kc", tmp_path
    )
    assert (ctx.server, ctx.token, ctx.ca_pem, ctx.namespace) == (
        "https://127.0.0.1:6443",
        "abc",
        CA_PEM,
        "models",
    )
    relative = kube_context(
        config({"tokenFile": "tok"}, {"certificate-authority": "ca.crt"}), "kc", tmp_path
    )
    assert relative.token_path == str(tmp_path / "tok")
    assert relative.ca_path == str(tmp_path / "ca.crt")
    other = kube_context(config({"token": "abc"}), "kc", tmp_path, context="second")
    assert (other.server, other.token) == ("https://10.0.0.1:443", "vvv")


@pytest.mark.parametrize(
    ("doc", "context", "message"),
    [
        (config({"client-certificate": "c.crt", "client-key": "c.key"}), None, "client-certif"),
        (config({"exec": {"command": "aws"}}), None, "exec"),
        (config({"token": "a"}), "nope", "no context named 'nope'"),
        ({**config({"token": "a"}), "current-context": ""}, None, "no current-context"),
        (config({"token": "a"}, {"certificate-authority-data": "%%%"}), None, "not base64"),
        (config({"token": "a"}, {"server": "127.0.0.1:6443"}), None, "http"),
        ({"clusters": "nope"}, None, "clusters"),
    ],
)
def test_unusable_kubeconfigs_name_the_problem(
    tmp_path: Path, doc: dict[str, Any], context: str | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        kube_context(doc, "kc", tmp_path, context)


def test_access_reads_the_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file\n")
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config({"tokenFile": "token"}, {"insecure-skip-tls-verify": True})))
    access = KubeAccess(KubeApiSpec(kubeconfig=str(path)))
    assert access.api_server() == "https://127.0.0.1:6443"
    assert access.auth_headers() == {"Authorization": "Bearer from-file"}
    assert access.tls() is False
    (tmp_path / "token").write_text("rotated")  # re-read at every call
    assert access.auth_headers() == {"Authorization": "Bearer rotated"}
    path.write_text(json.dumps(config({"token": "inline"})))
    os.utime(path, ns=(1, 1))  # a new mtime even where the clock is coarse
    assert access.auth_headers() == {"Authorization": "Bearer inline"}
    assert access.tls() is True  # no CA given: the system's trust store
    with pytest.raises(KubeAccessError, match="cannot read"):
        KubeAccess(KubeApiSpec(kubeconfig=str(tmp_path / "missing"))).api_server()


def test_each_access_owns_its_parsed_kubeconfig(tmp_path: Path) -> None:
    """Two components on one file each parse it; one parses it again only when it changes."""
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config({"token": "one"})))
    first = KubeAccess(KubeApiSpec(kubeconfig=str(path)))
    context = first.kubeconfig_context()
    assert first.kubeconfig_context() is context  # unchanged file: not parsed again
    second = KubeAccess(KubeApiSpec(kubeconfig=str(path)))
    assert second.kubeconfig_context() is not context
    path.write_text(json.dumps(config({"token": "two"})))
    os.utime(path, ns=(2, 2))
    assert first.bearer_token() == "two"


def test_kubeconfig_and_api_server_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="at most one of apiServer and kubeconfig"):
        KubeApiSpec(kubeconfig="kc", api_server="https://x")
    with pytest.raises(ValueError, match="context needs kubeconfig"):
        KubeApiSpec(context="main")


def test_endpointslice_version_by_discovery() -> None:
    both = {
        "versions": [{"version": "v1beta1"}, {"version": "v1"}],
        "preferredVersion": {"version": "v1"},
    }
    assert served_versions(both) == ["v1", "v1beta1"]
    assert slice_version(served_versions(both)) == "v1"
    k8s_120 = {"versions": [{"version": "v1beta1"}], "preferredVersion": {"version": "v1beta1"}}
    assert slice_version(served_versions(k8s_120)) == "v1beta1"
    with pytest.raises(ValueError, match="no EndpointSlice version"):
        slice_version(served_versions({"versions": [{"version": "v2alpha1"}]}))


def run_operator_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = "from warmfleet.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, "fleet", "operator", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_operator_outside_a_cluster_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "HOME"))}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    result = run_operator_cli(env=env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert "not in a cluster" in result.stderr
    assert "--kubeconfig" in result.stderr
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config({"token": "t"}, {"server": "https://127.0.0.1:9"})))
    result = run_operator_cli("--kubeconfig", str(path), env=env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert "cannot reach https://127.0.0.1:9/" in result.stderr
