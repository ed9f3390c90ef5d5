#!/usr/bin/env python3
"""The node test's cluster DNS (hack/test-node.sh): a dnsmasq configuration from the cluster's Services.

usage: kubectl get svc -A -o json | hack/node/dns-records.py LISTEN_IP HOSTS_FILE > dnsmasq.conf

Prints a dnsmasq configuration that listens on LISTEN_IP only, runs as root, answers for cluster.local alone (nothing is
forwarded), reads HOSTS_FILE, and has one `cname=` per ExternalName Service (NAME.NAMESPACE.svc.cluster.local
-> spec.externalName); writes HOSTS_FILE.new with one A record per ClusterIP Service (headless ones have none),
as the cluster DNS specification names them.

Errors: input that is not a Service list (exit status 1, message on stderr).
"""
import json
import sys


def main(listen, hosts_file):
    try:
        services = json.load(sys.stdin)["items"]
    except (ValueError, KeyError) as e:
        print(f"dns-records: not a Service list: {e}", file=sys.stderr)
        return 1
    # root reads HOSTS_FILE in the test's private state directory
    print("no-resolv\nno-hosts\nbind-interfaces\nuser=root")
    print(f"listen-address={listen}\nlocal=/cluster.local/\naddn-hosts={hosts_file}")
    hosts = []
    for service in services:
        meta, spec = service["metadata"], service["spec"]
        name = "{}.{}.svc.cluster.local".format(meta["name"], meta["namespace"])
        if spec.get("type") == "ExternalName":
            print("cname={},{}".format(name, spec["externalName"]))
        elif spec.get("clusterIP") not in (None, "", "None"):
            hosts.append("{} {}".format(spec["clusterIP"], name))
    with open(hosts_file + ".new", "w") as f:
        f.write("\n".join(hosts) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: hack/node/dns-records.py LISTEN_IP HOSTS_FILE", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
