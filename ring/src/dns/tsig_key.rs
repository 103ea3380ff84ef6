//! TSIG keys (RFC 8945) read from BIND-style key files, as `tsig-keygen -a hmac-sha256 NAME`
//! writes them:
//!
//! ```text
//! key "ring-key" {
//!     algorithm hmac-sha256;
//!     secret "bWFkZSB1cCBmb3IgdGhlIGV4YW1wbGUsIG5vdCBhIGtleQ==";
//! };
//! ```
//!
//! A file holds exactly one `key` statement. Comments (`#`, `//`, `/* */`) are allowed, and so
//! is an unquoted name or secret; nothing else. Only `hmac-sha256` is accepted: it is what
//! `tsig-keygen` writes by default and what every server supports; weaker or truncated MACs are
//! refused rather than silently used.
//!
//! Like a [`Secret`](crate::secret::Secret), a [`TsigKey`] has no `Display` and its `Debug`
//! prints the key name and the file, never the secret; every [`TsigKeyError`] names the file
//! (and the key, once known) and never quotes the file's content, so a malformed line cannot
//! leak a secret into a log either.

use std::fmt;
use std::path::{Path, PathBuf};

use hickory_proto::rr::rdata::tsig::TsigAlgorithm;
use hickory_proto::rr::{Name, TSigner};

use crate::core::error::shorten;
use crate::core::names::Invalid;
use crate::secret::MAX_SECRET_BYTES;

/// The only TSIG algorithm accepted, as BIND spells it.
pub const TSIG_ALGORITHM: &str = "hmac-sha256";

/// Largest time difference, in seconds, between this host and the DNS server that a signed
/// message tolerates (RFC 8945 5.2.3; BIND and `nsupdate` use the same 300 s).
pub const TSIG_FUDGE_S: u16 = 300;

/// A TSIG key: its name and the secret shared with the DNS server. See the module docs.
#[derive(Clone, PartialEq, Eq)]
pub struct TsigKey {
    /// The key name as written in the file (the server looks keys up by this name).
    name: String,
    /// The decoded secret.
    secret: Vec<u8>,
    /// The file it was read from, or a description of its origin.
    origin: PathBuf,
}

