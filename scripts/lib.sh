# Sourced by the scripts that run a private containerd (demo.sh, bench.sh, symbol-order.sh).

# private_containerd_config WORK SOCK: writes WORK/containerd.toml for a containerd whose root,
# state and sockets (SOCK, SOCK.ttrpc) are its own, without the CRI plugin.
private_containerd_config() {
  cat >"$1/containerd.toml" <<TOML
version = 2
root = "$1/root"
state = "$1/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$2"
[ttrpc]
  address = "$2.ttrpc"
TOML
}
