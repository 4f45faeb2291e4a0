"""A minimal, vendored structural schema for the Kubernetes objects in deploy/k8s/.

Written from the Kubernetes API reference (v1.29: core/v1, apps/v1, policy/v1) for the fields
our manifests use, plus the common optional ones next to them. It is strict: an unknown field
(a typo such as `readinesProbe`) is an error, as `kubectl apply --validate=strict` would say.
No network, no external schema download. `validate(doc)` returns a list of error strings.

The schema language is a small subset of JSON Schema: type, properties, required,
additionalProperties (a bool or a schema for map values), items, enum, pattern, oneOf-like
`anyOf` of types via a tuple of types.
"""

from __future__ import annotations

import re
from typing import Any

STR = {"type": "string"}
INT = {"type": "integer"}
BOOL = {"type": "boolean"}
INT_OR_STR = {"type": ("integer", "string")}
QUANTITY = {"type": ("integer", "string"),
            "pattern": r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$"}
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
STR_MAP = {"type": "object", "additionalProperties": STR}
LABELS = {"type": "object", "additionalProperties": {"type": "string",
                                                     "pattern": r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?$"}}


def obj(properties: dict[str, Any], required: tuple[str, ...] = (), **extra: Any) -> dict:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False, **extra}


def arr(items: dict) -> dict:
    return {"type": "array", "items": items}


OBJECT_META = obj({
    "name": {"type": "string", "pattern": DNS1123_SUBDOMAIN},
    "namespace": {"type": "string", "pattern": DNS1123_LABEL},
    "labels": LABELS,
    "annotations": STR_MAP,
})
LABEL_SELECTOR = obj({
    "matchLabels": LABELS,
    "matchExpressions": arr(obj({"key": STR, "operator": {"enum": ["In", "NotIn", "Exists",
                                                                   "DoesNotExist"]},
                                 "values": arr(STR)}, ("key", "operator"))),
})
PORT_REF = {"type": ("integer", "string")}
PORT_NAME = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 15}
PROBE = obj({
    "httpGet": obj({"path": STR, "port": PORT_REF, "scheme": {"enum": ["HTTP", "HTTPS"]},
                    "host": STR, "httpHeaders": arr(obj({"name": STR, "value": STR}))},
                   ("port",)),
    "tcpSocket": obj({"port": PORT_REF, "host": STR}, ("port",)),
    "exec": obj({"command": arr(STR)}),
    "grpc": obj({"port": INT, "service": STR}, ("port",)),
    "initialDelaySeconds": INT, "periodSeconds": INT, "timeoutSeconds": INT,
    "successThreshold": INT, "failureThreshold": INT, "terminationGracePeriodSeconds": INT,
})
ENV_VAR = obj({
    "name": {"type": "string", "pattern": r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"},
    "value": STR,
    "valueFrom": obj({
        "fieldRef": obj({"fieldPath": STR, "apiVersion": STR}, ("fieldPath",)),
        "configMapKeyRef": obj({"name": STR, "key": STR, "optional": BOOL}, ("key",)),
        "secretKeyRef": obj({"name": STR, "key": STR, "optional": BOOL}, ("key",)),
        "resourceFieldRef": obj({"resource": STR, "containerName": STR, "divisor": QUANTITY},
                                ("resource",)),
    }),
}, ("name",))
RESOURCES = obj({"requests": {"type": "object", "additionalProperties": QUANTITY},
                 "limits": {"type": "object", "additionalProperties": QUANTITY}})
CONTAINER = obj({
    "name": {"type": "string", "pattern": DNS1123_LABEL},
    "image": STR,
    "imagePullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
    "command": arr(STR), "args": arr(STR), "workingDir": STR,
    "env": arr(ENV_VAR),
    "envFrom": arr(obj({"prefix": STR,
                        "configMapRef": obj({"name": STR, "optional": BOOL}),
                        "secretRef": obj({"name": STR, "optional": BOOL})})),
    "ports": arr(obj({"name": PORT_NAME, "containerPort": INT, "hostPort": INT,
                      "protocol": {"enum": ["TCP", "UDP", "SCTP"]}, "hostIP": STR},
                     ("containerPort",))),
    "startupProbe": PROBE, "livenessProbe": PROBE, "readinessProbe": PROBE,
    "resources": RESOURCES,
    "securityContext": obj({
        "allowPrivilegeEscalation": BOOL, "readOnlyRootFilesystem": BOOL,
        "runAsNonRoot": BOOL, "runAsUser": INT, "runAsGroup": INT, "privileged": BOOL,
        "capabilities": obj({"add": arr(STR), "drop": arr(STR)}),
    }),
    "volumeMounts": arr(obj({"name": STR, "mountPath": STR, "readOnly": BOOL,
                             "subPath": STR}, ("name", "mountPath"))),
    "lifecycle": {"type": "object"},
    "terminationMessagePolicy": STR,
}, ("name", "image"))
AFFINITY_TERM = obj({"topologyKey": STR, "labelSelector": LABEL_SELECTOR,
                     "namespaces": arr(STR)}, ("topologyKey",))
POD_SPEC = obj({
    "containers": arr(CONTAINER), "initContainers": arr(CONTAINER),
    "terminationGracePeriodSeconds": INT,
    "serviceAccountName": STR, "shareProcessNamespace": BOOL, "hostname": STR, "subdomain": STR,
    "securityContext": obj({"runAsNonRoot": BOOL, "runAsUser": INT, "runAsGroup": INT,
                            "fsGroup": INT, "fsGroupChangePolicy": STR,
                            "seccompProfile": obj({"type": STR})}),
    "affinity": obj({"podAntiAffinity": obj({
        "preferredDuringSchedulingIgnoredDuringExecution": arr(obj(
            {"weight": INT, "podAffinityTerm": AFFINITY_TERM}, ("weight", "podAffinityTerm"))),
        "requiredDuringSchedulingIgnoredDuringExecution": arr(AFFINITY_TERM)})}),
    "volumes": arr(obj({"name": STR, "emptyDir": {"type": "object"},
                        "configMap": obj({"name": STR, "optional": BOOL,
                                          "items": arr({"type": "object"})}),
                        "secret": obj({"secretName": STR, "optional": BOOL}),
                        "persistentVolumeClaim": obj({"claimName": STR}, ("claimName",))},
                       ("name",))),
    "nodeSelector": STR_MAP,
    "tolerations": arr({"type": "object"}),
}, ("containers",))
POD_TEMPLATE = obj({"metadata": OBJECT_META, "spec": POD_SPEC}, ("spec",))
PVC_TEMPLATE = obj({"metadata": OBJECT_META, "spec": obj({
    "accessModes": arr({"enum": ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany",
                                 "ReadWriteOncePod"]}),
    "storageClassName": STR,
    "resources": RESOURCES,
}, ("accessModes", "resources"))}, ("metadata", "spec"))

KINDS: dict[tuple[str, str], dict] = {
    ("v1", "ConfigMap"): obj({"apiVersion": STR, "kind": STR, "metadata": OBJECT_META,
                              "data": STR_MAP, "immutable": BOOL},
                             ("apiVersion", "kind", "metadata")),
    ("v1", "Service"): obj({"apiVersion": STR, "kind": STR, "metadata": OBJECT_META, "spec": obj({
        "type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"]},
        "clusterIP": STR, "publishNotReadyAddresses": BOOL, "selector": LABELS,
        "sessionAffinity": {"enum": ["None", "ClientIP"]},
        "externalTrafficPolicy": {"enum": ["Cluster", "Local"]},
        "ports": arr(obj({"name": PORT_NAME, "port": INT, "targetPort": INT_OR_STR,
                          "protocol": {"enum": ["TCP", "UDP", "SCTP"]}, "nodePort": INT,
                          "appProtocol": STR}, ("port",))),
    }, ("ports",))}, ("apiVersion", "kind", "metadata", "spec")),
    ("apps/v1", "StatefulSet"): obj({
        "apiVersion": STR, "kind": STR, "metadata": OBJECT_META, "spec": obj({
            "serviceName": STR, "replicas": INT, "selector": LABEL_SELECTOR,
            "template": POD_TEMPLATE, "volumeClaimTemplates": arr(PVC_TEMPLATE),
            "podManagementPolicy": {"enum": ["OrderedReady", "Parallel"]},
            "updateStrategy": obj({"type": {"enum": ["RollingUpdate", "OnDelete"]},
                                   "rollingUpdate": obj({"partition": INT,
                                                         "maxUnavailable": INT_OR_STR})}),
            "minReadySeconds": INT, "revisionHistoryLimit": INT,
            "persistentVolumeClaimRetentionPolicy": obj({"whenDeleted": STR, "whenScaled": STR}),
        }, ("selector", "template", "serviceName"))}, ("apiVersion", "kind", "metadata", "spec")),
    ("policy/v1", "PodDisruptionBudget"): obj({
        "apiVersion": STR, "kind": STR, "metadata": OBJECT_META, "spec": obj({
            "minAvailable": INT_OR_STR, "maxUnavailable": INT_OR_STR,
            "selector": LABEL_SELECTOR, "unhealthyPodEvictionPolicy": STR,
        }, ("selector",))}, ("apiVersion", "kind", "metadata", "spec")),
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"): obj({
        "apiVersion": STR, "kind": STR, "resources": arr(STR), "namespace": STR,
        "images": arr({"type": "object"}), "commonLabels": LABELS,
    }, ("resources",)),
}

