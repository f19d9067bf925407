"""Certificates, keys and options of the secure deployment, without starting Flower.

The certificate chain is checked with Python's own TLS stack (a real handshake over a
socket pair), the keys with the parsers Flower 1.42 uses; bad options are ValueErrors
naming the field; namespaces are used only where `netns.available()` says so.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    load_ssh_private_key,
    load_ssh_public_key,
)

from simulations import netns
from simulations.credentials import make_node_key, make_tls
from simulations.deployment import build_parser, restart_may_hang, run_config_of
from simulations.federation import LoopbackDeployment


def _handshake(files, server_hostname):
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(files.server_cert, files.server_key)
    client_ctx = ssl.create_default_context(cafile=str(files.ca_cert))
    left, right = socket.socketpair()
    errors = []

    def serve():
        try:
            with server_ctx.wrap_socket(right, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError) as error:
            errors.append(error)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client_ctx.wrap_socket(left, server_hostname=server_hostname) as tls:
            tls.sendall(b"x")
    finally:
        thread.join(timeout=10)
    return errors


def test_server_certificate_verifies_against_the_run_ca_for_its_addresses(tmp_path):
    files = make_tls(tmp_path, ["127.0.0.1", "10.77.0.1"])
    for name in ("127.0.0.1", "10.77.0.1", "localhost"):
        assert _handshake(files, name) == []
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(files, "10.77.0.9")  # not in the certificate
    other = make_tls(tmp_path / "other", ["127.0.0.1"])
    files_with_other_ca = type(files)(other.ca_cert, files.server_cert, files.server_key)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(files_with_other_ca, "127.0.0.1")  # another run's CA does not trust it
    cert = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert (files.server_key.stat().st_mode & 0o077) == 0


def test_node_keys_are_p384_in_the_formats_flower_reads(tmp_path):
    key = make_node_key(tmp_path, "supernode-0")
    private = load_ssh_private_key(key.private.read_bytes(), None)
    public = load_ssh_public_key(key.public.read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert private.curve.name == public.curve.name == "secp384r1"
    assert private.public_key().public_numbers() == public.public_numbers()
    assert make_node_key(tmp_path, "supernode-1").public.read_bytes() != key.public.read_bytes()


def test_bad_options_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="auth"):
        LoopbackDeployment(2, home=tmp_path, auth=True)
    with pytest.raises(ValueError, match="network"):
        LoopbackDeployment(2, home=tmp_path, network="bridge")
    with pytest.raises(ValueError, match="unregistered"):
        LoopbackDeployment(2, home=tmp_path, tls=True, unregistered=1)
    with pytest.raises(ValueError, match="addresses"):
        make_tls(tmp_path, [])
    args = build_parser().parse_args(["--supernodes", "2", "--unregistered", "1"])
    with pytest.raises(ValueError, match="--unregistered"):
        run_config_of(args)


def test_auth_defaults_to_authenticated_key_binding_on_the_legacy_api():
    parse = build_parser().parse_args
    assert run_config_of(parse(["--supernodes", "2", "--auth"]))["key-binding"] == "authenticated"
    assert "key-binding" not in run_config_of(parse(["--supernodes", "2"]))
    chosen = parse(["--supernodes", "2", "--auth", "--run-config", "key-binding=node"])
    assert run_config_of(chosen)["key-binding"] == "node"


def test_a_crash_and_restart_under_auth_without_round_timeout_is_warned_of():
    parse = build_parser().parse_args
    crash = ["--supernodes", "2", "--kill-node", "1", "--kill-signal", "KILL"]
    assert restart_may_hang(parse([*crash, "--auth"]), None)
    assert not restart_may_hang(parse([*crash, "--auth"]), 90.0)  # the round is bounded
    assert not restart_may_hang(parse(crash), None)  # a new node id: its message fails
    assert not restart_may_hang(parse([*crash, "--auth", "--restart-after", "-1"]), None)
    assert not restart_may_hang(parse(["--supernodes", "2", "--kill-node", "1", "--auth"]), None)


def test_netns_mode_is_an_error_where_namespaces_are_unavailable(tmp_path, monkeypatch):
    monkeypatch.setattr(netns, "available", lambda: (False, "not root (test)"))
    deployment = LoopbackDeployment(1, home=tmp_path / "a", network="netns")
    with pytest.raises(RuntimeError, match="not root"):
        deployment._setup_network()
    fallback = LoopbackDeployment(1, home=tmp_path / "b", network="auto")
    fallback._setup_network()
    assert fallback.network_used == "loopback" and "not root (test)" in fallback.network_note
    assert fallback.namespaces is None and fallback.host == "127.0.0.1"


@pytest.mark.skipif(not netns.available()[0], reason="network namespaces unavailable here")
def test_namespaces_are_created_bridged_and_removed():
    spaces = netns.Namespaces(2, "tst" + str(threading.get_ident() % 1000))
    spaces.create()
    try:
        assert sorted(spaces.existing()) == sorted([spaces.link, *spaces.nodes])
        probe = "import socket; socket.create_connection(('10.77.0.1', 9), 2)"
        done = subprocess.run(
            spaces.wrap(spaces.nodes[1], [sys.executable, "-c", probe]),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        # reached the SuperLink's namespace across the veth: refused, not unreachable
        assert "ConnectionRefusedError" in done.stderr, done.stderr
    finally:
        assert spaces.remove() == []
    assert spaces.existing() == []
