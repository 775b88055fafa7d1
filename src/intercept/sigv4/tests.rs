use super::*;
use std::time::UNIX_EPOCH;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        h.insert(
            http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

#[test]
fn reads_header_and_query_authentication() {
    let h = headers(&[(
        "authorization",
        "AWS4-HMAC-SHA256 Credential=AKIAEXAMPLE/20260101/eu-west-1/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature=00",
    )]);
    let Auth::SigV4(s) = auth(&"/b/k".parse().unwrap(), &h) else {
        panic!("not read")
    };
    assert_eq!(
        (s.key_id.as_str(), s.region.as_str(), s.service.as_str()),
        ("AKIAEXAMPLE", "eu-west-1", "s3")
    );
    assert_eq!(s.signed_headers, ["host", "x-amz-date"]);
    let q: Uri = "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAX%2F20260101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20260101T000000Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Signature=00"
        .parse()
        .unwrap();
    let Auth::SigV4(s) = auth(&q, &HeaderMap::new()) else {
        panic!("not read")
    };
    assert_eq!(s.presigned, Some(("20260101T000000Z".into(), 60)));
    assert_eq!(auth(&"/".parse().unwrap(), &HeaderMap::new()), Auth::None);
    let v2 = headers(&[("authorization", "AWS AKIAX:c2ln")]);
    assert!(matches!(auth(&"/".parse().unwrap(), &v2), Auth::Other(_)));
    let v4a = headers(&[("authorization", "AWS4-ECDSA-P256-SHA256 Credential=AKIAX/20260101/s3/aws4_request, SignedHeaders=host, Signature=00")]);
    assert!(matches!(auth(&"/".parse().unwrap(), &v4a), Auth::Other(_)));
}

#[test]
fn an_expired_presigned_url_has_no_time_left() {
    assert!(remaining("20200101T000000Z", 3600).is_none());
    let now = time::OffsetDateTime::now_utc();
    let f = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let at = now.format(f).unwrap();
    assert!(remaining(&at, 3600).is_some_and(|d| d <= Duration::from_secs(3600)));
    assert!(remaining("garbage", 3600).is_none());
}

/// AWS's own worked example of a signed streaming upload (S3 documentation, "Signature
/// calculations for the Authorization header: transferring payload in multiple chunks"):
/// the same secret, date, scope and seed give the documented chunk signatures.
#[test]
fn chunk_signatures_match_aws_worked_example() {
    let time = UNIX_EPOCH + Duration::from_secs(1_369_353_600); // 2013-05-24T00:00:00Z
    let key = v4::generate_signing_key(
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        time,
        "us-east-1",
        "s3",
    );
    let mut c = Chunks::new(
        key.as_ref().to_vec(),
        "20130524T000000Z".into(),
        "20130524/us-east-1/s3/aws4_request".into(),
        "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9".into(),
    );
    let stale = "0".repeat(64);
    let mut body = Vec::new();
    for len in [65536usize, 1024, 0] {
        body.extend(format!("{len:x};chunk-signature={stale}\r\n").bytes());
        body.extend(std::iter::repeat_n(b'a', len));
        body.extend(b"\r\n");
    }
    // Fed in uneven pieces, as a network delivers it.
    let mut out = Vec::new();
    for piece in body.chunks(7001) {
        out.extend_from_slice(&c.push(piece).unwrap());
    }
    assert!(c.finished());
    assert_eq!(out.len(), body.len());
    let text = String::from_utf8_lossy(&out);
    for sig in [
        "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
        "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
        "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
    ] {
        assert!(text.contains(sig), "missing {sig}");
    }
}

#[test]
fn framing_it_cannot_read_is_an_error() {
    let new = || Chunks::new(vec![1], "d".into(), "s".into(), "seed".into());
    let sig = "0".repeat(64);
    assert!(new().push(b"5\r\nhello\r\n").is_err());
    assert!(new()
        .push(format!("5;chunk-signature={sig}\r\nhelloXX").as_bytes())
        .is_err());
    assert!(new().push(&[b'1'; 200]).is_err());
    let mut c = new();
    c.push(format!("0;chunk-signature={sig}\r\n\r\n").as_bytes())
        .unwrap();
    assert!(c.push(b"more").is_err());
}

fn keys() -> AwsKeys {
    AwsKeys {
        access_key_id: crate::config::credentials::Secret::new("AKIAREAL"),
        secret_access_key: crate::config::credentials::Secret::new("realsecret"),
        session_token: None,
        placeholder_secret: "placeholdersecret".into(),
    }
}

#[test]
fn a_presigned_url_is_signed_again_in_its_query() {
    let now = time::OffsetDateTime::now_utc();
    let f = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    let at = now.format(f).unwrap();
    let uri = format!("/b/k?versionId=3&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAPH%2F{}%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date={at}&X-Amz-Expires=300&X-Amz-SignedHeaders=host&X-Amz-Signature=00", &at[..8]);
    let mut req = Request::get(uri)
        .header("host", "s3.test:9")
        .body(())
        .unwrap();
    let k = AwsSigV4::new(keys());
    assert!(k.misuse(req.uri(), req.headers(), "AKIAPH").is_none());
    assert!(k.misuse(req.uri(), req.headers(), "AKIAOTHER").is_some());
    k.resign(&mut req, None).unwrap().unwrap();
    let q = req.uri().query().unwrap().to_string();
    assert!(q.contains("versionId=3"), "{q}");
    assert!(q.contains("X-Amz-Credential=AKIAREAL%2F"), "{q}");
    assert!(q.contains("X-Amz-Signature="), "{q}");
    assert!(
        !q.contains("AKIAPH") && !q.contains("X-Amz-Signature=00&"),
        "{q}"
    );
    assert!(
        req.uri().path() == "/b/k" && req.uri().authority().is_none(),
        "{}",
        req.uri()
    );
}

#[test]
fn a_presigned_url_dated_ahead_or_living_past_seven_days_is_not_re_signed() {
    let now = UNIX_EPOCH + Duration::from_secs(1_798_761_600); // 2027-01-01T00:00:00Z
    let at = "20270101T000000Z";
    assert_eq!(remaining_at(at, 60, now), Some(Duration::from_secs(60)));
    // Thirty seconds ahead is skew; a year ahead stretches the life (review W6).
    assert!(remaining_at("20270101T000030Z", 3600, now).is_some());
    assert_eq!(remaining_at("20280101T000000Z", 3600, now), None);
    assert_eq!(remaining_at(at, 604_801, now), None);
    assert_eq!(
        remaining_at(at, 604_800, now),
        Some(Duration::from_secs(604_800))
    );
    assert_eq!(remaining_at("20261201T000000Z", 60, now), None, "expired");
}
