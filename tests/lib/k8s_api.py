"""The API shapes of the Kubernetes release under test, for the harness's own objects.

The suites write EndpointSlices in `discovery.k8s.io/v1`; a kube-apiserver before 1.21 serves only
`discovery.k8s.io/v1beta1` (1.17-1.24). `endpointslice_for(obj, minor)` gives the object as release `minor`
takes it: v1beta1 keeps an endpoint's zone and node in `topology` (`topology.kubernetes.io/zone`,
`kubernetes.io/hostname`, as the 1.20 EndpointSlice controller writes them) and its `nodeName` (1.20, behind
the EndpointSliceNodeName gate the harness turns on); `hints` came in 1.21, so they are left out before (kubectl's
validation refuses the unknown field).

As a command: `k8s_api.py MINOR` reads YAML or JSON documents on stdin and writes them, EndpointSlices
converted, as YAML documents on stdout; `k8s_api.py MINOR --api` prints the EndpointSlice group/version.
"""
import sys

V1 = "discovery.k8s.io/v1"
V1BETA1 = "discovery.k8s.io/v1beta1"


def endpointslice_api(minor):
    """The EndpointSlice group/version release `minor` serves: v1 from 1.21, v1beta1 before."""
    return V1 if int(minor) >= 21 else V1BETA1


def endpointslice_for(obj, minor):
    """`obj` (any object; only a v1 EndpointSlice changes) as release `minor` takes it. A new dict."""
    if obj.get("kind") != "EndpointSlice" or obj.get("apiVersion") != V1 or endpointslice_api(minor) == V1:
        return obj
    out = dict(obj, apiVersion=V1BETA1)
    endpoints = []
    for ep in obj.get("endpoints") or []:
        ep = dict(ep)
        topology = dict(ep.pop("deprecatedTopology", None) or {})
        if "zone" in ep:
            topology["topology.kubernetes.io/zone"] = ep.pop("zone")
        if int(minor) < 21:
            ep.pop("hints", None)
        if ep.get("nodeName"):
            topology["kubernetes.io/hostname"] = ep["nodeName"]
        if topology:
            ep["topology"] = topology
        endpoints.append(ep)
    if "endpoints" in obj:
        out["endpoints"] = endpoints
    return out


def main(argv):
    minor = argv[1]
    if argv[2:] == ["--api"]:
        print(endpointslice_api(minor))
        return
    import yaml  # python3-yaml: the suites that call this install it

    docs = [d for d in yaml.safe_load_all(sys.stdin) if d is not None]
    items = []
    for d in docs:
        items.extend(d["items"] if d.get("kind") == "List" else [d])
    yaml.safe_dump_all([endpointslice_for(o, minor) for o in items], sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main(sys.argv)