impl TsigKey {
    /// Reads the key file at `path` (at most [`MAX_SECRET_BYTES`]).
    pub fn from_file(path: &Path) -> Result<Self, TsigKeyError> {
        let file = path.to_path_buf();
        let metadata = std::fs::metadata(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => TsigKeyError::Missing { file: file.clone() },
            _ => TsigKeyError::Read {
                file: file.clone(),
                why: e.to_string(),
            },
        })?;
        if !metadata.is_file() {
            return Err(TsigKeyError::Read {
                file,
                why: "not a regular file".into(),
            });
        }
        if metadata.len() > MAX_SECRET_BYTES {
            return Err(TsigKeyError::TooLarge {
                file,
                bytes: metadata.len(),
            });
        }
        let bytes = std::fs::read(path).map_err(|e| TsigKeyError::Read {
            file: file.clone(),
            why: e.to_string(),
        })?;
        // The size may have changed between the two calls.
        if bytes.len() as u64 > MAX_SECRET_BYTES {
            return Err(TsigKeyError::TooLarge {
                file,
                bytes: bytes.len() as u64,
            });
        }
        let text = String::from_utf8(bytes).map_err(|_| TsigKeyError::NotAKeyFile {
            file: file.clone(),
            why: "it is not UTF-8 text".into(),
        })?;
        Self::parse(&text, path)
    }

    /// Parses the text of a key file; `file` names it in errors.
    pub fn parse(text: &str, file: &Path) -> Result<Self, TsigKeyError> {
        let file = file.to_path_buf();
        let not_a_key_file = |why: Invalid| TsigKeyError::NotAKeyFile {
            file: file.clone(),
            why: why.into(),
        };
        let tokens = tokenize(text).map_err(not_a_key_file)?;
        let statements = parse_statements(&tokens).map_err(not_a_key_file)?;
        let statement = match statements.as_slice() {
            [] => {
                return Err(TsigKeyError::NotAKeyFile {
                    file,
                    why: "it holds no `key \"NAME\" { ... };` statement".into(),
                });
            }
            [one] => one,
            many => {
                return Err(TsigKeyError::MoreThanOneKey {
                    file,
                    names: many.iter().map(|s| shorten(&s.name)).collect(),
                });
            }
        };
        let key_error = |kind: fn(PathBuf, String) -> TsigKeyError| {
            kind(file.clone(), shorten(&statement.name))
        };
        if Name::from_ascii(&statement.name).is_err() || statement.name.is_empty() {
            return Err(TsigKeyError::NotAKeyFile {
                file,
                why: format!("key name {:?} is not a DNS name", shorten(&statement.name)),
            });
        }
        if !statement.algorithm.eq_ignore_ascii_case(TSIG_ALGORITHM) {
            return Err(TsigKeyError::UnknownAlgorithm {
                file,
                key: shorten(&statement.name),
                algorithm: shorten(&statement.algorithm),
            });
        }
        let secret = decode_base64(&statement.secret)
            .ok_or_else(|| key_error(|file, key| TsigKeyError::BadBase64 { file, key }))?;
        if secret.is_empty() {
            return Err(key_error(|file, key| TsigKeyError::EmptySecret {
                file,
                key,
            }));
        }
        Ok(Self {
            name: statement.name.clone(),
            secret,
            origin: file,
        })
    }

    /// A key from its parts (for tests and keys that do not come from a file); `origin`
    /// describes where it came from in errors and `Debug`.
    pub fn new(
        name: &str,
        secret: Vec<u8>,
        origin: impl Into<PathBuf>,
    ) -> Result<Self, TsigKeyError> {
        let origin = origin.into();
        if name.is_empty() || Name::from_ascii(name).is_err() {
            return Err(TsigKeyError::NotAKeyFile {
                file: origin,
                why: format!("key name {:?} is not a DNS name", shorten(name)),
            });
        }
        if secret.is_empty() {
            return Err(TsigKeyError::EmptySecret {
                file: origin,
                key: shorten(name),
            });
        }
        Ok(Self {
            name: name.to_string(),
            secret,
            origin,
        })
    }

    /// The key name, as written in the file.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file the key was read from.
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// The secret's bytes. Hand them to the code that needs them; never format them.
    pub fn expose_secret(&self) -> &[u8] {
        &self.secret
    }

    /// hickory's signer for this key (hmac-sha256, fudge [`TSIG_FUDGE_S`]).
    pub(crate) fn signer(&self) -> Result<TSigner, SignerError> {
        let name = Name::from_ascii(&self.name)?;
        Ok(TSigner::new(
            self.secret.clone(),
            TsigAlgorithm::HmacSha256,
            name,
            TSIG_FUDGE_S,
        )?)
    }
}

impl fmt::Debug for TsigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TsigKey({:?}, {TSIG_ALGORITHM}, <redacted, {} bytes from {}>)",
            self.name,
            self.secret.len(),
            self.origin.display()
        )
    }
}

/// A key file that cannot be used. Names the file and, once it is known, the key; never the
/// secret or any other content of the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TsigKeyError {
    /// The file does not exist.
    #[error("TSIG key file {} does not exist", .file.display())]
    Missing {
        /// The file.
        file: PathBuf,
    },
    /// The file cannot be read.
    #[error("cannot read TSIG key file {}: {why}", .file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        why: String,
    },
    /// The file is larger than [`MAX_SECRET_BYTES`].
    #[error(
        "TSIG key file {} is {bytes} bytes; a key file is at most {MAX_SECRET_BYTES}",
        .file.display()
    )]
    TooLarge {
        /// The file.
        file: PathBuf,
        /// Its size.
        bytes: u64,
    },
    /// The file is not one `key "NAME" { algorithm ...; secret "..."; };` statement.
    #[error(
        "{} is not a TSIG key file: {why} (expected what `tsig-keygen -a {TSIG_ALGORITHM} NAME` writes)",
        .file.display()
    )]
    NotAKeyFile {
        /// The file.
        file: PathBuf,
        /// What is wrong, with a line number; never the file's content.
        why: String,
    },
    /// The key uses another algorithm than [`TSIG_ALGORITHM`].
    #[error(
        "TSIG key {key:?} in {}: algorithm {algorithm:?} is not supported; only {TSIG_ALGORITHM} is (tsig-keygen -a {TSIG_ALGORITHM})",
        .file.display()
    )]
    UnknownAlgorithm {
        /// The file.
        file: PathBuf,
        /// The key name.
        key: String,
        /// The algorithm named in the file.
        algorithm: String,
    },
    /// The secret is not valid base64.
    #[error("TSIG key {key:?} in {}: the secret is not valid base64", .file.display())]
    BadBase64 {
        /// The file.
        file: PathBuf,
        /// The key name.
        key: String,
    },
    /// The secret is empty.
    #[error("TSIG key {key:?} in {}: the secret is empty", .file.display())]
    EmptySecret {
        /// The file.
        file: PathBuf,
        /// The key name.
        key: String,
    },
    /// The file holds several keys; which one to use would be a guess.
    #[error(
        "{} holds {} TSIG keys ({}); put exactly one key in the file",
        .file.display(), .names.len(), quoted_list(.names)
    )]
    MoreThanOneKey {
        /// The file.
        file: PathBuf,
        /// The key names, in file order.
        names: Vec<String>,
    },
}

