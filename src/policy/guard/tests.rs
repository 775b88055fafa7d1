//! Unit tests of [`super`].

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn every_listed_ipv4_range_is_special_at_both_ends() {
    for (net, len, _) in SPECIAL_V4 {
        let lo = u32::from_be_bytes(*net);
        let hi = lo | (u32::MAX >> u32::from(*len));
        assert!(special_purpose(IpAddr::V4(Ipv4Addr::from(lo))).is_some());
        assert!(special_purpose(IpAddr::V4(Ipv4Addr::from(hi))).is_some());
    }
}

#[test]
fn every_listed_ipv6_range_is_special_at_both_ends() {
    for (net, len, _) in SPECIAL_V6 {
        let hi = if *len == 128 {
            *net
        } else {
            net | (u128::MAX >> u32::from(*len))
        };
        assert!(
            special_purpose(IpAddr::V6(Ipv6Addr::from(*net))).is_some(),
            "{net:x}"
        );
        assert!(
            special_purpose(IpAddr::V6(Ipv6Addr::from(hi))).is_some(),
            "{hi:x}"
        );
    }
}

#[test]
fn public_addresses_are_not_special() {
    for a in [
        "1.1.1.1",
        "8.8.8.8",
        "9.255.255.255",
        "11.0.0.0",
        "100.63.255.255",
        "100.128.0.0",
        "172.15.255.255",
        "172.32.0.0",
        "192.167.255.255",
        "192.169.0.0",
        "198.17.255.255",
        "198.20.0.0",
        "223.255.255.255",
        "2606:4700::1111",
        "2a00:1450::1",
        "2001:db9::1",
        "64:ff9b::808:808",
        "2002:808:808::1",
    ] {
        assert_eq!(special_purpose(ip(a)), None, "{a}");
    }
}

#[test]
fn embedded_ipv4_is_unwrapped() {
    // IPv4-mapped, NAT64, 6to4, Teredo (client obfuscated), IPv4-compatible.
    for a in [
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "64:ff9b::a9fe:a9fe",
        "64:ff9b::10.0.0.1",
        "2002:a00:1::",
        "2002:7f00:1::1",
        "2001:0:4136:e378:8000:63bf:f5ff:fffe",
        "::10.0.0.1",
        "::ffff:0.0.0.0",
    ] {
        assert!(special_purpose(ip(a)).is_some(), "{a}");
    }
    // Teredo whose server and client are both public is not special by embedding; it is
    // not in the list either (2001::/32 is routed).
    assert_eq!(
        embedded_ipv4("2001:0:4136:e378:8000:63bf:3fff:fdd2".parse().unwrap()),
        [
            Some(Ipv4Addr::new(65, 54, 227, 120)),
            Some(Ipv4Addr::new(192, 0, 2, 45))
        ]
    );
    assert_eq!(embedded_ipv4("2606:4700::1".parse().unwrap()), [None, None]);
}

#[test]
fn guard_checks_loop_cover_and_operator_ranges() {
    let g = Guard::new(
        &["203.0.114.0/24".parse().unwrap()],
        &["10.9.0.0/16".parse().unwrap()],
        vec![
            "127.0.0.1:3128".parse().unwrap(),
            "0.0.0.0:15001".parse().unwrap(),
        ],
    );
    let none = |_: IpAddr| None::<IpNet>;
    assert_eq!(g.check(ip("1.1.1.1"), 443, none), GuardVerdict::Permit);
    assert!(matches!(
        g.check(ip("10.0.0.1"), 443, none),
        GuardVerdict::Prohibited(_)
    ));
    assert_eq!(g.check(ip("10.9.1.1"), 443, none), GuardVerdict::Permit);
    assert_eq!(
        g.check(ip("203.0.114.9"), 443, none),
        GuardVerdict::Prohibited("defaults.prohibited_ranges")
    );
    // Covered by the sandbox's own rule.
    assert_eq!(
        g.check(ip("10.0.0.1"), 5432, |a| (a == ip("10.0.0.1"))
            .then(|| net("10.0.0.1/32"))),
        GuardVerdict::Permit
    );
    assert_eq!(
        g.check(ip("::ffff:10.0.0.1"), 5432, |a| (a == ip("10.0.0.1"))
            .then(|| net("10.0.0.1/32"))),
        GuardVerdict::Permit
    );
    // Loop protection even when covered.
    assert_eq!(g.check(ip("127.0.0.1"), 3128, exact), GuardVerdict::Loop);
    assert_eq!(
        g.check(ip("::ffff:127.0.0.1"), 3128, exact),
        GuardVerdict::Loop
    );
    assert_eq!(g.check(ip("127.0.0.5"), 15001, exact), GuardVerdict::Loop);
    assert_eq!(g.check(ip("127.0.0.1"), 3129, exact), GuardVerdict::Permit);
}

