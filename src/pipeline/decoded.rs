//! What the DLP phase reads bytes as ([`views`]): as they are, and as an origin may decode
//! them — escapes undone (repeatedly), UTF-16/32 text with its NULs removed, base64 runs
//! decoded at every alignment. Pure functions over one chunk.

use std::borrow::Cow;

use base64::Engine;

use super::unescape;

/// How many times escapes are undone in a row, at most.
const MAX_UNESCAPE: usize = 3;

fn nul_count(bytes: &[u8]) -> usize {
    memchr::memchr_iter(0, bytes).count()
}

/// The shortest base64 run decoded: shorter ones are words, not encodings.
const MIN_BASE64: usize = 16;

/// `bytes` as they are and as an origin may decode them: percent and JSON escapes undone
/// (the scrubber's decoder), and each base64 run decoded — of the escapes-undone view too, so
/// percent-encoded base64 is found, and of a view with line breaks removed, so MIME base64
/// (a multipart part's, wrapped at 76 columns) is read whole.
pub fn views(bytes: &[u8]) -> Vec<Cow<'_, [u8]>> {
    let mut out = vec![Cow::Borrowed(bytes)];
    // UTF-16 or UTF-32 text (review 7a W2): ASCII in it is its bytes with NULs between; with
    // the NULs removed, a key in it reads as ASCII.
    let nuls = nul_count(bytes);
    if nuls > 0 && nuls * 4 >= bytes.len() {
        out.push(Cow::Owned(
            bytes.iter().copied().filter(|b| *b != 0).collect(),
        ));
    }
    // Escapes undone, again while some remain (`%2541` is `%41` is `A`: an origin that decodes
    // twice reads the key; review 7a W3), at most [`MAX_UNESCAPE`] times.
    let mut last = out.len() - 1;
    for _ in 0..MAX_UNESCAPE {
        if !unescape::has_escapes(&out[last]) {
            break;
        }
        let once = unescape::decode(&out[last]).0;
        if once == *out[last] {
            break;
        }
        out.push(Cow::Owned(once));
        last = out.len() - 1;
    }
    // Line breaks removed: a source of base64 runs only (text is matched as it is).
    let joined: Option<Vec<u8>> = bytes.contains(&b'\n').then(|| {
        bytes
            .iter()
            .copied()
            .filter(|b| *b != b'\n' && *b != b'\r')
            .collect()
    });
    let mut decoded = Vec::new();
    for v in out.iter().map(|v| &**v).chain(joined.as_deref()) {
        let b64 = |c: &u8| c.is_ascii_alphanumeric() || b"+/_-".contains(c);
        for run in v.split(|c| !b64(c)).filter(|r| r.len() >= MIN_BASE64) {
            decoded.extend(base64_run(run).into_iter().map(Cow::Owned));
        }
    }
    out.extend(decoded);
    out
}

/// One base64 run decoded at each of its four alignments (the encoded secret may start at any
/// offset of a longer run), either alphabet or both mixed (`-` `_` read as `+` `/`), its last
/// partial quantum included (the run ends where `=` padding begins).
fn base64_run(run: &[u8]) -> Vec<Vec<u8>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    let standard: Vec<u8> = run
        .iter()
        .map(|c| match c {
            b'-' => b'+',
            b'_' => b'/',
            c => *c,
        })
        .collect();
    (0..4)
        .filter_map(|k| {
            let from = standard.get(k..)?;
            // A single symbol left over carries no whole byte.
            let usable = match from.len() % 4 {
                1 => &from[..from.len() - 1],
                _ => from,
            };
            (usable.len() >= MIN_BASE64 - 3)
                .then(|| LENIENT.decode(usable).ok())
                .flatten()
        })
        .collect()
}