/// `"a", "b"`.
fn quoted_list(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One token of BIND's configuration syntax.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// A bare word or a quoted string (without the quotes).
    Word { text: String, quoted: bool },
    /// `{`
    Open,
    /// `}`
    Close,
    /// `;`
    Semicolon,
}

/// A token and the line it starts on.
type Located = (Token, usize);

/// Splits BIND configuration text into tokens, dropping comments. Errors never quote the text.
/// Why no signer can be made from a key.
#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    /// The key's name is not a DNS name.
    #[error("{0}")]
    Name(#[from] hickory_proto::ProtoError),
    /// hickory refuses the key (its algorithm).
    #[error("{0}")]
    Key(#[from] hickory_proto::dnssec::DnsSecError),
}

/// An [`Invalid`] with a formatted reason: what is wrong with a key file's text.
macro_rules! why {
    ($($reason:tt)*) => {
        Invalid(format!($($reason)*))
    };
}

fn tokenize(text: &str) -> Result<Vec<Located>, Invalid> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    while let Some(c) = chars.next() {
        match c {
            '\n' => line += 1,
            c if c.is_whitespace() => {}
            '#' => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        line += 1;
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        line += 1;
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let start = line;
                let mut previous = ' ';
                let mut closed = false;
                for c in chars.by_ref() {
                    if c == '\n' {
                        line += 1;
                    }
                    if previous == '*' && c == '/' {
                        closed = true;
                        break;
                    }
                    previous = c;
                }
                if !closed {
                    return Err(why!("line {start}: a /* comment is never closed"));
                }
            }
            '{' => tokens.push((Token::Open, line)),
            '}' => tokens.push((Token::Close, line)),
            ';' => tokens.push((Token::Semicolon, line)),
            '"' => {
                let start = line;
                let mut text = String::new();
                let mut closed = false;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => {
                            closed = true;
                            break;
                        }
                        '\\' => {
                            if let Some(escaped) = chars.next() {
                                text.push(escaped);
                            }
                        }
                        '\n' => {
                            line += 1;
                            text.push(c);
                        }
                        c => text.push(c),
                    }
                }
                if !closed {
                    return Err(why!("line {start}: a quoted string is never closed"));
                }
                tokens.push((Token::Word { text, quoted: true }, start));
            }
            c => {
                let mut text = String::from(c);
                while let Some(&next) = chars.peek() {
                    if next.is_whitespace() || matches!(next, '{' | '}' | ';' | '"' | '#') {
                        break;
                    }
                    text.push(next);
                    chars.next();
                }
                tokens.push((
                    Token::Word {
                        text,
                        quoted: false,
                    },
                    line,
                ));
            }
        }
    }
    Ok(tokens)
}

/// One parsed `key` statement.
struct KeyStatement {
    name: String,
    algorithm: String,
    secret: String,
}

