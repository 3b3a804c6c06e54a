"""A ringleader cluster's HTTP API from python3's standard library, for the scripts that drive
local clusters (bench-search.sh, test-garage.sh import it from their embedded helpers)."""

import hashlib
import ipaddress
import json
import os
import socket
import ssl
import time
import urllib.request


def _token_file():
    """The token file's lines: the token, then optionally `tls sha256:HEX` (the fingerprint
    of the API's TLS key; node/api/src/auth.rs's TokenFileText is the format)."""
    path = os.environ.get("RINGLEADER_TOKEN_FILE")
    if not path or not os.path.exists(path):
        return None, None
    lines = [l.strip() for l in open(path).read().splitlines() if l.strip()]
    if not lines:
        return None, None
    pin = None
    for l in lines[1:]:
        if l.startswith("tls "):
            pin = l[4:].strip()
        else:
            raise ValueError(f"{path}: a token file holds the token and a `tls` line only")
    return lines[0], pin


def token():
    """The API token: RINGLEADER_TOKEN, else the file RINGLEADER_TOKEN_FILE names, else None."""
    if os.environ.get("RINGLEADER_TOKEN"):
        return os.environ["RINGLEADER_TOKEN"]
    return _token_file()[0]


def tls_pin():
    """The API's TLS fingerprint (`sha256:HEX`): RINGLEADER_TLS_SHA256, else the token file's."""
    if os.environ.get("RINGLEADER_TLS_SHA256"):
        return os.environ["RINGLEADER_TLS_SHA256"].strip()
    return _token_file()[1]


def _loopback(api):
    host = api.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _der(buf, at):
    """One DER element at `at`: (tag, start of content, end of content)."""
    tag, n = buf[at], buf[at + 1]
    at += 2
    if n & 0x80:
        k = n & 0x7F
        n = int.from_bytes(buf[at:at + k], "big")
        at += k
    if at + n > len(buf):
        raise ValueError("truncated DER")
    return tag, at, at + n


def spki_fingerprint(cert_der):
    """`sha256:HEX` of a DER certificate's SubjectPublicKeyInfo (what the CLI pins)."""
    _, c, _ = _der(cert_der, 0)                  # Certificate
    _, t, _ = _der(cert_der, c)                  # tbsCertificate
    tag, _, end = _der(cert_der, t)
    if tag == 0xA0:                              # [0] version
        t = end
    for _ in range(5):                           # serial, signature, issuer, validity, subject
        _, _, t = _der(cert_der, t)
    _, s, end = _der(cert_der, t)                # subjectPublicKeyInfo
    return "sha256:" + hashlib.sha256(cert_der[t:end]).hexdigest()


def _pinned_get(api, path, headers, pin):
    """GET over TLS, trusting the server whose key has fingerprint PIN (no CA, no names)."""
    host, port = api.rsplit(":", 1)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # trust comes from the pin, checked before any byte is sent
    with socket.create_connection((host.strip("[]"), int(port)), timeout=10) as raw:
        with ctx.wrap_socket(raw) as tls:
            got = spki_fingerprint(tls.getpeercert(binary_form=True))
            if got.lower() != pin.lower():
                raise ssl.SSLError(f"{api}: the node's TLS key is {got}, not the pinned {pin}")
            lines = [f"GET {path} HTTP/1.1", f"Host: {api}", "Connection: close"]
            lines += [f"{k}: {v}" for k, v in headers.items()]
            tls.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        out, rest = b"", body
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size.split(b";")[0], 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    if status != 200:
        raise RuntimeError(f"{api}{path}: HTTP {status}: {body[:200]!r}")
    return json.loads(body)


def get(api, path):
    """GET API/PATH as JSON (10 s timeout), with the API token when there is one. Plain http
    to a loopback address; beyond loopback over TLS pinned by tls_pin() (a node's API speaks
    TLS there), refused without a pin rather than sending the token in clear."""
    headers = {"Authorization": f"Bearer {token()}"} if token() else {}
    if not _loopback(api):
        pin = tls_pin()
        if pin:
            return _pinned_get(api, path, headers, pin)
        if headers:
            raise RuntimeError(f"{api} is beyond loopback and its API speaks TLS: set "
                               "RINGLEADER_TOKEN_FILE to a node's api.token (it carries the "
                               "fingerprint) or RINGLEADER_TLS_SHA256")
    req = urllib.request.Request(f"http://{api}{path}", headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def formed(n, deadline_s, apis, fail):
    """Waits until every node in APIS sees N members alive and a chief; calls FAIL with the
    last view after DEADLINE_S seconds."""
    deadline, last = time.time() + deadline_s, ""
    while True:
        ok = True
        for api in apis:
            try:
                s = get(api, "/v1/status")
                alive = [m["name"] for m in s["members"] if m["state"] == "alive"]
                if len(alive) != n or not s.get("chief"):
                    ok, last = False, f"{api}: alive={alive} chief={s.get('chief')}"
            except Exception as e:
                ok, last = False, f"{api}: {e}"
        if ok:
            return
        if time.time() > deadline:
            fail(f"cluster not formed within {deadline_s} s: {last}")
        time.sleep(0.2)


def procs_under(tmp):
    """(pid, command line) of the live processes whose command line names a path under TMP
    (a script's nodes and their workers)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            args = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\0")
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(a.startswith(tmp + "/") for a in args):
            out.append((int(pid), " ".join(args)[:200]))
    return out
