#!/usr/bin/env python3
"""A read-only OCI registry on 127.0.0.1 serving the images critest pulls, built here from
Debian's busybox-static: nothing is downloaded, and no registry outside this machine is asked.

    scripts/registry.py PORT_FILE BIN_DIR    serve on a free port, written to PORT_FILE once
        listening; BIN_DIR holds the static programs the images need: `pause` (pause:3.9)
        and `nnp` (nonewprivs, setuid root: integration/fixtures/nnp.c)

The engines reach it through their mirror settings (containerd's hosts.toml `server`, CRI-O's
registries.conf `location`) for registry.k8s.io, k8s.gcr.io and gcr.io, so critest's image
names resolve here. Each image is what critest's own images/ Dockerfiles describe (a busybox
userland plus the user, group, file or web page a spec looks for); names critest pins by a
digest of the upstream image cannot be rebuilt and answer 404, like any unknown name.
"""

import gzip
import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"

PASSWD = "root:x:0:0:root:/root:/bin/sh\nwww-data:x:33:33:www-data:/var/www:/bin/false\n" \
         "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = "root:x:0:\nwww-data:x:33:\nnogroup:x:65534:\n"
PAGE = b"<html><body><h1>Welcome to nginx!</h1></body></html>\n"
# Debian's busybox-static has neither pgrep nor ipcs; critest runs each in one form.
PGREP = b"""#!/bin/sh
# pgrep NAME: the pids whose command name holds NAME.
found=1
for d in /proc/[0-9]*; do
  case "$(cat "$d/comm" 2>/dev/null)" in *"$1"*) echo "${d#/proc/}"; found=0 ;; esac
done
exit $found
"""
IPCS = b"""#!/bin/sh
# ipcs -m: the ids of the IPC namespace's shared memory segments.
echo shmid
awk 'NR > 1 { print $2 }' /proc/sysvipc/shm
"""
# Stands in for nginx where critest looks at nginx itself: a process named nginx (a script's
# command name is its file name) whose command line says "master process", its pid file, and
# busybox's httpd serving the page on $PORT.
NGINX = b"""#!/bin/sh
echo $$ >/var/run/nginx.pid
echo "httpd: serving /usr/share/nginx/html on port $PORT"
httpd -f -p "$PORT" -h /usr/share/nginx/html &
web=$!
trap 'kill $web; exit 0' TERM INT
wait $web
"""


def busybox():
    path = shutil.which("busybox") or "/bin/busybox"
    out = subprocess.run(["ldd", path], capture_output=True, text=True)
    if "not a dynamic" not in out.stdout + out.stderr:
        sys.exit("registry.py: a static busybox is needed (apt-get install busybox-static)")
    return path


