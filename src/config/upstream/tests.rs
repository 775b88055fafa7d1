//! Unit tests of [`super`].

use super::*;
use crate::egress::parent::bypassed;
use crate::policy::target::Target;

fn raw(url: &str) -> RawUpstreamProxy {
    RawUpstreamProxy {
        url: url.into(),
        auth: Some(RawParentAuth {
            username: "agent".into(),
            password_file: "pw".into(),
        }),
        ca_file: None,
        bypass: vec!["internal.test".into(), "*.corp.test".into()],
    }
}

fn no_file(path: &str) -> crate::config::files::ReadError {
    crate::config::files::ReadError {
        path: path.into(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
    }
}

fn read(_: &str) -> Result<String, crate::config::files::ReadError> {
    Ok("s3cret\n".into())
}

fn t(s: &str) -> Target {
    Target::parse(s, None).unwrap()
}

#[test]
fn a_parent_resolves_and_never_shows_its_password() {
    let mut w = Vec::new();
    let p = resolve(
        &raw("http://Squid.test:3128"),
        &read,
        super::super::Secrets::Required,
        &mut w,
    )
    .unwrap();
    assert_eq!((p.host.as_str(), p.port), ("squid.test", 3128));
    let auth = p.authorization.clone().unwrap();
    assert_eq!(auth.value(), "Basic YWdlbnQ6czNjcmV0");
    assert!(!format!("{p:?}").contains("YWdlbnQ6czNjcmV0"));
    assert!(bypassed(&p, &t("internal.test:443")) && bypassed(&p, &t("a.corp.test:80")));
    for not in ["corp.test:443", "xcorp.test:443", "other.test:443"] {
        assert!(!bypassed(&p, &t(not)), "{not}");
    }
    assert_eq!(
        resolve(
            &raw("http://[::1]:8080"),
            &read,
            super::super::Secrets::Required,
            &mut w
        )
        .unwrap()
        .shown(),
        "[::1]:8080"
    );
}

/// `bypass` takes `network.egress` entries: names, suffixes, globs, ports, addresses and
/// ranges (which match address targets only), `localhost`.
#[test]
fn bypass_takes_the_entries_of_network_egress() {
    let mut w = Vec::new();
    let entries = [
        "**.svc.test",
        "ci-*.build.test",
        "registry.test:5000",
        "10.0.0.0/8",
        "[fd00::/8]:443",
        "localhost",
    ];
    let r = RawUpstreamProxy {
        bypass: entries.iter().map(|e| e.to_string()).collect(),
        ..raw("http://squid.test:3128")
    };
    let p = resolve(&r, &read, super::super::Secrets::Required, &mut w).unwrap();
    for yes in [
        "svc.test:80",
        "a.b.svc.test:443",
        "ci-7.build.test:443",
        "registry.test:5000",
        "10.1.2.3:22",
        "[fd00::1]:443",
        "localhost:8080",
        "127.0.0.1:80",
    ] {
        assert!(bypassed(&p, &t(yes)), "{yes}");
    }
    for no in [
        "xsvc.test:80",
        "a.ci-7.build.test:443",
        "ci-7.x.build.test:443",
        "registry.test:443",
        "11.1.2.3:22",
        "[fd00::1]:80",
        "internal.test:443",
    ] {
        assert!(!bypassed(&p, &t(no)), "{no}");
    }
    let r = RawUpstreamProxy {
        bypass: vec!["https://x.test".into(), "*".into()],
        ..raw("http://squid.test:3128")
    };
    let e = resolve(&r, &read, super::super::Secrets::Required, &mut w).unwrap_err();
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].contains("write `x.test") && e[1].contains("bypass: `*`"),
        "{e:?}"
    );
}

#[test]
fn bad_parents_are_refused_with_a_reason() {
    let mut w = Vec::new();
    for (url, why) in [
        ("https://squid.test:3128/x", "no path"),
        ("socks5://squid.test:1080", "expected http"),
        ("http://user:pw@squid.test:3128", "no credentials"),
        ("http://squid.test", "port"),
        ("http://squid.test:3128/path", "no path"),
    ] {
        let e = resolve(&raw(url), &read, super::super::Secrets::Required, &mut w).unwrap_err();
        assert!(e.join(" ").contains(why), "{url}: {e:?}");
    }
    let missing = |_: &str| Err(no_file("pw"));
    let e = resolve(
        &raw("http://squid.test:3128"),
        &missing,
        super::super::Secrets::Required,
        &mut w,
    )
    .unwrap_err();
    assert!(e[0].contains("password_file"), "{e:?}");
    assert!(resolve(
        &raw("http://squid.test:3128"),
        &missing,
        super::super::Secrets::MayBeAbsent,
        &mut w
    )
    .is_ok());
    assert_eq!(w.len(), 1);
}

#[test]
fn an_https_parent_is_verified_against_its_ca_file() {
    let mut w = Vec::new();
    let with_ca = |url: &str, ca: Option<&str>| RawUpstreamProxy {
        ca_file: ca.map(String::from),
        ..raw(url)
    };
    // No ca_file: the public roots, and the name its certificate must carry.
    let p = resolve(
        &with_ca("https://Squid.test:3128", None),
        &read,
        super::super::Secrets::Required,
        &mut w,
    )
    .unwrap();
    let tls = p.tls.as_ref().unwrap();
    assert_eq!(
        format!("{:?}", tls.name),
        format!("{:?}", ServerName::try_from("squid.test").unwrap())
    );
    assert!(resolve(
        &raw("http://squid.test:3128"),
        &read,
        super::super::Secrets::Required,
        &mut w
    )
    .unwrap()
    .tls
    .is_none());
    // ca_file only with https, and it must hold a certificate.
    for (url, ca, why) in [
        (
            "http://squid.test:3128",
            Some("ca.pem"),
            "only for an https",
        ),
        (
            "https://squid.test:3128",
            Some("ca.pem"),
            "no PEM certificate",
        ),
    ] {
        let e = resolve(
            &with_ca(url, ca),
            &read,
            super::super::Secrets::Required,
            &mut w,
        )
        .unwrap_err();
        assert!(e.join(" ").contains(why), "{url}: {e:?}");
    }
    let unreadable = |f: &str| match f {
        "pw" => Ok("s3cret".to_string()),
        _ => Err(no_file("ca.pem")),
    };
    let e = resolve(
        &with_ca("https://squid.test:3128", Some("ca.pem")),
        &unreadable,
        super::super::Secrets::Required,
        &mut w,
    )
    .unwrap_err();
    assert!(e.join(" ").contains("ca_file: cannot read"), "{e:?}");
}
