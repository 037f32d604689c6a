"""Two machines on this one, for the benchmarks that need real addresses and a link between them (chaos.py's
--machines 2, islands.py's sites): network namespaces A (node 0, SUBNET.1) and B (node 1, SUBNET.2) joined by a veth
pair, optionally limited to a rate with tc's tbf (this kernel has no netem, so latency stays in the in-process
emulation). Needs root, `ip netns` and, for a rate, `tc`. Each benchmark names its own namespaces and subnet so that
they never meet."""
import subprocess
import sys


class TwoMachines:
    def __init__(self, names, subnet, rate=None):
        """names: (namespace A, namespace B, A's veth, B's veth); subnet: the first three octets ("10.79.0");
        rate: a tc rate ("100mbit") on both ends of the link, or None for an unlimited link."""
        self.A, self.B, self.VA, self.VB = names
        self.subnet = subnet
        self.down()
        script = (f"ip netns add {self.A} && ip netns add {self.B} && "
                  f"ip link add {self.VA} type veth peer name {self.VB} && "
                  f"ip link set {self.VA} netns {self.A} && ip link set {self.VB} netns {self.B} && "
                  f"ip -n {self.A} addr add {self.address(0)}/24 dev {self.VA} && "
                  f"ip -n {self.B} addr add {self.address(1)}/24 dev {self.VB} && "
                  f"ip -n {self.A} link set lo up && ip -n {self.B} link set lo up && "
                  f"ip -n {self.A} link set {self.VA} up && ip -n {self.B} link set {self.VB} up")
        if rate:
            script += "".join(f" && ip netns exec {ns} tc qdisc add dev {dev} root tbf rate {rate} burst 64kb latency 1s"
                              for ns, dev in ((self.A, self.VA), (self.B, self.VB)))
        r = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
        if r.returncode != 0:
            self.down()
            sys.exit(f"needs network namespaces{' and tc' if rate else ''} (root, ip netns): {r.stderr.strip()}")

    def address(self, node):
        return f"{self.subnet}.{node + 1}"

    def prefix(self, node):
        """The command prefix that runs a process on `node`."""
        if node == 0:  # Gloo on node 0 listens on the link's interface
            return ["ip", "netns", "exec", self.A, "env", f"GLOO_SOCKET_IFNAME={self.VA}"]
        return ["ip", "netns", "exec", self.B]

    def cut(self, up):
        """Takes the link down (up=False) or brings it back."""
        subprocess.run(["ip", "-n", self.B, "link", "set", self.VB, "up" if up else "down"], check=True)

    def down(self):
        """Kills what still runs inside and removes both namespaces (and the link with them)."""
        for ns in (self.A, self.B):
            subprocess.run(["bash", "-c", f"ip netns pids {ns} 2>/dev/null | xargs -r kill -9; sleep 0.2; "
                                          f"ip netns del {ns} 2>/dev/null"], capture_output=True)