/// Reads a sequence of `key NAME { algorithm ALG; secret SECRET; };` statements. Errors name
/// what was expected and the line, never the token found (it could be a secret).
fn parse_statements(tokens: &[Located]) -> Result<Vec<KeyStatement>, Invalid> {
    let mut statements = Vec::new();
    let mut at = 0;
    let last_line = tokens.last().map_or(1, |(_, line)| *line);
    let expect = |at: usize, what: &str| -> Invalid {
        match tokens.get(at) {
            Some((_, line)) => why!("line {line}: expected {what}"),
            None => why!("line {last_line}: the file ends where {what} was expected"),
        }
    };
    let word = |at: usize| match tokens.get(at) {
        Some((Token::Word { text, .. }, _)) => Some(text.clone()),
        _ => None,
    };
    let is = |at: usize, token: &Token| tokens.get(at).map(|(t, _)| t) == Some(token);
    while at < tokens.len() {
        match tokens.get(at) {
            Some((
                Token::Word {
                    text,
                    quoted: false,
                },
                _,
            )) if text.eq_ignore_ascii_case("key") => {}
            _ => return Err(expect(at, "a `key` statement")),
        }
        at += 1;
        let name = word(at).ok_or_else(|| expect(at, "the key name after `key`"))?;
        at += 1;
        if !is(at, &Token::Open) {
            return Err(expect(at, "`{` after the key name"));
        }
        at += 1;
        let (mut algorithm, mut secret) = (None, None);
        while !is(at, &Token::Close) {
            let line = tokens.get(at).map_or(last_line, |(_, line)| *line);
            let clause = match tokens.get(at) {
                Some((
                    Token::Word {
                        text,
                        quoted: false,
                    },
                    _,
                )) => text.to_ascii_lowercase(),
                _ => return Err(expect(at, "`algorithm`, `secret` or `}`")),
            };
            let slot = match clause.as_str() {
                "algorithm" => &mut algorithm,
                "secret" => &mut secret,
                _ => {
                    return Err(why!("line {line}: expected `algorithm`, `secret` or `}}`"));
                }
            };
            if slot.is_some() {
                return Err(why!("line {line}: `{clause}` is given twice"));
            }
            at += 1;
            *slot = Some(word(at).ok_or_else(|| expect(at, &format!("a value after `{clause}`")))?);
            at += 1;
            if !is(at, &Token::Semicolon) {
                return Err(expect(at, &format!("`;` after the value of `{clause}`")));
            }
            at += 1;
        }
        at += 1;
        if !is(at, &Token::Semicolon) {
            return Err(expect(at, "`;` after the `}` closing the key"));
        }
        at += 1;
        let algorithm =
            algorithm.ok_or_else(|| why!("key {:?} has no `algorithm`", shorten(&name)))?;
        let secret = secret.ok_or_else(|| why!("key {:?} has no `secret`", shorten(&name)))?;
        statements.push(KeyStatement {
            name,
            algorithm,
            secret,
        });
    }
    Ok(statements)
}