_PY_TYPES = {"string": str, "integer": int, "boolean": bool, "object": dict, "array": list}


def _check(value: Any, schema: dict, where: str, errors: list[str]) -> None:
    types = schema.get("type")
    if types is not None:
        names = types if isinstance(types, tuple) else (types,)
        ok = any(isinstance(value, _PY_TYPES[n])
                 and not (n == "integer" and isinstance(value, bool)) for n in names)
        if not ok:
            errors.append(f"{where}: expected {' or '.join(names)}, got {value!r}")
            return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if "pattern" in schema and isinstance(value, str) and not re.match(schema["pattern"], value):
        errors.append(f"{where}: {value!r} does not match {schema['pattern']}")
    if "maxLength" in schema and isinstance(value, str) and len(value) > schema["maxLength"]:
        errors.append(f"{where}: {value!r} is longer than {schema['maxLength']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{where}: missing required field {key!r}")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                _check(item, props[key], f"{where}.{key}", errors)
            elif extra is False:
                errors.append(f"{where}: unknown field {key!r}")
            elif isinstance(extra, dict):
                _check(item, extra, f"{where}.{key}", errors)
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{where}[{i}]", errors)


def validate(doc: Any, where: str = "") -> list[str]:
    """Structural errors in one manifest document (empty list: valid)."""
    if not isinstance(doc, dict):
        return [f"{where}: a manifest must be a mapping"]
    key = (doc.get("apiVersion"), doc.get("kind"))
    schema = KINDS.get(key)
    if schema is None:
        return [f"{where}: unknown apiVersion/kind {key}"]
    errors: list[str] = []
    _check(doc, schema, f"{where}{key[1]}", errors)
    return errors
