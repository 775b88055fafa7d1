//! A longest-prefix-match table for IP ranges, one per address family: a hash map per prefix
//! length that occurs, probed from the longest length down. Lookups cost one hash probe per
//! distinct prefix length (at most 33 for IPv4, 129 for IPv6), never a scan over entries.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;

/// Ranges mapped to values; several values may share one range.
#[derive(Debug, Clone)]
pub struct AddrTable<T> {
    /// (prefix length, masked IPv4 network → values), longest prefix first.
    v4: Vec<(u8, HashMap<u32, Vec<T>>)>,
    /// Same for IPv6.
    v6: Vec<(u8, HashMap<u128, Vec<T>>)>,
}

impl<T> Default for AddrTable<T> {
    fn default() -> Self {
        AddrTable {
            v4: Vec::new(),
            v6: Vec::new(),
        }
    }
}

fn mask4(addr: u32, len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        addr & (u32::MAX << (32 - u32::from(len)))
    }
}

fn mask6(addr: u128, len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        addr & (u128::MAX << (128 - u32::from(len)))
    }
}

impl<T> AddrTable<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the table holds no range.
    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    /// Add `value` under `net`.
    pub fn insert(&mut self, net: IpNet, value: T) {
        match net {
            IpNet::V4(n) => {
                let len = n.prefix_len();
                let key = mask4(u32::from(n.network()), len);
                let pos = match self.v4.iter().position(|(l, _)| *l <= len) {
                    Some(p) if self.v4[p].0 == len => p,
                    Some(p) => {
                        self.v4.insert(p, (len, HashMap::new()));
                        p
                    }
                    None => {
                        self.v4.push((len, HashMap::new()));
                        self.v4.len() - 1
                    }
                };
                self.v4[pos].1.entry(key).or_default().push(value);
            }
            IpNet::V6(n) => {
                let len = n.prefix_len();
                let key = mask6(u128::from(n.network()), len);
                let pos = match self.v6.iter().position(|(l, _)| *l <= len) {
                    Some(p) if self.v6[p].0 == len => p,
                    Some(p) => {
                        self.v6.insert(p, (len, HashMap::new()));
                        p
                    }
                    None => {
                        self.v6.push((len, HashMap::new()));
                        self.v6.len() - 1
                    }
                };
                self.v6[pos].1.entry(key).or_default().push(value);
            }
        }
    }

    /// Release spare capacity (a compiled policy's table never grows again).
    pub fn shrink_to_fit(&mut self) {
        self.v4.shrink_to_fit();
        self.v6.shrink_to_fit();
        for (_, map) in &mut self.v4 {
            map.values_mut().for_each(Vec::shrink_to_fit);
            map.shrink_to_fit();
        }
        for (_, map) in &mut self.v6 {
            map.values_mut().for_each(Vec::shrink_to_fit);
            map.shrink_to_fit();
        }
    }

    /// Remove the values under exactly `net` for which `pred` holds.
    pub fn remove(&mut self, net: IpNet, pred: impl Fn(&T) -> bool) {
        match net {
            IpNet::V4(n) => {
                let len = n.prefix_len();
                let key = mask4(u32::from(n.network()), len);
                if let Some((_, map)) = self.v4.iter_mut().find(|(l, _)| *l == len) {
                    if let Some(values) = map.get_mut(&key) {
                        values.retain(|v| !pred(v));
                        if values.is_empty() {
                            map.remove(&key);
                        }
                    }
                }
                self.v4.retain(|(_, m)| !m.is_empty());
            }
            IpNet::V6(n) => {
                let len = n.prefix_len();
                let key = mask6(u128::from(n.network()), len);
                if let Some((_, map)) = self.v6.iter_mut().find(|(l, _)| *l == len) {
                    if let Some(values) = map.get_mut(&key) {
                        values.retain(|v| !pred(v));
                        if values.is_empty() {
                            map.remove(&key);
                        }
                    }
                }
                self.v6.retain(|(_, m)| !m.is_empty());
            }
        }
    }

    /// Values of every range containing `ip`, longest prefix first.
    pub fn matches(&self, ip: IpAddr) -> impl Iterator<Item = &T> {
        let (a, b) = match ip {
            IpAddr::V4(v4) => {
                let a = u32::from(v4);
                (
                    Some(
                        self.v4
                            .iter()
                            .filter_map(move |(len, map)| map.get(&mask4(a, *len))),
                    ),
                    None,
                )
            }
            IpAddr::V6(v6) => {
                let a = u128::from(v6);
                (
                    None,
                    Some(
                        self.v6
                            .iter()
                            .filter_map(move |(len, map)| map.get(&mask6(a, *len))),
                    ),
                )
            }
        };
        a.into_iter()
            .flatten()
            .chain(b.into_iter().flatten())
            .flat_map(|v| v.iter())
    }

    /// Whether any range contains `ip`.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.matches(ip).next().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn longest_prefix_first() {
        let mut t = AddrTable::new();
        t.insert(net("10.0.0.0/8"), "ten");
        t.insert(net("10.1.0.0/16"), "ten-one");
        t.insert(net("10.1.2.3/32"), "host");
        t.insert(net("0.0.0.0/0"), "all");
        let got: Vec<_> = t.matches(ip("10.1.2.3")).copied().collect();
        assert_eq!(got, ["host", "ten-one", "ten", "all"]);
        let got: Vec<_> = t.matches(ip("10.2.0.1")).copied().collect();
        assert_eq!(got, ["ten", "all"]);
        assert!(t.matches(ip("::1")).next().is_none());
    }

    #[test]
    fn ipv6_ranges() {
        let mut t = AddrTable::new();
        t.insert(net("2001:db8::/32"), 1);
        t.insert(net("::/0"), 2);
        t.insert(net("::1/128"), 3);
        assert_eq!(
            t.matches(ip("2001:db8::5")).copied().collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(t.matches(ip("::1")).copied().collect::<Vec<_>>(), [3, 2]);
        assert!(!t.contains(ip("1.2.3.4")));
    }

    #[test]
    fn remove_takes_out_only_what_it_names() {
        let mut t = AddrTable::new();
        let net: IpNet = "10.1.0.0/16".parse().unwrap();
        t.insert(net, "a");
        t.insert(net, "b");
        t.insert("10.0.0.0/8".parse().unwrap(), "c");
        t.remove(net, |v| *v == "a");
        let ip = "10.1.2.3".parse().unwrap();
        assert_eq!(t.matches(ip).copied().collect::<Vec<_>>(), ["b", "c"]);
        t.remove(net, |v| *v == "b");
        assert_eq!(t.matches(ip).copied().collect::<Vec<_>>(), ["c"]);
        t.remove("10.0.0.0/8".parse().unwrap(), |_| true);
        assert!(t.is_empty());
    }
}
