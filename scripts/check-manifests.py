#!/usr/bin/env python3
"""Check gantry's Kubernetes manifests without a cluster.

    scripts/check-manifests.py [--kubernetes-version X.Y] [FILE.yaml ...]

Default files: runtime-conf/kubernetes/*.yaml. Needs only python3 and PyYAML (Debian:
python3-yaml). Every YAML document is checked:

  - structure: apiVersion/kind/metadata.name (a Job may use generateName), the kinds and API
    versions these manifests use, namespaced objects in a namespace defined here, unknown keys
    in the object types used here (a misspelt key is silently dropped by the API server's
    non-strict decoding), value types (nodeSelector, label and annotation values must be
    strings: an unquoted `true` is a boolean and the API refuses it), names (DNS-1123),
    quantities, enums (imagePullPolicy, hostPath type, mountPropagation, toleration
    operator/effect, restartPolicy, updateStrategy);
  - references: a DaemonSet's selector matches its template's labels, every volumeMount names a
    volume of its pod, mount paths are absolute and unique per container, container and volume
    names unique, requests <= limits, one handler per probe, the serviceAccountName exists here,
    kustomization.yaml's resources exist;
  - gantry's rules (docs/fleet.md): each hostPath volume is mounted at /host<path> (the
    installer's --host /host); all containers of the installer DaemonSet mount the same; no
    preStop hook and no `uninstall` in a DaemonSet (a pod's end removes nothing); a Job mounting
    a volume of the same name mounts the same host path the same way; the uninstall Job is not
    in kustomization.yaml; the RuntimeClass with handler `gantry` selects the DaemonSet's
    nodeSelector labels; a pod running `install` mounts exactly the host paths src/install/
    touches (INSTALL_PATHS), one running `uninstall` those and CRI-O's bundles
    (UNINSTALL_PATHS), each read-only or read-write as listed and with a hostPath type of
    those listed.

When the Python module kubernetes_validate is importable (pip install kubernetes-validate; not
needed otherwise), each object is also validated against Kubernetes' published JSON schemas,
strictly (unknown fields refused), for --kubernetes-version (default: the module's newest).

Exit status: 0 when everything passed, 1 when a check failed, 2 on usage or parse errors.
"""

import argparse
import copy
import glob
import os
import re
import sys
from fractions import Fraction

try:
    import yaml
except ImportError:
    sys.exit("check-manifests.py: PyYAML is missing (Debian: apt-get install python3-yaml)")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

errors = []


def err(where, msg):
    errors.append(f"{where}: {msg}")


# --- the kinds these manifests use --------------------------------------------------------------

KINDS = {
    # kind: (apiVersion, namespaced)
    "Namespace": ("v1", False),
    "ServiceAccount": ("v1", True),
    "ResourceQuota": ("v1", True),
    "Pod": ("v1", True),
    "DaemonSet": ("apps/v1", True),
    "Job": ("batch/v1", True),
    "RuntimeClass": ("node.k8s.io/v1", False),
    "Kustomization": ("kustomize.config.k8s.io/v1beta1", None),
}

# Allowed keys per object type (the Kubernetes API fields of these types).
META = {"name", "generateName", "namespace", "labels", "annotations", "finalizers", "ownerReferences"}
TOP = {"apiVersion", "kind", "metadata"}
POD_SPEC = {
    "activeDeadlineSeconds", "affinity", "automountServiceAccountToken", "containers",
    "dnsConfig", "dnsPolicy", "enableServiceLinks", "ephemeralContainers", "hostAliases",
    "hostIPC", "hostNetwork", "hostPID", "hostUsers", "hostname", "imagePullSecrets",
    "initContainers", "nodeName", "nodeSelector", "os", "overhead", "preemptionPolicy",
    "priority", "priorityClassName", "readinessGates", "resourceClaims", "resources",
    "restartPolicy", "runtimeClassName", "schedulerName", "schedulingGates", "securityContext",
    "serviceAccount", "serviceAccountName", "setHostnameAsFQDN", "shareProcessNamespace",
    "subdomain", "terminationGracePeriodSeconds", "tolerations", "topologySpreadConstraints",
    "volumes",
}
CONTAINER = {
    "args", "command", "env", "envFrom", "image", "imagePullPolicy", "lifecycle",
    "livenessProbe", "name", "ports", "readinessProbe", "resizePolicy", "resources",
    "restartPolicy", "securityContext", "startupProbe", "stdin", "stdinOnce",
    "terminationMessagePath", "terminationMessagePolicy", "tty", "volumeDevices",
    "volumeMounts", "workingDir",
}
VOLUME_MOUNT = {"mountPath", "mountPropagation", "name", "readOnly", "recursiveReadOnly",
                "subPath", "subPathExpr"}