#[test]
fn every_address_of_this_host_on_a_listener_port_is_the_proxy() {
    let g = Guard::new(&[], &[], vec!["127.0.0.1:3128".parse().unwrap()])
        .with_local(vec![ip("10.1.2.3"), ip("2001:db8::5")]);
    let everything = exact;
    for a in [
        "127.0.0.1",
        "127.9.9.9",
        "0.0.0.0",
        "0.1.2.3",
        "::",
        "::1",
        "::ffff:0.0.0.0",
        "::ffff:127.0.0.1",
        "10.1.2.3",
        "2001:db8::5",
    ] {
        assert_eq!(g.check(ip(a), 3128, everything), GuardVerdict::Loop, "{a}");
    }
    assert_eq!(
        g.check(ip("10.1.2.3"), 443, everything),
        GuardVerdict::Permit
    );
    assert_eq!(
        g.check(ip("10.1.2.4"), 3128, everything),
        GuardVerdict::Permit
    );
}

/// A rule covering every address of `a` exactly.
fn exact(a: IpAddr) -> Option<IpNet> {
    Some(IpNet::from(a))
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// An address rule opens a prohibited range only when it lies inside it; metadata only
/// by its exact entry; the operator's ranges likewise.
#[test]
fn an_address_rule_opens_only_the_ranges_it_lies_inside() {
    let g = Guard::new(&[net("203.0.114.0/24")], &[], Vec::new());
    let judge = |a: &str, rule: &str| g.check(ip(a), 443, |_| Some(net(rule)));
    let open = GuardVerdict::Permit;
    assert_eq!(judge("10.1.2.3", "10.1.0.0/16"), open);
    assert_eq!(judge("10.1.2.3", "10.0.0.0/8"), open);
    assert_ne!(judge("10.1.2.3", "0.0.0.0/0"), open);
    assert_ne!(judge("10.1.2.3", "8.0.0.0/6"), open);
    assert_ne!(judge("127.0.0.1", "0.0.0.0/0"), open);
    assert_eq!(judge("127.0.0.1", "127.0.0.0/8"), open);
    assert_ne!(judge("169.254.169.254", "0.0.0.0/0"), open);
    assert_ne!(judge("169.254.169.254", "169.254.0.0/16"), open);
    assert_ne!(judge("169.254.169.254", "169.254.169.0/24"), open);
    assert_eq!(judge("169.254.169.254", "169.254.169.254/32"), open);
    assert_eq!(judge("169.254.1.1", "169.254.0.0/16"), open);
    assert_ne!(judge("fd00:ec2::254", "fd00::/8"), open);
    assert_eq!(judge("fd00:ec2::254", "fd00:ec2::254/128"), open);
    assert_ne!(judge("::1", "::/0"), open);
    assert_ne!(judge("fd12::1", "::/0"), open);
    assert_eq!(judge("fd12::1", "fd12::/16"), open);
    // Embedded IPv4: NAT64 of 10.0.0.1 opens by a rule inside 64:ff9b::10.0.0.0/104.
    assert_ne!(judge("64:ff9b::a00:1", "64:ff9b::/96"), open);
    assert_eq!(judge("64:ff9b::a00:1", "64:ff9b::a00:0/104"), open);
    assert_ne!(judge("2002:a00:1::1", "2002::/16"), open);
    assert_eq!(judge("2002:a00:1::1", "2002:a00::/24"), open);
    // Operator ranges.
    assert_ne!(judge("203.0.114.9", "203.0.0.0/16"), open);
    assert_eq!(judge("203.0.114.9", "203.0.114.0/25"), open);
    // Public addresses are not the guard's to refuse.
    assert_eq!(judge("1.1.1.1", "0.0.0.0/0"), open);
}

#[test]
fn this_hosts_addresses_are_listed() {
    let g = Guard::new(&[], &[], vec!["127.0.0.1:1".parse().unwrap()]);
    assert!(g.local.contains(&ip("127.0.0.1")), "{:?}", g.local);
}