/// Decodes standard base64 (RFC 4648 section 4, padding optional, whitespace ignored as BIND
/// does); `None` if it is not base64.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let mut sextets = Vec::with_capacity(text.len());
    let mut padding = 0;
    for byte in text.bytes() {
        if byte.is_ascii_whitespace() {
            continue;
        }
        if byte == b'=' {
            padding += 1;
            continue;
        }
        if padding > 0 {
            return None; // data after padding
        }
        let value = match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        sextets.push(value);
    }
    if padding > 2 || (padding > 0 && (sextets.len() + padding) % 4 != 0) {
        return None;
    }
    if sextets.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(sextets.len() * 3 / 4);
    for chunk in sextets.chunks(4) {
        let mut acc: u32 = 0;
        for (i, sextet) in chunk.iter().enumerate() {
            acc |= u32::from(*sextet) << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        let take = chunk.len() * 6 / 8;
        // Leftover bits of a partial chunk must be zero (canonical encoding).
        let used_bits = take * 8;
        let mask = if used_bits >= 24 {
            0
        } else {
            (1u32 << (24 - used_bits)) - 1
        };
        if acc & mask != 0 {
            return None;
        }
        out.extend_from_slice(&bytes[1..1 + take]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET_B64: &str = "+Ey5AoJ6Ap4uANvxvCChvIFHJ1bWomw4w5bAhh8ElmQ=";

    fn key_file(name: &str, algorithm: &str, secret: &str) -> String {
        format!("key \"{name}\" {{\n\talgorithm {algorithm};\n\tsecret \"{secret}\";\n}};\n")
    }

    fn write(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("ring.key");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn reads_what_tsig_keygen_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), &key_file("ring-key", "hmac-sha256", SECRET_B64));
        let key = TsigKey::from_file(&path).unwrap();
        assert_eq!(key.name(), "ring-key");
        assert_eq!(key.expose_secret().len(), 32);
        assert_eq!(key.expose_secret()[..3], [0xf8, 0x4c, 0xb9]);
        assert_eq!(key.origin(), path);
        assert!(key.signer().is_ok());
    }

    #[test]
    fn comments_case_and_unquoted_words_are_accepted() {
        let text = format!(
            "# made by hand\n// for the ring\n/* a\n block */ KEY ring-key {{ Algorithm HMAC-SHA256; secret {SECRET_B64}; }};\n"
        );
        let key = TsigKey::parse(&text, Path::new("k")).unwrap();
        assert_eq!(key.name(), "ring-key");
        assert_eq!(key.expose_secret().len(), 32);
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let key = TsigKey::parse(
            &key_file("ring-key", "hmac-sha256", SECRET_B64),
            Path::new("/etc/ring.key"),
        )
        .unwrap();
        let shown = format!("{key:?}");
        assert!(!shown.contains(SECRET_B64), "{shown}");
        assert!(!shown.contains("+Ey5"), "{shown}");
        assert!(shown.contains("ring-key"), "{shown}");
        assert!(shown.contains("32 bytes from /etc/ring.key"), "{shown}");
    }

    #[test]
    fn missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.key");
        let err = TsigKey::from_file(&path).unwrap_err();
        assert_eq!(err, TsigKeyError::Missing { file: path.clone() });
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
    }

    #[test]
    fn too_large_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = key_file("ring-key", "hmac-sha256", SECRET_B64);
        text.push_str(&"#".repeat(MAX_SECRET_BYTES as usize));
        let path = write(dir.path(), &text);
        let err = TsigKey::from_file(&path).unwrap_err();
        assert!(matches!(err, TsigKeyError::TooLarge { .. }), "{err:?}");
        assert!(err.to_string().contains("ring.key"), "{err}");
    }

    #[test]
    fn not_a_key_file() {
        let dir = tempfile::tempdir().unwrap();
        for text in [
            "",
            "# only a comment\n",
            "hello world",
            "options { directory \"/tmp\"; };",
            "key \"ring-key\" { algorithm hmac-sha256; };",
            "key \"ring-key\" { secret \"c2VjcmV0\"; };",
            "key \"ring-key\" { algorithm hmac-sha256; secret \"c2VjcmV0\" };",
            "key \"ring-key\" { algorithm hmac-sha256; secret \"c2VjcmV0\"; }",
            "key \"ring-key\" { algorithm hmac-sha256; secret \"c2VjcmV0\"; secret \"eA==\"; };",
            "key \"ring-key\" { algorithm hmac-sha256; secret \"c2VjcmV0; };",
            "key \"ring-key\" { algorithm hmac-sha256; secret \"c2VjcmV0\"; owner x; };",
            "key \"bad name..\" { algorithm hmac-sha256; secret \"c2VjcmV0\"; };",
            "/* key \"ring-key\" { algorithm hmac-sha256; secret \"c2VjcmV0\"; };",
        ] {
            let path = write(dir.path(), text);
            let err = TsigKey::from_file(&path).unwrap_err();
            assert!(
                matches!(err, TsigKeyError::NotAKeyFile { .. }),
                "{text:?}: {err:?}"
            );
            let shown = err.to_string();
            assert!(shown.contains("ring.key"), "{shown}");
            assert!(
                !shown.contains("c2VjcmV0"),
                "{text:?} leaked the secret: {shown}"
            );
        }
        let path = write(dir.path(), "\u{fffe}\u{0}");
        std::fs::write(&path, [0xff, 0xfe, 0x00]).unwrap();
        assert!(matches!(
            TsigKey::from_file(&path).unwrap_err(),
            TsigKeyError::NotAKeyFile { .. }
        ));
    }

    #[test]
    fn a_secret_in_the_wrong_place_is_not_quoted() {
        // A broken file whose secret sits where a keyword should be.
        let text = format!("key \"ring-key\" {{ algorithm hmac-sha256; {SECRET_B64}; }};");
        let err = TsigKey::parse(&text, Path::new("ring.key")).unwrap_err();
        assert!(!err.to_string().contains("+Ey5"), "{err}");
        assert!(err.to_string().contains("line 1"), "{err}");
    }

    #[test]
    fn unknown_algorithm() {
        for algorithm in ["hmac-md5", "hmac-sha512", "hmac-sha256-128", "sha256"] {
            let err = TsigKey::parse(
                &key_file("ring-key", algorithm, SECRET_B64),
                Path::new("/k/ring.key"),
            )
            .unwrap_err();
            assert_eq!(
                err,
                TsigKeyError::UnknownAlgorithm {
                    file: "/k/ring.key".into(),
                    key: "ring-key".into(),
                    algorithm: algorithm.into(),
                }
            );
            let shown = err.to_string();
            assert!(shown.contains("\"ring-key\""), "{shown}");
            assert!(shown.contains("/k/ring.key"), "{shown}");
            assert!(!shown.contains("+Ey5"), "{shown}");
        }
    }

    #[test]
    fn bad_base64() {
        for secret in [
            "not base64!",
            "c2VjcmV0=x",
            "c2VjcmV0===",
            "a",
            "c2VjcmV1=",
            "ab=c",
        ] {
            let err = TsigKey::parse(
                &key_file("ring-key", "hmac-sha256", secret),
                Path::new("ring.key"),
            )
            .unwrap_err();
            assert_eq!(
                err,
                TsigKeyError::BadBase64 {
                    file: "ring.key".into(),
                    key: "ring-key".into()
                },
                "{secret:?}"
            );
            if secret.len() > 4 {
                assert!(!err.to_string().contains(secret), "{err}");
            }
        }
    }

    #[test]
    fn empty_secret() {
        for secret in ["", "  "] {
            let err = TsigKey::parse(
                &key_file("ring-key", "hmac-sha256", secret),
                Path::new("ring.key"),
            )
            .unwrap_err();
            assert_eq!(
                err,
                TsigKeyError::EmptySecret {
                    file: "ring.key".into(),
                    key: "ring-key".into()
                }
            );
        }
        assert!(matches!(
            TsigKey::new("ring-key", Vec::new(), "test"),
            Err(TsigKeyError::EmptySecret { .. })
        ));
    }

    #[test]
    fn more_than_one_key() {
        let text = format!(
            "{}{}",
            key_file("first", "hmac-sha256", SECRET_B64),
            key_file("second", "hmac-sha256", SECRET_B64)
        );
        let err = TsigKey::parse(&text, Path::new("ring.key")).unwrap_err();
        assert_eq!(
            err,
            TsigKeyError::MoreThanOneKey {
                file: "ring.key".into(),
                names: vec!["first".into(), "second".into()],
            }
        );
        assert_eq!(
            err.to_string(),
            "ring.key holds 2 TSIG keys (\"first\", \"second\"); put exactly one key in the file"
        );
    }

    #[test]
    fn base64_round_trips() {
        // Every length mod 3, with and without padding.
        assert_eq!(decode_base64("").unwrap(), b"");
        assert_eq!(decode_base64("Zg==").unwrap(), b"f");
        assert_eq!(decode_base64("Zg").unwrap(), b"f");
        assert_eq!(decode_base64("Zm8=").unwrap(), b"fo");
        assert_eq!(decode_base64("Zm9v").unwrap(), b"foo");
        assert_eq!(decode_base64("Zm9v YmFy\n").unwrap(), b"foobar");
        assert_eq!(decode_base64("/+8=").unwrap(), [0xff, 0xef]);
        assert!(decode_base64("Zh==").is_none(), "non-zero leftover bits");
        assert!(decode_base64("Z===").is_none());
        assert!(decode_base64("Zm9v-").is_none());
    }
}
