"""KubeApi over TLS with a client certificate, as a kubeconfig gives them: the API stand-in behind
an HTTPS socket that trusts only its own CA's client certificates. KubeApi sends its requests
through the client's lower layer (bot/kube/api.py); the TLS and the certificates are the client's
configuration, loaded by the kubeconfig loader, and must reach every request."""

from __future__ import annotations

import base64
import ssl
import subprocess
import warnings
from pathlib import Path

import pytest
import urllib3
import yaml
from builders import require
from kubeapi.objects import crashing_deployment
from kubeapi.server import FakeKube

from bot.kube.api import KubeApi, api_client_from_environment
from bot.kube.errors import KubeError
from bot.kube.retry import RetryPolicy


def openssl(*args: str | Path) -> None:
    subprocess.run([require("openssl"), *map(str, args)], check=True, capture_output=True)


def issue(folder: Path, name: str, subject: str, ca: str | None, extensions: str = "") -> None:
    """`name`.key and `name`.crt: self-signed when `ca` is None, else signed by `ca`.key/crt."""
    key, crt, csr = folder / f"{name}.key", folder / f"{name}.crt", folder / f"{name}.csr"
    openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-subj", subject, "-out", csr)
    if ca is None:
        openssl("x509", "-req", "-in", csr, "-signkey", key, "-days", "2", "-out", crt,
                "-extfile", write(folder / "ca.ext", "basicConstraints=critical,CA:TRUE\nkeyUsage=keyCertSign"))
    else:
        openssl("x509", "-req", "-in", csr, "-CA", folder / f"{ca}.crt", "-CAkey", folder / f"{ca}.key",
                "-CAcreateserial", "-days", "2", "-out", crt, "-extfile", write(folder / f"{name}.ext", extensions))


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def data(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


@pytest.fixture
def pki(tmp_path):
    issue(tmp_path, "ca", "/CN=stand-in-ca", None)
    issue(tmp_path, "server", "/CN=127.0.0.1", "ca", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth")
    issue(tmp_path, "client", "/CN=vllm-oncall/O=oncall", "ca", "extendedKeyUsage=clientAuth")
    return tmp_path


@pytest.fixture
def kube(pki):
    """The stand-in, answering only TLS clients that show a certificate of its CA."""
    fake = FakeKube().start()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "server.crt", pki / "server.key")
    context.load_verify_locations(pki / "ca.crt")
    context.verify_mode = ssl.CERT_REQUIRED
    assert fake.http is not None and fake.http.server is not None
    fake.http.server.socket = context.wrap_socket(fake.http.server.socket, server_side=True)
    yield fake
    fake.stop()


def kubeconfig(folder: Path, server: str, user: dict[str, str]) -> str:
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "tls",
        "clusters": [{"name": "tls", "cluster": {"server": server, "certificate-authority-data": data(folder / "ca.crt")}}],
        "users": [{"name": "bot", "user": user}],
        "contexts": [{"name": "tls", "context": {"cluster": "tls", "user": "bot"}}]}))
    return str(path)


def test_a_client_certificate_from_the_kubeconfig_reaches_every_request(kube, pki):
    _, pod = crashing_deployment(kube)
    server = f"https://127.0.0.1:{kube.http.port}"
    user = {"client-certificate-data": data(pki / "client.crt"), "client-key-data": data(pki / "client.key")}
    api = KubeApi(api_client_from_environment(kubeconfig=kubeconfig(pki, server, user)), retry=RetryPolicy(attempts=1))
    assert api.get_pod("inference", pod["metadata"]["name"])["metadata"]["name"] == pod["metadata"]["name"]
    assert api.patch_workload("Deployment", "inference", "llama",
                              [{"op": "test", "path": "/spec/replicas", "value": 1}], dry_run=True)
    assert [r.method for r in kube.requests] == ["GET", "PATCH"]


def test_without_the_client_certificate_the_server_is_not_reached(kube, pki):
    server = f"https://127.0.0.1:{kube.http.port}"
    api = KubeApi(api_client_from_environment(kubeconfig=kubeconfig(pki, server, {"token": "t0ken"})),
                  retry=RetryPolicy(attempts=1))
    # The client reports a failed handshake as an ApiException of status 0 (rest.py), as it did
    # through the generated methods: a KubeError naming the SSLError.
    with pytest.raises(KubeError, match="SSLError") as info:
        api.get_node("gpu-node-1")
    assert info.value.status == 0
    assert kube.requests == []


def test_a_server_certificate_the_kubeconfigs_ca_did_not_sign_is_refused(kube, pki, tmp_path):
    # The kubeconfig trusts another CA only: the handshake fails on the client's verification,
    # before any request is written.
    other = tmp_path / "other"
    other.mkdir()
    issue(other, "ca", "/CN=another-ca", None)
    (pki / "trusted.crt").write_bytes((other / "ca.crt").read_bytes())
    server = f"https://127.0.0.1:{kube.http.port}"
    user = {"client-certificate-data": data(pki / "client.crt"), "client-key-data": data(pki / "client.key")}
    path = Path(kubeconfig(pki, server, user))
    config = yaml.safe_load(path.read_text())
    config["clusters"][0]["cluster"]["certificate-authority-data"] = data(pki / "trusted.crt")
    path.write_text(yaml.safe_dump(config))
    api = KubeApi(api_client_from_environment(kubeconfig=str(path)), retry=RetryPolicy(attempts=1))
    with pytest.raises(KubeError, match="CERTIFICATE_VERIFY_FAILED") as info:
        api.get_pod("inference", "x")
    assert info.value.status == 0
    assert kube.requests == []


def test_without_verification_every_request_warns_as_urllib3_does(kube, pki):
    _, pod = crashing_deployment(kube)
    server = f"https://127.0.0.1:{kube.http.port}"
    user = {"client-certificate-data": data(pki / "client.crt"), "client-key-data": data(pki / "client.key")}
    path = Path(kubeconfig(pki, server, user))
    config = yaml.safe_load(path.read_text())
    config["clusters"][0]["cluster"] = {"server": server, "insecure-skip-tls-verify": True}
    path.write_text(yaml.safe_dump(config))
    api = KubeApi(api_client_from_environment(kubeconfig=str(path)), retry=RetryPolicy(attempts=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # the second on the kept connection
            api.get_pod("inference", pod["metadata"]["name"])
    assert [w.category for w in caught] == [urllib3.exceptions.InsecureRequestWarning] * 2