def tar_layer(files):
    """files: (path, bytes | None for a dir | str for a symlink target, mode). Deterministic."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data, mode in files:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, 0
            if data is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            elif isinstance(data, str) and data.startswith("hardlink:"):
                info.type, info.linkname = tarfile.LNKTYPE, data[len("hardlink:"):]
                t.addfile(info)
            elif isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    diff = raw.getvalue()
    return gzip.compress(diff, mtime=0), "sha256:" + hashlib.sha256(diff).hexdigest()


def base_layer(bb):
    dirs = ("bin", "etc", "root", "proc", "sys", "dev", "var", "var/run", "var/www", "usr", "usr/bin", "usr/sbin")
    files = [(d, None, 0o755) for d in dirs]
    files.append(("tmp", None, 0o1777))
    with open(bb, "rb") as f:
        files.append(("bin/busybox", f.read(), 0o755))
    applets = subprocess.run([bb, "--list"], capture_output=True, text=True, check=True).stdout.split()
    # Hard links, as in the busybox image: masking one applet (critest masks /bin/ls) must not
    # mask the binary behind all of them.
    files += [(f"bin/{a}", "hardlink:bin/busybox", 0o755) for a in sorted(set(applets)) if a != "busybox"]
    files += [("etc/passwd", PASSWD.encode(), 0o644), ("etc/group", GROUP.encode(), 0o644)]
    files += [("usr/bin/pgrep", PGREP, 0o755), ("usr/bin/ipcs", IPCS, 0o755), ("usr/sbin/nginx", NGINX, 0o755)]
    return tar_layer(files)


class Store:
    def __init__(self):
        self.blobs = {}  # digest -> (bytes, media type)
        self.manifests = {}  # (repository, tag or digest) -> bytes

    def blob(self, data, media):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[digest] = (data, media)
        return {"mediaType": media, "digest": digest, "size": len(data)}

    def image(self, refs, layers, config):
        """refs: "repository:tag" names (host left out: every mirrored host lands here)."""
        cfg = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "WorkingDir": "/",
                       **config},
            "rootfs": {"type": "layers", "diff_ids": [d for _, d in layers]},
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": self.blob(json.dumps(cfg, sort_keys=True).encode(), OCI_CONFIG),
            "layers": [self.blob(gz, OCI_LAYER) for gz, _ in layers],
        }
        body = json.dumps(manifest, sort_keys=True).encode()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        for ref in refs:
            repo, tag = ref.rsplit(":", 1)
            self.manifests[(repo, tag)] = body
            self.manifests[(repo, digest)] = body


def build(bin_dir):
    s = Store()
    base = base_layer(busybox())
    cri = "k8s-staging-cri-tools/"
    e2e = "e2e-test-images/"
    s.image([e2e + "busybox:1.29-2"], [base], {"Cmd": ["sh"]})
    with open(os.path.join(bin_dir, "pause"), "rb") as f:
        s.image(["pause:3.9"], [base, tar_layer([("pause", f.read(), 0o755)])], {"Entrypoint": ["/pause"]})
    with open(os.path.join(bin_dir, "nnp"), "rb") as f:
        nnp = tar_layer([("usr/local", None, 0o755), ("usr/local/bin", None, 0o755),
                         ("usr/local/bin/nnp", f.read(), 0o4755)])
    s.image([e2e + "nonewprivs:1.3"], [base, nnp], {"Cmd": ["/usr/local/bin/nnp"]})

    def web(port):
        page = tar_layer([("usr/share", None, 0o755), ("usr/share/nginx", None, 0o755),
                          ("usr/share/nginx/html", None, 0o755), ("usr/share/nginx/html/index.html", PAGE, 0o644)])
        config = {"Cmd": ["/usr/sbin/nginx", "-g", "daemon off; master process"],
                  "Env": [f"PORT={port}", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                  "ExposedPorts": {f"{port}/tcp": {}}}
        return [base, page], config

    s.image([e2e + "nginx:1.14-2", e2e + "httpd:2.4.39-4"], *web(80))
    s.image([cri + "hostnet-nginx-amd64:latest"], *web(12003))
    for repo, user in [("test-image-user-uid", "1002"), ("test-image-user-username", "www-data"),
                       ("test-image-user-uid-group", "1003:1003"),
                       ("test-image-user-username-group", "www-data:www-data")]:
        s.image([cri + repo + ":latest"], [base], {"Cmd": ["sh"], "User": user})
    passwd = PASSWD + "default-user:x:1000:1000::/home/default-user:/bin/sh\n"
    group = GROUP + "default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n"
    users = tar_layer([("etc", None, 0o755), ("etc/passwd", passwd.encode(), 0o644),
                       ("etc/group", group.encode(), 0o644)])
    s.image([cri + "test-image-predefined-group:latest"], [base, users], {"Cmd": ["sh"], "User": "1000"})
    # images/image-test: busybox plus a file named after the image, so each has its own id.
    tests = ["test-image-latest:latest", "test-image-tag:test", "test-image-tag:all", "test-image-1:latest",
             "test-image-2:latest", "test-image-3:latest", "test-image-tags:1", "test-image-tags:2",
             "test-image-tags:3"]
    for ref in tests:
        marker = ref.replace(":", "-")
        if ref.startswith("test-image-tags:"):
            marker = "test-image-tags"  # one image behind three tags
        s.image([cri + ref], [base, tar_layer([(marker, marker.encode(), 0o644)])], {"Cmd": ["sh"]})
    return s


class Handler(http.server.BaseHTTPRequestHandler):
    store = None
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def handle(self):
        # A client that hangs up mid-request (an engine's cancelled pull) is not an error here.
        try:
            super().handle()
        except ConnectionError:
            pass

    def reply(self, code, body=b"", media="application/json", digest=None, head=False):
        self.send_response(code)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def route(self, head):
        path = self.path.split("?", 1)[0]
        if path in ("/v2", "/v2/"):
            return self.reply(200, b"{}", head=head)
        if path.startswith("/v2/") and "/manifests/" in path:
            repo, ref = path[4:].rsplit("/manifests/", 1)
            body = self.store.manifests.get((repo, ref))
            if body is not None:
                digest = "sha256:" + hashlib.sha256(body).hexdigest()
                return self.reply(200, body, OCI_MANIFEST, digest, head)
        if path.startswith("/v2/") and "/blobs/" in path:
            found = self.store.blobs.get(path.rsplit("/blobs/", 1)[1])
            if found is not None:
                return self.reply(200, found[0], found[1], path.rsplit("/", 1)[1], head)
        err = {"errors": [{"code": "NAME_UNKNOWN", "message": f"not served here: {path}"}]}
        return self.reply(404, json.dumps(err).encode(), head=head)

    def do_GET(self):
        self.route(False)

    def do_HEAD(self):
        self.route(True)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    Handler.store = build(sys.argv[2])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    tmp = sys.argv[1] + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(tmp, sys.argv[1])
    server.serve_forever()


if __name__ == "__main__":
    main()
