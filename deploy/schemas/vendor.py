#!/usr/bin/env python3
"""Writes the JSON schemas beside this file, which scripts/validate-deploy checks deploy/*.yaml
against, from their two sources:

  --k8s DIR   the Kubernetes v1.30 strict schemas: kubernetes_validate/kubernetes-json-schema/
              v1.30.0-local-strict/ of the kubernetes-validate wheel on PyPI (1.37.0 was used:
              `python3 -m pip download --no-deps kubernetes-validate==1.37.0`, then unzip)
  --crd FILE  the TFJob CRD of the Kubeflow training operator (kubeflow/training-operator,
              branch release-1.9, manifests/base/crds/kubeflow.org_tfjobs.yaml)

Each output is one standalone draft 2020-12 schema: the kind's schema with only the
definitions it reaches, under `$defs`. Descriptions are dropped (they are most of the bytes
and no part of validation). The TFJob's schema is the CRD's `openAPIV3Schema` with three
changes, each what the API server or the operator does with a TFJob: every object that does
not preserve unknown fields refuses them (`additionalProperties: false`, as
`kubectl apply --validate=strict` does), a replica's `template` is Kubernetes' own strict
PodTemplateSpec (the CRD leaves it open), and `restartPolicy` is one of the four policies
the operator knows.
"""

import argparse
import json
import pathlib
import sys

import jsonschema
import yaml

K8S_KINDS = {
    "service-v1.json": "service-v1.json",
    "configmap-v1.json": "configmap-v1.json",
    "persistentvolumeclaim-v1.json": "persistentvolumeclaim-v1.json",
    "statefulset-apps-v1.json": "statefulset-apps-v1.json",
}
DEFS_REF = "/api/_definitions.json#/$defs/"
LOCAL_REF = "#/$defs/"
# The policies of a TFJob replica (training-operator pkg/apis/kubeflow.org/v1/common_types.go).
RESTART_POLICIES = ["Always", "OnFailure", "Never", "ExitCode"]


def strip(node):
    """Drops descriptions and rewrites references to the bundle's own `$defs`."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                continue
            if key == "$ref" and isinstance(value, str) and value.startswith(DEFS_REF):
                value = LOCAL_REF + value[len(DEFS_REF) :]
            out[key] = strip(value)
        return out
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith(LOCAL_REF):
                yield value[len(LOCAL_REF) :]
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def bundle(schema, definitions):
    """`schema` with every definition it reaches, transitively, under `$defs`."""
    needed, todo = {}, list(refs(schema))
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed[name] = definitions[name]
        todo.extend(refs(needed[name]))
    schema["$defs"] = {name: needed[name] for name in sorted(needed)}
    return schema


def close_objects(node):
    """Refuses unknown fields wherever the CRD's structural schema would prune them."""
    if isinstance(node, dict):
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for value in node.values():
            close_objects(value)
    elif isinstance(node, list):
        for value in node:
            close_objects(value)


def tfjob_schema(crd_path, definitions):
    crd = yaml.safe_load(crd_path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strip(version["schema"]["openAPIV3Schema"])
    close_objects(schema)
    schema["properties"]["apiVersion"]["enum"] = ["kubeflow.org/v1"]
    schema["properties"]["kind"]["enum"] = ["TFJob"]
    schema["properties"]["metadata"] = {
        "$ref": LOCAL_REF + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    }
    replica = schema["properties"]["spec"]["properties"]["tfReplicaSpecs"]["additionalProperties"]
    replica["properties"]["template"] = {"$ref": LOCAL_REF + "io.k8s.api.core.v1.PodTemplateSpec"}
    replica["properties"]["restartPolicy"]["enum"] = RESTART_POLICIES
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "spec"})
    out = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://kubeflow.org/tfjob/v1",
        "x-kubernetes-group-version-kind": [
            {"group": "kubeflow.org", "kind": "TFJob", "version": "v1"}
        ],
    }
    out.update(schema)
    return bundle(out, definitions)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k8s", type=pathlib.Path, required=True)
    parser.add_argument("--crd", type=pathlib.Path, required=True)
    args = parser.parse_args()
    here = pathlib.Path(__file__).resolve().parent
    definitions = strip(json.loads((args.k8s / "_definitions.json").read_text()))["$defs"]
    outputs = {}
    for out_name, in_name in K8S_KINDS.items():
        outputs[out_name] = bundle(strip(json.loads((args.k8s / in_name).read_text())), definitions)
    outputs["tfjob-kubeflow.org-v1.json"] = tfjob_schema(args.crd, definitions)
    for name, schema in outputs.items():
        jsonschema.validators.validator_for(schema).check_schema(schema)
        text = json.dumps(schema, indent=1, sort_keys=False) + "\n"
        (here / name).write_text(text)
        print(f"{name}: {len(text)} bytes, {len(schema['$defs'])} definitions", file=sys.stderr)


if __name__ == "__main__":
    main()
