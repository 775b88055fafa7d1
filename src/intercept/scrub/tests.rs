//! Tests of [`super`] (scrub).

use super::*;
use crate::config::credentials::Credential;
use http_body_util::BodyExt;

fn cred(name: &str, secret: &str, placeholder: &str) -> Credential {
    let raw = crate::config::credentials::RawCredential {
        name: name.into(),
        hosts: vec!["api.test".into()],
        inject: Some(crate::config::credentials::RawInject {
            header: Some("Authorization".into()),
            format: None,
            replace_placeholder: None,
        }),
        source: crate::config::credentials::RawSource {
            file: Some("f".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut c = crate::config::credentials::resolve(
        &raw,
        "sb",
        &|_| Ok(secret.to_string()),
        b"k",
        crate::config::Secrets::Required,
        &mut Vec::new(),
    )
    .unwrap();
    c.placeholder = placeholder.into();
    c
}

const SECRET: &str = "sk-live/0123456789+abcdefghij";
const PH: &str = "egp_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// The scrubber of one static credential (`SECRET`, placeholder `PH`).
fn api_scrubber() -> Arc<Scrubber> {
    let cx = super::super::credential::MintCx::for_tests();
    let bound = super::super::credential::bound(&cred("api", SECRET, PH), "sb", &cx);
    Arc::new(Scrubber::new([bound].iter()).unwrap())
}

async fn run(chunks: Vec<Vec<u8>>) -> (Vec<u8>, Vec<String>) {
    let s = api_scrubber();
    let stream = Chunks(chunks.into_iter().map(Bytes::from).collect());
    let findings = Arc::new(Mutex::new(Findings::default()));
    let body = Scrubbed::new(stream, s, 1 << 20, findings.clone());
    let out = body.collect().await.unwrap().to_bytes().to_vec();
    let names = findings.lock().unwrap().names.clone();
    (out, names)
}

/// A body that yields these chunks, one per poll (the MCP filter's tests use it too).
pub(crate) struct Chunks(pub(crate) std::collections::VecDeque<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

#[tokio::test]
async fn a_secret_split_across_chunks_is_replaced_at_the_same_length() {
    let body = format!("{{\"echo\":\"{SECRET}\"}}").into_bytes();
    for cut_at in 1..body.len() {
        let (out, names) = run(vec![body[..cut_at].to_vec(), body[cut_at..].to_vec()]).await;
        assert_eq!(out.len(), body.len());
        assert!(
            !String::from_utf8_lossy(&out).contains(SECRET),
            "cut at {cut_at}"
        );
        assert!(String::from_utf8_lossy(&out).contains(&PH[..SECRET.len()]));
        assert_eq!(names, vec!["api".to_string()]);
    }
}

#[tokio::test]
async fn base64_and_percent_forms_are_found() {
    let b64 = base64::engine::general_purpose::STANDARD;
    for prefix in ["", "u:", "us:", "use:"] {
        let enc = b64.encode(format!("{prefix}{SECRET}"));
        let (out, names) = run(vec![enc.clone().into_bytes()]).await;
        assert_ne!(out, enc.as_bytes(), "prefix {prefix:?}");
        assert_eq!(names.len(), 1);
    }
    let pct = SECRET.replace('/', "%2F").replace('+', "%2B");
    let (out, names) = run(vec![pct.clone().into_bytes()]).await;
    assert_ne!(out, pct.as_bytes());
    assert_eq!(names.len(), 1);
    // Clean bodies pass unchanged.
    let (out, names) = run(vec![b"hello ".to_vec(), b"world".to_vec()]).await;
    assert_eq!(out, b"hello world");
    assert!(names.is_empty());
}

/// A body of one data frame and a trailer section.
struct WithTrailers(u8, HeaderMap);

impl Body for WithTrailers {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0 += 1;
        Poll::Ready(match self.0 {
            1 => Some(Ok(Frame::data(Bytes::from_static(b"body")))),
            2 => Some(Ok(Frame::trailers(std::mem::take(&mut self.1)))),
            _ => None,
        })
    }
}

/// Trailers (HTTP/1.1 chunked trailer section, HTTP/2 trailing HEADERS) are scrubbed like
/// headers, and the finding is reported — even past the body's scan limit.
#[tokio::test]
async fn trailers_are_scrubbed() {
    for limit in [1 << 20, 0] {
        let s = api_scrubber();
        let mut t = HeaderMap::new();
        t.insert(
            "x-echo",
            HeaderValue::from_str(&format!("Bearer {SECRET}")).unwrap(),
        );
        let findings = Arc::new(Mutex::new(Findings::default()));
        let body = Scrubbed::new(WithTrailers(0, t), s, limit, findings.clone());
        let got = body.collect().await.unwrap();
        let t = got.trailers().cloned().unwrap();
        assert_eq!(t["x-echo"], format!("Bearer {}", &PH[..SECRET.len()]));
        assert_eq!(findings.lock().unwrap().names, vec!["api".to_string()]);
    }
}

/// Every encoding the fifth review got a secret back in: partly percent-encoded (`/`
/// kept, `+` as `%2B`), JSON `\/`, `\uXXXX`, hex in either case, lowercased — whole and
/// split across two chunks at every position.
#[tokio::test]
async fn encoded_forms_are_found_whole_and_split() {
    let json_u: String = SECRET
        .chars()
        .map(|c| format!("\\u{:04x}", c as u32))
        .collect();
    let forms = [
        SECRET.replace('+', "%2B"),
        SECRET.replace('/', "%2f"),
        SECRET.replace('/', "\\/"),
        json_u,
        hex::encode(SECRET),
        hex::encode(SECRET).to_uppercase(),
        SECRET.to_lowercase(),
        SECRET.to_uppercase(),
        SECRET
            .replace('-', "%2D")
            .replace('/', "%2F")
            .replace('+', "%2b"),
    ];
    for form in forms {
        let body = format!("Location: https://x/?t={form}&n=1").into_bytes();
        let (out, names) = run(vec![body.clone()]).await;
        assert_eq!(out.len(), body.len(), "{form}");
        let text = String::from_utf8_lossy(&out).to_string();
        assert!(!text.contains(&form), "{form}: {text}");
        assert_eq!(names, vec!["api".to_string()], "{form}");
        for cut_at in 1..body.len() {
            let (out, _) = run(vec![body[..cut_at].to_vec(), body[cut_at..].to_vec()]).await;
            assert_eq!(out.len(), body.len());
            assert!(
                !String::from_utf8_lossy(&out).contains(&form),
                "{form} cut at {cut_at}"
            );
        }
    }
}

#[test]
fn headers_are_scrubbed() {
    let s = api_scrubber();
    let mut h = HeaderMap::new();
    h.insert(
        "access-control-allow-origin",
        HeaderValue::from_static(SECRET),
    );
    h.insert("x-ok", HeaderValue::from_static("fine"));
    assert_eq!(s.headers(&mut h), vec!["api"]);
    assert_eq!(h["access-control-allow-origin"], &PH[..SECRET.len()]);
    assert_eq!(h["x-ok"], "fine");
    // Where the client goes next, never a placeholder.
    let mut h = HeaderMap::new();
    let to = format!("https://open.test/cb?token={SECRET}");
    h.insert("location", HeaderValue::from_str(&to).unwrap());
    assert_eq!(s.headers(&mut h), vec!["api"]);
    let location = h["location"].to_str().unwrap();
    assert!(
        !location.contains(SECRET) && !location.contains(&PH[..8]),
        "{location}"
    );
    assert!(
        location.starts_with("https://open.test/cb?token=redacted-"),
        "{location}"
    );
}
