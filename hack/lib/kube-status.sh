# patch_status RESOURCE_PATH JSON: merge-patch the status subresource of an object through the API
# (curl with $KUBECONFIG's server and token), e.g. patch_status /api/v1/nodes/node-0 '{"status":{...}}'.
# `kubectl patch --subresource=status` needs kubectl >= 1.24; a fresh Debian 12 fetches kubectl 1.20.
patch_status() {
  local server token
  server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
  token=$(kubectl config view --minify --raw -o jsonpath='{.users[0].user.token}')
  curl -fsSk -X PATCH -H "Authorization: Bearer $token" -H 'Content-Type: application/merge-patch+json' \
    --data "$2" "$server$1/status"
}