VOLUME_SOURCES = {
    "hostPath", "emptyDir", "configMap", "secret", "projected", "downwardAPI",
    "persistentVolumeClaim", "csi", "ephemeral", "image",
}
HOST_PATH = {"path", "type"}
HOST_PATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket",
                   "CharDevice", "BlockDevice"}
PROBE = {"exec", "grpc", "httpGet", "tcpSocket", "failureThreshold", "initialDelaySeconds",
         "periodSeconds", "successThreshold", "terminationGracePeriodSeconds", "timeoutSeconds"}
PROBE_HANDLERS = {"exec", "grpc", "httpGet", "tcpSocket"}
SECURITY_CONTEXT = {
    "allowPrivilegeEscalation", "appArmorProfile", "capabilities", "privileged", "procMount",
    "readOnlyRootFilesystem", "runAsGroup", "runAsNonRoot", "runAsUser", "seLinuxOptions",
    "seccompProfile", "windowsOptions",
}
RESOURCES = {"limits", "requests", "claims"}
TOLERATION = {"effect", "key", "operator", "tolerationSeconds", "value"}
DS_SPEC = {"minReadySeconds", "revisionHistoryLimit", "selector", "template", "updateStrategy"}
JOB_SPEC = {
    "activeDeadlineSeconds", "backoffLimit", "backoffLimitPerIndex", "completionMode",
    "completions", "managedBy", "manualSelector", "maxFailedIndexes", "parallelism",
    "podFailurePolicy", "podReplacementPolicy", "selector", "successPolicy", "suspend",
    "template", "ttlSecondsAfterFinished",
}
RUNTIME_CLASS = TOP | {"handler", "overhead", "scheduling"}
KUSTOMIZATION = TOP | {
    "resources", "images", "namespace", "namePrefix", "nameSuffix", "labels", "commonLabels",
    "commonAnnotations", "patches", "configMapGenerator", "secretGenerator", "components",
    "replacements", "generatorOptions", "sortOptions",
}

