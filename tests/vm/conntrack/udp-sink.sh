# The Service of tests/vm/36-udp-conntrack.sh, printed with the endpoints given as arguments
# (IP=NODE pairs): UDP 9000 on ClusterIP 10.96.0.50, NodePort 30950 and externalIP 203.0.113.50
# (externalTrafficPolicy Cluster: the NodePort and externalIP paths are masqueraded).
# usage: sh udp-sink.sh 10.244.1.20=test-node 10.244.3.21=node-b > udp-sink.yaml
cat <<YAML
apiVersion: v1
kind: Service
metadata: {name: udp-sink, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.50
  externalIPs: [203.0.113.50]
  externalTrafficPolicy: Cluster
  ports: [{name: sink, port: 9000, targetPort: 9000, nodePort: 30950, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: udp-sink-1, namespace: default, labels: {kubernetes.io/service-name: udp-sink}}
addressType: IPv4
YAML
[ $# -gt 0 ] && echo "endpoints:" || echo "endpoints: []"
for e in "$@"; do
  printf -- '- addresses: [%s]\n  conditions: {ready: true, serving: true, terminating: false}\n  nodeName: %s\n' \
    "${e%%=*}" "${e#*=}"
done
echo "ports: [{name: sink, port: 9000, protocol: UDP}]"
