"""A real Flower deployment on loopback for the tests: one ``flower-superlink`` and N
``flower-supernode`` processes on 127.0.0.1 (free ports), each SuperNode with its own party's
shard via ``--node-config``, the mrtf app started with ``flwr run``. Bounded in time; every
process (and every process they started) is ended by PID in ``close()``.

``FLWR_HOME`` is a temporary folder, the per-run dependency install and Flower's telemetry are
off: no network.
With ``tls`` the SuperLink serves TLS with a certificate for 127.0.0.1/localhost signed by a
CA made here (:func:`make_certificates`), and the SuperNodes and ``flwr`` verify it.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mrtf.engines.flower import APP_DIR

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc; SuperExec runs in its own process group)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out.extend(kids)
        todo.extend(kids)
    return out


def _signal(pid: int, sig: int) -> None:
    for fn, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            fn(target, sig)
        except (ProcessLookupError, PermissionError):
            pass


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return json.dumps(str(v))


def make_certificates(folder: Path) -> dict[str, Path]:
    """A self-signed CA and a server certificate for 127.0.0.1 and localhost (PEM files)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mrtf test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                       crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"ca": folder / "ca.pem", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return paths


class Deployment:
    """SuperLink + SuperNodes on loopback. ``nodes``: one node config (dict) per SuperNode."""

    def __init__(self, root: Path, nodes: list[dict[str, Any]], threads: int = 2,
                 tls: bool = False) -> None:
        self.root, self.threads, self.tls = root, threads, tls
        self.home = root / "flwr-home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        self.port = free_port()
        self.env = {**os.environ, "FLWR_HOME": str(self.home),
                    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                    # Flower sends usage events to telemetry.flower.ai by default: no network
                    "FLWR_TELEMETRY_ENABLED": "0",
                    "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                    # SuperExec looks for new tasks every second by default; each message
                    # round trip would wait for it
                    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2",
                    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        self.certs = make_certificates(root / "certs") if tls else {}
        conn = {"address": f"127.0.0.1:{self.port}"}
        if tls:
            conn["root-certificates"] = str(self.certs["ca"])
        else:
            conn["insecure"] = True
        (self.home / "config.toml").write_text(
            '[superlink]\ndefault = "local"\n\n[superlink.local]\n'
            + "".join(f"{k} = {toml_value(v)}\n" for k, v in conn.items()))
        try:
            self._start_superlink()
            for i, node in enumerate(nodes):
                self._start_supernode(i, node)
            self._wait_for_nodes(len(nodes))
        except BaseException:
            self.close()
            raise

    def _security(self, server: bool) -> list[str]:
        if not self.tls:
            return ["--insecure"]
        if server:
            return ["--ssl-certfile", str(self.certs["cert"]), "--ssl-keyfile",
                    str(self.certs["key"]), "--ssl-ca-certfile", str(self.certs["ca"])]
        return ["--root-certificates", str(self.certs["ca"])]

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = (self.root / f"{name}.log").open("wb")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                cwd=self.root, start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def _start_superlink(self) -> None:
        self._spawn("superlink", [str(BIN / "flower-superlink"), *self._security(True),
                                  "--host", "127.0.0.1", "--port", str(self.port),
                                  "--disable-runtime-dependency-installation"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if self.procs[0].poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"flower-superlink did not start: {self.log('superlink')[-2000:]}")

    def _wait_for_nodes(self, n: int, timeout: float = 90) -> None:
        """Until the SuperLink has activated ``n`` SuperNodes (a run started earlier would not
        see the late ones)."""
        deadline = time.monotonic() + timeout
        while self.log("superlink").count("[Fleet.ActivateNode] Activated") < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {n} SuperNodes connected in {timeout:g} s")
            time.sleep(0.3)

    def _start_supernode(self, i: int, node: dict[str, Any]) -> None:
        cfg = " ".join(f"{k}={toml_value(v)}" for k, v in node.items())
        self._spawn(f"supernode-{i}", [str(BIN / "flower-supernode"), *self._security(False),
                                       "--superlink", f"127.0.0.1:{self.port}",
                                       "--host", "127.0.0.1", "--port", str(free_port()),
                                       "--node-config", cfg])

    def log(self, name: str) -> str:
        p = self.root / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def run(self, config: dict[str, Any], timeout: float = 240) -> tuple[int, str, float]:
        """``flwr run APP local --stream --run-config FILE`` through the launcher, which exits
        2 on bad input: (exit code, output, seconds)."""
        cfg_file = self.root / f"run-{len(list(self.root.glob('run-*.toml')))}.toml"
        cfg_file.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in config.items()))
        t0 = time.perf_counter()
        name = f"flwr-run-{cfg_file.stem}"
        proc = self._spawn(name, [sys.executable, "-m", "mrtf.engines.flower.launch", "local",
                                  "--run-config", str(cfg_file), "--app", str(APP_DIR)])
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = -1
        return rc, self.log(name), time.perf_counter() - t0

    def close(self) -> None:
        """SIGTERM every process and its descendants, SIGKILL what is left after 10 s."""
        pids = [p.pid for p in self.procs]
        pids += [c for p in list(pids) for c in _children(p)]
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        # what is left: the processes named above and anything our live processes started
        # since (a dead process's number is not followed: it could be another's by now)
        live = [p.pid for p in self.procs if p.poll() is None]
        for pid in pids + [c for p in live for c in _children(p)]:
            if Path(f"/proc/{pid}").exists():
                _signal(pid, signal.SIGKILL)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_federation(cfg: Any, seed: int, folder: Path) -> tuple[list[Path], Path]:
    """The in-process engine's federation for ``cfg`` (a RunConfig) and ``seed``, as files:
    one shard per party (x, y) and the server's target set (x; y for scoring only)."""
    from mrtf.federated.run_config import prepare_run
    from mrtf.io.hdf5 import write_dataset

    fed = prepare_run(cfg, seed)
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for k, part in enumerate(fed.parts):
        path = folder / f"party-{k}.h5"
        write_dataset(path, fed.x[part].numpy(), fed.y[part].numpy())
        shards.append(path)
    target = folder / "target.h5"
    write_dataset(target, fed.target_x.numpy(), fed.target_y.numpy())
    return shards, target