# gantry's installer (src/install/): the host paths it reads or writes, as directories under
# --host /host: {host path: (readOnly, allowed hostPath types)}.
INSTALL_PATHS = {
    "/opt/gantry": (False, {"DirectoryOrCreate"}),       # <version>/containerd-shim-gantry-v2
    "/usr/local/bin": (False, {"DirectoryOrCreate"}),    # the stable symlink; crio/containerd binaries
    "/etc/gantry": (False, {"DirectoryOrCreate"}),       # config.toml (uninstall removes it if unedited)
    "/etc/crio": (False, {"DirectoryOrCreate"}),         # crio.conf.d/99-gantry.conf; crio.conf
    "/etc/containerd": (False, {"DirectoryOrCreate"}),   # conf.d/gantry.toml; config.toml's imports
    "/var/lib/gantry": (False, {"DirectoryOrCreate"}),   # install.json, the installer's state
    "/var/lib/dpkg": (True, {""}),                       # status: containerd's version; absent off Debian
    "/run/lock": (False, {"DirectoryOrCreate"}),         # gantry-install.lock
    "/run/gantry/install": (False, {"DirectoryOrCreate"}),  # ready
    "/run/dbus": (True, {"Directory"}),                  # system_bus_socket: restart the engine
    "/run/crio": (True, {"DirectoryOrCreate"}),          # crio.sock: detection, GET /config
    "/run/containerd": (True, {"DirectoryOrCreate"}),    # containerd.sock; task bundles (uninstall)
}
UNINSTALL_PATHS = dict(INSTALL_PATHS, **{
    "/run/containers": (True, {"DirectoryOrCreate"}),    # CRI-O's bundles: versions still in use
})

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
QUANTITY = re.compile(r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
SUFFIX = {
    None: 1, "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


def quantity(where, value):
    """Parse a Kubernetes resource quantity; None (and an error) when it is not one."""
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        err(where, f"quantity must be a string or an integer, not {type(value).__name__}")
        return None
    m = QUANTITY.match(str(value))
    if not m:
        err(where, f"{value!r} is not a Kubernetes quantity")
        return None
    sign, number, suffix = m.groups()
    q = Fraction(number)
    if suffix and suffix[0] in "eE":
        q *= Fraction(10) ** int(suffix[1:])
    else:
        q *= SUFFIX[suffix]
    return -q if sign == "-" else q


def keys(where, obj, allowed):
    if not isinstance(obj, dict):
        err(where, f"must be a mapping, not {type(obj).__name__}")
        return False
    for k in obj:
        if k not in allowed:
            err(where, f"unknown key {k!r}")
    return True


def string_map(where, obj, label_syntax=False):
    if obj is None:
        return
    if not isinstance(obj, dict):
        err(where, "must be a mapping of strings")
        return
    for k, v in obj.items():
        if not isinstance(v, str):
            err(f"{where}.{k}", f"value must be a string, not {type(v).__name__} ({v!r}); quote it")
        if label_syntax:
            prefix, _, name = str(k).rpartition("/")
            if (prefix and not DNS_SUBDOMAIN.match(prefix)) or not LABEL_NAME.match(name) or len(name) > 63:
                err(f"{where}.{k}", "is not a valid label key")
            if isinstance(v, str) and (len(v) > 63 or not LABEL_VALUE.match(v)):
                err(f"{where}.{k}", f"{v!r} is not a valid label value")


def typed(where, obj, key, kind):
    """Check obj[key], when present, has the Python type for kind ('int', 'bool', 'str')."""
    if key not in obj:
        return
    v = obj[key]
    ok = {"int": isinstance(v, int) and not isinstance(v, bool),
          "bool": isinstance(v, bool),
          "str": isinstance(v, str)}[kind]
    if not ok:
        err(f"{where}.{key}", f"must be {kind}, not {type(v).__name__} ({v!r})")


def string_list(where, v):
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        err(where, "must be a non-empty list of strings")


def check_metadata(where, meta, kind, allow_generate_name=False):
    if not keys(f"{where}.metadata", meta, META):
        return
    name = meta.get("name")
    gen = meta.get("generateName")
    if name is None and not (allow_generate_name and gen):
        err(f"{where}.metadata", "name is missing" + (" (or generateName)" if allow_generate_name else ""))
    for n in (name, gen.rstrip("-") if isinstance(gen, str) else gen):
        if n is not None and (not isinstance(n, str) or not DNS_SUBDOMAIN.match(n) or len(n) > 253):
            err(f"{where}.metadata", f"name {n!r} is not a DNS-1123 subdomain")
    string_map(f"{where}.metadata.labels", meta.get("labels"), label_syntax=True)
    string_map(f"{where}.metadata.annotations", meta.get("annotations"))


def check_probe(where, probe):
    if not keys(where, probe, PROBE):
        return
    handlers = [h for h in PROBE_HANDLERS if h in probe]
    if len(handlers) != 1:
        err(where, f"needs exactly one handler of {sorted(PROBE_HANDLERS)}, has {handlers}")
    if "exec" in probe:
        if keys(f"{where}.exec", probe["exec"], {"command"}):
            string_list(f"{where}.exec.command", probe["exec"].get("command"))
    for k in ("failureThreshold", "initialDelaySeconds", "periodSeconds", "successThreshold", "timeoutSeconds"):
        typed(where, probe, k, "int")


def check_container(where, c, volumes):
    if not keys(where, c, CONTAINER):
        return
    name = c.get("name")
    if not isinstance(name, str) or not DNS_LABEL.match(name) or len(name) > 63:
        err(where, f"container name {name!r} is not a DNS-1123 label")
    if not isinstance(c.get("image"), str) or not c.get("image"):
        err(where, "image is missing")
    if c.get("imagePullPolicy") not in (None, "Always", "IfNotPresent", "Never"):
        err(f"{where}.imagePullPolicy", f"{c['imagePullPolicy']!r} is not Always, IfNotPresent or Never")
    for k in ("command", "args"):
        if k in c:
            string_list(f"{where}.{k}", c[k])
    for k in ("livenessProbe", "readinessProbe", "startupProbe"):
        if k in c:
            check_probe(f"{where}.{k}", c[k])
    sc = c.get("securityContext")
    if sc is not None and keys(f"{where}.securityContext", sc, SECURITY_CONTEXT):
        for k in ("allowPrivilegeEscalation", "privileged", "readOnlyRootFilesystem", "runAsNonRoot"):
            typed(f"{where}.securityContext", sc, k, "bool")
        for k in ("runAsUser", "runAsGroup"):
            typed(f"{where}.securityContext", sc, k, "int")
        if sc.get("privileged") is True and sc.get("allowPrivilegeEscalation") is False:
            err(f"{where}.securityContext", "allowPrivilegeEscalation: false cannot go with privileged: true")
    privileged = isinstance(sc, dict) and sc.get("privileged") is True
    res = c.get("resources")
    if res is not None and keys(f"{where}.resources", res, RESOURCES):
        parsed = {}
        for part in ("requests", "limits"):
            for rname, v in (res.get(part) or {}).items():
                parsed[(part, rname)] = quantity(f"{where}.resources.{part}.{rname}", v)
        for (part, rname), q in parsed.items():
            lim = parsed.get(("limits", rname))
            if part == "requests" and q is not None and lim is not None and q > lim:
                err(f"{where}.resources", f"{rname} request is above its limit")
    paths = set()
    for i, m in enumerate(c.get("volumeMounts") or []):
        mw = f"{where}.volumeMounts[{i}]"
        if not keys(mw, m, VOLUME_MOUNT):
            continue
        if m.get("name") not in volumes:
            err(mw, f"names volume {m.get('name')!r}, which the pod does not define")
        p = m.get("mountPath")
        if not isinstance(p, str) or not p.startswith("/"):
            err(mw, f"mountPath {p!r} must be an absolute path")
        elif p.rstrip("/") in paths:
            err(mw, f"mountPath {p} is mounted twice in this container")
        else:
            paths.add(p.rstrip("/"))
        typed(mw, m, "readOnly", "bool")
        prop = m.get("mountPropagation")
        if prop not in (None, "None", "HostToContainer", "Bidirectional"):
            err(mw, f"mountPropagation {prop!r} is not None, HostToContainer or Bidirectional")
        if prop == "Bidirectional" and not privileged:
            err(mw, "mountPropagation Bidirectional needs a privileged container")


def check_pod_spec(where, spec, names, require_restart=None):
    if not keys(where, spec, POD_SPEC):
        return
    volumes = {}
    for i, v in enumerate(spec.get("volumes") or []):
        vw = f"{where}.volumes[{i}]"
        if not keys(vw, v, {"name"} | VOLUME_SOURCES):
            continue
        n = v.get("name")
        if not isinstance(n, str) or not DNS_LABEL.match(n) or len(n) > 63:
            err(vw, f"volume name {n!r} is not a DNS-1123 label")
        if n in volumes:
            err(vw, f"volume {n!r} is defined twice")
        sources = [s for s in VOLUME_SOURCES if s in v]
        if len(sources) != 1:
            err(vw, f"needs exactly one volume source, has {sources}")
        hp = v.get("hostPath")
        if hp is not None and keys(f"{vw}.hostPath", hp, HOST_PATH):
            if not isinstance(hp.get("path"), str) or not hp["path"].startswith("/"):
                err(f"{vw}.hostPath.path", f"{hp.get('path')!r} must be an absolute path")
            if hp.get("type", "") not in HOST_PATH_TYPES:
                err(f"{vw}.hostPath.type", f"{hp['type']!r} is not one of {sorted(HOST_PATH_TYPES - {''})}")
        volumes[n] = v
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        err(where, "containers must be a non-empty list")
        containers = []
    seen = set()
    for part in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(part) or []):
            cw = f"{where}.{part}[{i}]"
            check_container(cw, c, volumes)
            if isinstance(c, dict):
                if c.get("name") in seen:
                    err(cw, f"container name {c.get('name')!r} is used twice in the pod")
                seen.add(c.get("name"))
    string_map(f"{where}.nodeSelector", spec.get("nodeSelector"), label_syntax=True)
    check_tolerations(f"{where}.tolerations", spec.get("tolerations"))
    for k in ("hostPID", "hostNetwork", "hostIPC", "enableServiceLinks", "automountServiceAccountToken"):
        typed(where, spec, k, "bool")
    for k in ("terminationGracePeriodSeconds", "activeDeadlineSeconds"):
        typed(where, spec, k, "int")
    for k in ("nodeName", "priorityClassName", "serviceAccountName", "runtimeClassName"):
        typed(where, spec, k, "str")
    rp = spec.get("restartPolicy")
    if require_restart is not None and rp not in require_restart:
        err(f"{where}.restartPolicy", f"{rp!r} is not allowed here (one of {require_restart})")
    sa = spec.get("serviceAccountName")
    if sa is not None and names.get("ServiceAccount") is not None and sa not in names["ServiceAccount"]:
        err(f"{where}.serviceAccountName", f"ServiceAccount {sa!r} is not defined in these files")


def check_tolerations(where, tols):
    if tols is None:
        return
    if not isinstance(tols, list):
        err(where, "must be a list")
        return
    for i, t in enumerate(tols):
        tw = f"{where}[{i}]"
        if not keys(tw, t, TOLERATION):
            continue
        op = t.get("operator", "Equal")
        if op not in ("Equal", "Exists"):
            err(tw, f"operator {op!r} is not Equal or Exists")
        if op == "Exists" and t.get("value"):
            err(tw, "operator Exists takes no value")
        if not t.get("key") and op != "Exists":
            err(tw, "an empty key needs operator Exists")
        if t.get("effect") not in (None, "", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            err(tw, f"effect {t['effect']!r} is not NoSchedule, PreferNoSchedule or NoExecute")


def check_template(where, tmpl, names, require_restart):
    if not keys(where, tmpl, {"metadata", "spec"}):
        return {}
    meta = tmpl.get("metadata") or {}
    if keys(f"{where}.metadata", meta, META):
        string_map(f"{where}.metadata.labels", meta.get("labels"), label_syntax=True)
        string_map(f"{where}.metadata.annotations", meta.get("annotations"))
    check_pod_spec(f"{where}.spec", tmpl.get("spec"), names, require_restart)
    return meta.get("labels") or {}


def check_object(where, doc, names):
    kind = doc.get("kind")
    spec = doc.get("spec")
    if kind == "DaemonSet":
        keys(where, doc, TOP | {"spec"})
        if not keys(f"{where}.spec", spec, DS_SPEC):
            return
        labels = check_template(f"{where}.spec.template", spec.get("template"), names, ("Always", None))
        sel = (spec.get("selector") or {}).get("matchLabels")
        if not sel:
            err(f"{where}.spec.selector", "matchLabels is missing")
        else:
            string_map(f"{where}.spec.selector.matchLabels", sel, label_syntax=True)
            for k, v in sel.items():
                if labels.get(k) != v:
                    err(f"{where}.spec.selector", f"{k}={v} does not match the template's labels")
        us = spec.get("updateStrategy")
        if us is not None and keys(f"{where}.spec.updateStrategy", us, {"type", "rollingUpdate"}):
            if us.get("type") not in ("RollingUpdate", "OnDelete"):
                err(f"{where}.spec.updateStrategy.type", f"{us.get('type')!r} is not RollingUpdate or OnDelete")
            ru = us.get("rollingUpdate")
            if ru is not None and keys(f"{where}.spec.updateStrategy.rollingUpdate", ru, {"maxUnavailable", "maxSurge"}):
                for k in ("maxUnavailable", "maxSurge"):
                    v = ru.get(k)
                    if v is not None and not (isinstance(v, int) and not isinstance(v, bool) or
                                              isinstance(v, str) and re.match(r"^\d+%$", v)):
                        err(f"{where}.spec.updateStrategy.rollingUpdate.{k}", f"{v!r} is neither a count nor a percentage")
    elif kind == "Job":
        keys(where, doc, TOP | {"spec"})
        if not keys(f"{where}.spec", spec, JOB_SPEC):
            return
        if "selector" in spec and not spec.get("manualSelector"):
            err(f"{where}.spec.selector", "a Job's selector is generated; set it only with manualSelector")
        for k in ("backoffLimit", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "parallelism", "completions"):
            typed(f"{where}.spec", spec, k, "int")
        check_template(f"{where}.spec.template", spec.get("template"), names, ("Never", "OnFailure"))
    elif kind == "Pod":
        keys(where, doc, TOP | {"spec"})
        check_pod_spec(f"{where}.spec", spec, names)
    elif kind == "RuntimeClass":
        keys(where, doc, RUNTIME_CLASS)
        h = doc.get("handler")
        if not isinstance(h, str) or not DNS_LABEL.match(h) or len(h) > 63:
            err(f"{where}.handler", f"{h!r} is not a DNS-1123 label")
        ov = doc.get("overhead")
        if ov is not None and keys(f"{where}.overhead", ov, {"podFixed"}):
            for r, v in (ov.get("podFixed") or {}).items():
                quantity(f"{where}.overhead.podFixed.{r}", v)
        sch = doc.get("scheduling")
        if sch is not None and keys(f"{where}.scheduling", sch, {"nodeSelector", "tolerations"}):
            string_map(f"{where}.scheduling.nodeSelector", sch.get("nodeSelector"), label_syntax=True)
            check_tolerations(f"{where}.scheduling.tolerations", sch.get("tolerations"))
    elif kind == "Namespace":
        keys(where, doc, TOP | {"spec"})
    elif kind == "ServiceAccount":
        keys(where, doc, TOP | {"automountServiceAccountToken", "imagePullSecrets", "secrets"})
        typed(where, doc, "automountServiceAccountToken", "bool")
    elif kind == "ResourceQuota":
        keys(where, doc, TOP | {"spec"})
        if keys(f"{where}.spec", spec, {"hard", "scopes", "scopeSelector"}):
            for r, v in (spec.get("hard") or {}).items():
                quantity(f"{where}.spec.hard.{r}", v)


def pod_spec_of(doc):
    if doc.get("kind") in ("DaemonSet", "Job"):
        return ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
    if doc.get("kind") == "Pod":
        return doc.get("spec") or {}
    return None


def all_containers(spec):
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def mounts_by_volume(spec):
    """{volume name: (mountPath, readOnly, mountPropagation, hostPath path, hostPath type)} of
    the pod's hostPath mounts (first container that mounts each)."""
    vols = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
    out = {}
    for c in all_containers(spec):
        for m in c.get("volumeMounts") or []:
            v = vols.get(m.get("name")) or {}
            hp = v.get("hostPath")
            if hp and m.get("name") not in out:
                out[m.get("name")] = (m.get("mountPath"), bool(m.get("readOnly")),
                                      m.get("mountPropagation", "None"), hp.get("path"), hp.get("type", ""))
    return out


def check_gantry_rules(objs, kustomizations):
    """The rules of docs/fleet.md that the YAML can show."""
    daemonsets = [(w, d) for w, d in objs if d.get("kind") == "DaemonSet"]
    jobs = [(w, d) for w, d in objs if d.get("kind") == "Job"]
    for w, d in objs:
        spec = pod_spec_of(d)
        if not spec:
            continue
        vols = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
        for c in all_containers(spec):
            for m in c.get("volumeMounts") or []:
                hp = (vols.get(m.get("name")) or {}).get("hostPath")
                if hp and isinstance(hp.get("path"), str) and m.get("mountPath") != "/host" + hp["path"].rstrip("/"):
                    err(f"{w} container {c.get('name')}", f"hostPath {hp['path']} is mounted at "
                        f"{m.get('mountPath')}, not at /host{hp['path']} (the installer runs with --host /host)")
    for w, d in daemonsets:
        spec = pod_spec_of(d)
        cs = all_containers(spec)
        first = None
        for c in cs:
            if (c.get("lifecycle") or {}).get("preStop"):
                err(f"{w} container {c.get('name')}", "has a preStop hook: a DaemonSet pod's end must remove nothing")
            if "uninstall" in (c.get("command") or []) + (c.get("args") or []):
                err(f"{w} container {c.get('name')}", "runs uninstall: removal is the uninstall Job's, never the DaemonSet's")
            mounts = sorted((m.get("name"), m.get("mountPath"), bool(m.get("readOnly")),
                             m.get("mountPropagation", "None")) for m in c.get("volumeMounts") or [])
            if first is None:
                first = (c.get("name"), mounts)
            elif mounts != first[1]:
                err(f"{w} container {c.get('name')}", f"mounts differ from container {first[0]}'s")
        ds_mounts = mounts_by_volume(spec)
        for jw, j in jobs:
            for name, m in mounts_by_volume(pod_spec_of(j)).items():
                if name in ds_mounts and ds_mounts[name] != m:
                    err(f"{jw} volume {name}", f"mounted as {m}, the DaemonSet {w} as {ds_mounts[name]}")
        sel = spec.get("nodeSelector") or {}
        for rw, rc in objs:
            if rc.get("kind") == "RuntimeClass" and rc.get("handler") == "gantry":
                rsel = (rc.get("scheduling") or {}).get("nodeSelector") or {}
                for k, v in sel.items():
                    if rsel.get(k) != v:
                        err(f"{rw}", f"scheduling.nodeSelector lacks {k}={v}, the nodeSelector of {w}: "
                            "pods of the class could land on nodes the installer does not run on")
    for w, d in objs:
        spec = pod_spec_of(d)
        if not spec:
            continue
        words = [x for c in all_containers(spec) for x in (c.get("command") or []) + (c.get("args") or [])]
        want = UNINSTALL_PATHS if "uninstall" in words else INSTALL_PATHS if "install" in words else None
        if want is None:
            continue
        vols = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
        for c in all_containers(spec):
            have = {}
            for m in c.get("volumeMounts") or []:
                hp = (vols.get(m.get("name")) or {}).get("hostPath")
                if hp and isinstance(hp.get("path"), str):
                    have[hp["path"].rstrip("/")] = (bool(m.get("readOnly")), hp.get("type", ""))
            cw = f"{w} container {c.get('name')}"
            for path in sorted(set(want) - set(have)):
                err(cw, f"does not mount host path {path}, which the installer uses")
            for path in sorted(set(have) - set(want)):
                err(cw, f"mounts host path {path}, which the installer does not use")
            for path in sorted(set(want) & set(have)):
                ro, types = want[path]
                if have[path][0] != ro:
                    mode = {True: "read-only", False: "read-write"}
                    err(cw, f"mounts {path} {mode[have[path][0]]}, expected {mode[ro]}")
                if have[path][1] not in types:
                    err(cw, f"hostPath {path} has type {have[path][1]!r}, expected one of {sorted(types)}")
    for kw, files in kustomizations:
        for jw, j in jobs:
            cmd = [x for c in all_containers(pod_spec_of(j)) for x in (c.get("command") or []) + (c.get("args") or [])]
            if "uninstall" in cmd and jw.split(":")[0] in files:
                err(kw, f"lists {jw.split(':')[0]}: the uninstall Job must never run as part of `kubectl apply -k`")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--kubernetes-version", default=None,
                    help="schema version for the optional kubernetes_validate check")
    a = ap.parse_args()
    files = a.files or sorted(glob.glob(os.path.join(REPO, "runtime-conf/kubernetes/*.yaml")))
    if not files:
        print("check-manifests.py: no files", file=sys.stderr)
        return 2

    objs = []  # (where, doc)
    kustomizations = []  # (where, set of resolved resource paths)
    summary = []
    for f in files:
        rel = os.path.relpath(f, REPO) if os.path.isabs(f) else f
        try:
            with open(f) as fh:
                docs = list(yaml.safe_load_all(fh))
        except (OSError, yaml.YAMLError) as e:
            print(f"{rel}: cannot parse: {e}", file=sys.stderr)
            return 2
        kinds = []
        for i, doc in enumerate(docs):
            if doc is None:
                continue  # an empty document: a commented-out example
            where = f"{rel}:doc{i}"
            if not isinstance(doc, dict):
                err(where, "a document must be a mapping")
                continue
            kind = doc.get("kind")
            if kind not in KINDS:
                err(where, f"kind {kind!r} is not one these checks know ({sorted(KINDS)})")
                continue
            want_api, _ = KINDS[kind]
            if doc.get("apiVersion") != want_api:
                err(where, f"apiVersion {doc.get('apiVersion')!r}, expected {want_api!r} for {kind}")
            if kind == "Kustomization":
                keys(where, doc, KUSTOMIZATION)
                res = doc.get("resources") or []
                resolved = set()
                for r in res:
                    p = os.path.normpath(os.path.join(os.path.dirname(f), r))
                    if not os.path.exists(p):
                        err(f"{where}.resources", f"{r} does not exist")
                    resolved.add(os.path.relpath(p, REPO) if os.path.isabs(p) else p)
                for j, im in enumerate(doc.get("images") or []):
                    if keys(f"{where}.images[{j}]", im, {"name", "newName", "newTag", "digest"}):
                        if not im.get("name"):
                            err(f"{where}.images[{j}]", "name is missing")
                        typed(f"{where}.images[{j}]", im, "newTag", "str")
                kustomizations.append((where, resolved))
                kinds.append(kind)
                continue
            name = (doc.get("metadata") or {}).get("name") or (doc.get("metadata") or {}).get("generateName")
            where = f"{rel}:{kind}/{name}"
            check_metadata(where, doc.get("metadata"), kind, allow_generate_name=(kind == "Job"))
            objs.append((where, doc))
            kinds.append(kind)
        summary.append(f"{rel}: {', '.join(kinds) or 'no objects'}")

    # Names defined in these files, for references.
    names = {}
    for _, d in objs:
        names.setdefault(d.get("kind"), set()).add((d.get("metadata") or {}).get("name"))
    namespaces = names.get("Namespace", set())
    for where, d in objs:
        ns = (d.get("metadata") or {}).get("namespace")
        namespaced = KINDS[d["kind"]][1]
        if namespaced and not ns:
            err(where, "metadata.namespace is missing")
        if not namespaced and ns:
            err(where, f"{d['kind']} is cluster-scoped: no metadata.namespace")
        if ns and namespaces and ns not in namespaces:
            err(where, f"namespace {ns!r} is not defined in these files")
    for where, d in objs:
        check_object(where, d, names)
    check_gantry_rules(objs, kustomizations)

    # Optional: Kubernetes' own JSON schemas, strictly.
    try:
        import kubernetes_validate
    except ImportError:
        kubernetes_validate = None
    schema_note = "schema check: skipped (python module kubernetes_validate not installed)"
    if kubernetes_validate is not None:
        version = a.kubernetes_version or kubernetes_validate.latest_version()
        for where, d in objs:
            d = copy.deepcopy(d)
            meta = d.setdefault("metadata", {})
            if "name" not in meta and meta.get("generateName"):
                meta["name"] = meta["generateName"] + "x"  # the schema tool keys on a name
            try:
                kubernetes_validate.validate(d, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                err(where, f"schema {version}: {path}: {e.message}")
            except Exception as e:  # schema missing for this kind/version
                err(where, f"schema {version}: {type(e).__name__}: {e}")
        schema_note = f"schema check: Kubernetes {version} JSON schemas, strict (kubernetes_validate)"

    for line in summary:
        print(line)
    print(schema_note)
    if errors:
        for e in errors:
            print(f"FAIL {e}", file=sys.stderr)
        print(f"check-manifests.py: {len(errors)} problem(s) in {len(objs)} objects", file=sys.stderr)
        return 1
    print(f"check-manifests.py: {len(objs)} objects in {len(files)} files: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
