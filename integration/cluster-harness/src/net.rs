//! The node's address inside the test's own network namespace: the kubelet refuses a loopback node IP,
//! so the namespace gets a veth pair whose first end carries the address the API server, etcd's
//! clients and the kubelet use. Both ends stay in the namespace; nothing reaches the host's network.

use std::process::Command;

use nvinject_node_harness::kubelet::KubeletError;
use nvinject_node_harness::process;

/// A veth pair with the node's address on its first end, and a default route through it.
#[derive(Debug)]
pub struct NodeNetwork {
    link: String,
    peer: String,
    address: String,
    removed: bool,
}

/// `ip <args>` in this process's network namespace.
pub(crate) fn ip(args: &[&str]) -> Result<(), KubeletError> {
    process::run(Command::new("ip").args(args))?;
    Ok(())
}

impl NodeNetwork {
    /// Creates `link` (with `address`/`prefix`) and its peer, both up, and a default route via `link`.
    /// Call it only inside an isolated test's network namespace.
    pub fn create(link: &str, peer: &str, address: &str, prefix: u8) -> Result<Self, KubeletError> {
        ip(&["link", "add", link, "type", "veth", "peer", "name", peer])?;
        // Owned from here on: a failure below removes the pair on drop.
        let net =
            NodeNetwork { link: link.into(), peer: peer.into(), address: address.into(), removed: false };
        ip(&["addr", "add", &format!("{address}/{prefix}"), "dev", link])?;
        ip(&["link", "set", link, "up"])?;
        ip(&["link", "set", peer, "up"])?;
        ip(&["route", "add", "default", "dev", link])?;
        Ok(net)
    }

    /// The node's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The two ends' names.
    pub fn links(&self) -> [&str; 2] {
        [&self.link, &self.peer]
    }

    /// Deletes the pair (its peer and route go with it).
    pub fn remove(&mut self) -> Result<(), KubeletError> {
        if !self.removed {
            ip(&["link", "del", &self.link])?;
            self.removed = true;
        }
        Ok(())
    }
}

impl Drop for NodeNetwork {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}

/// The names of the network interfaces in this network namespace (`ip -o link show`), without the
/// `@peer` suffix.
pub fn interfaces() -> Result<Vec<String>, KubeletError> {
    let out = process::run(Command::new("ip").args(["-o", "link", "show"]))?;
    Ok(parse_interfaces(&String::from_utf8_lossy(&out.stdout)))
}

/// Parses `ip -o link show` output (pure, for tests).
pub fn parse_interfaces(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_lose_their_peer_suffix() {
        let text = "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN\n\
                    5: nvi0@nvi1: <BROADCAST,MULTICAST,UP> mtu 1500 qdisc noqueue state UP\n\
                    7: cni0: <NO-CARRIER,BROADCAST> mtu 1500\n";
        assert_eq!(parse_interfaces(text), ["lo", "nvi0", "cni0"]);
    }
}
