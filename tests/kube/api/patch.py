"""The three patch formats the API server takes for built-in resources.

* ``application/json-patch+json``: RFC 6902 operations (the ``jsonpatch`` library);
* ``application/merge-patch+json``: RFC 7386 (maps merge, ``null`` deletes, lists are replaced);
* ``application/strategic-merge-patch+json``: the merge patch, except that lists whose Go type
  carries a ``patchMergeKey`` merge element by element on that key (containers by name, ports by
  containerPort ...), ``finalizers`` merge as a set, and ``$patch: replace`` / ``$patch: delete``
  are obeyed. The merge keys are those of k8s.io/api's types for the fields the double serves.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from tests.kube.api.errors import ApiError, bad_request, unsupported_media

Obj = dict[str, Any]
JSON_PATCH, MERGE_PATCH = "application/json-patch+json", "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
# field name -> patchMergeKey in k8s.io/api (the fields of the resources the double serves).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "conditions": "type",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
}
SET_LISTS = {"finalizers"}  # patchStrategy merge of a list of strings


def apply(content_type: str, target: Obj, patch: Any) -> Obj:
    kind = content_type.split(";")[0].strip()
    if kind == JSON_PATCH:
        if not isinstance(patch, list):
            raise bad_request("json: cannot unmarshal object into Go value of type []handlers.jsonPatchOp")
        try:
            return dict(jsonpatch.apply_patch(target, patch))
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
            raise ApiError(
                422, "Invalid", f"the server rejected our request due to an error in our request: {error}"
            ) from error
    if not isinstance(patch, dict):
        raise bad_request("json: cannot unmarshal array into Go value of type map[string]interface {}")
    if kind == MERGE_PATCH:
        return merge(target, patch)
    if kind == STRATEGIC:
        return strategic(target, patch)
    raise unsupported_media(content_type)


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


def strategic(target: Any, patch: Any, field: str = "") -> Any:
    if isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        if patch.get("$patch") == "delete":
            return None
        result = dict(target) if isinstance(target, dict) else {}
        for key, value in patch.items():
            if key.startswith("$"):
                continue  # $retainKeys, $setElementOrder: ordering hints the double need not follow
            if value is None:
                result.pop(key, None)
            else:
                result[key] = strategic(result.get(key), value, key)
        return result
    if isinstance(patch, list) and field in SET_LISTS:
        current = list(target or [])
        return current + [v for v in patch if v not in current]
    if isinstance(patch, list) and field in MERGE_KEYS and all(isinstance(v, dict) for v in patch):
        return _merge_list(list(target or []), patch, MERGE_KEYS[field])
    return copy.deepcopy(patch)


def _merge_list(current: list[Obj], patch: list[Obj], key: str) -> list[Obj]:
    if any(p.get("$patch") == "replace" for p in patch):
        return [
            copy.deepcopy({k: v for k, v in p.items() if k != "$patch"}) for p in patch if p.get("$patch") != "replace"
        ]
    result = [dict(item) for item in current]
    for element in patch:
        index = next((i for i, item in enumerate(result) if item.get(key) == element.get(key)), None)
        if element.get("$patch") == "delete":
            if index is not None:
                result.pop(index)
        elif index is None:
            result.append(strategic({}, element))
        else:
            result[index] = strategic(result[index], element)
    return result
