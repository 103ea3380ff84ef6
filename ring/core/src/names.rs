//! Syntax checks for everything an operator names: member and control-plane names, zones, DNS
//! names (and whether one lies inside a zone), addresses, backup locations and prefixes, TTLs
//! and free text. Each check returns the reason a value is
//! wrong ([`Invalid`]), in words an operator can act on; [`CommandError::invalid`] wraps it
//! with the field.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::error::CommandError;
/// Why a value fails its syntax check, in words an operator can act on. Always final: the
/// same value is refused again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

impl From<&str> for Invalid {
    fn from(why: &str) -> Self {
        Self(why.to_string())
    }
}

impl From<String> for Invalid {
    fn from(why: String) -> Self {
        Self(why)
    }
}

impl From<Invalid> for String {
    fn from(invalid: Invalid) -> Self {
        invalid.0
    }
}

/// An [`Invalid`] with a formatted reason.
macro_rules! invalid {
    ($($reason:tt)*) => {
        $crate::names::Invalid(format!($($reason)*))
    };
}
pub(crate) use invalid;

use super::limits::{
    MAX_ADDRESS_LEN, MAX_DNS_NAME_LEN, MAX_LABEL_LEN, MAX_TEXT_LEN, MAX_TTL_S, MAX_URL_LEN,
    MIN_TTL_S,
};

/// Checks a DNS-1123 label (Kubernetes object names): 1 to 63 characters of `a-z`, `0-9` and
/// `-`, starting and ending with a letter or digit.
pub fn check_label(value: &str) -> Result<(), Invalid> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > MAX_LABEL_LEN {
        return Err(invalid!("must be at most {MAX_LABEL_LEN} characters"));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err("must consist of lower-case letters, digits and '-' (DNS-1123 label)".into());
    }
    if value.starts_with('-') || value.ends_with('-') {
        return Err("must start and end with a letter or digit (DNS-1123 label)".into());
    }
    Ok(())
}

/// Checks a DNS name made of DNS-1123 labels separated by dots, at most 253 characters. A single
/// trailing dot is not accepted: names are stored in one canonical form.
pub fn check_dns_name(value: &str) -> Result<(), Invalid> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > MAX_DNS_NAME_LEN {
        return Err(invalid!("must be at most {MAX_DNS_NAME_LEN} characters"));
    }
    if value.ends_with('.') {
        return Err("must not end with '.' (write the name without the root dot)".into());
    }
    for label in value.split('.') {
        check_label(label).map_err(|why| invalid!("label {label:?} {why}"))?;
    }
    Ok(())
}

/// Checks a `host:port` address. The host is an IPv4 address, a bracketed IPv6 address
/// (`[::1]:7400`) or a DNS name; the port is 1 to 65535.
pub fn check_address(value: &str) -> Result<(), Invalid> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > MAX_ADDRESS_LEN {
        return Err(invalid!("must be at most {MAX_ADDRESS_LEN} characters"));
    }
    let (host, port) = if let Some(rest) = value.strip_prefix('[') {
        let (v6, port) = rest
            .split_once("]:")
            .ok_or("must be [IPv6]:port when the host is an IPv6 address")?;
        v6.parse::<Ipv6Addr>()
            .map_err(|_| invalid!("{v6:?} is not an IPv6 address"))?;
        (None, port)
    } else {
        let (host, port) = value
            .rsplit_once(':')
            .ok_or("must be host:port (for example 10.0.0.1:7400)")?;
        if host.contains(':') {
            return Err("IPv6 addresses must be written in brackets, like [::1]:7400".into());
        }
        (Some(host), port)
    };
    match port.parse::<u16>() {
        Ok(0) | Err(_) => return Err(invalid!("port {port:?} must be a number from 1 to 65535")),
        Ok(_) => {}
    }
    if let Some(host) = host {
        let looks_numeric = host.bytes().all(|b| b.is_ascii_digit() || b == b'.');
        if looks_numeric {
            host.parse::<Ipv4Addr>()
                .map_err(|_| invalid!("{host:?} is not an IPv4 address"))?;
        } else {
            check_dns_name(&host.to_ascii_lowercase())
                .map_err(|why| invalid!("host {host:?}: {why}"))?;
        }
    }
    Ok(())
}

/// Checks a backup location URL: `s3://bucket[/prefix]`, `gs://bucket[/prefix]`,
/// `az://container[/prefix]` or `file:///absolute/path`. The URL must be printable ASCII
/// without whitespace, backslashes, `?`, `#`, `@` or `%` (percent-encoding could hide a `..`);
/// the prefix must pass [`check_backup_prefix`] (no path traversal). One trailing `/` is allowed.
pub fn check_backup_url(value: &str) -> Result<(), Invalid> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > MAX_URL_LEN {
        return Err(invalid!("must be at most {MAX_URL_LEN} characters"));
    }
    if !value.bytes().all(|b| b.is_ascii_graphic()) || value.contains('\\') {
        return Err(
            "must be printable ASCII without whitespace, control characters or backslashes".into(),
        );
    }
    if value.contains(['?', '#', '@']) {
        return Err(
            "must not contain '?', '#' or '@' (credentials and options belong in the config, not the URL)"
                .into(),
        );
    }
    if value.contains('%') {
        return Err("must not contain '%' (no percent-encoding: it could hide a '..')".into());
    }
    let (scheme, rest) = value
        .split_once("://")
        .ok_or("must be a URL like s3://bucket/prefix or file:///path")?;
    let path = match scheme {
        "s3" | "gs" | "az" => {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            check_bucket(bucket).map_err(|why| invalid!("bucket {bucket:?} {why}"))?;
            prefix
        }
        "file" => rest
            .strip_prefix('/')
            .ok_or("file:// URLs must name an absolute path, like file:///var/lib/backups")?,
        other => {
            return Err(invalid!(
                "scheme {other:?} is not supported (use s3, gs, az or file)"
            ));
        }
    };
    // One trailing '/' is allowed ("s3://bucket/prefix/"); "s3://bucket//" is an empty segment.
    let prefix = match path.strip_suffix('/') {
        Some(trimmed) if !trimmed.is_empty() => trimmed,
        _ => path,
    };
    check_backup_prefix(prefix)
}

/// Checks an object-store prefix: the part of a backup location after the bucket, under which
/// etcd-backup-restore writes `v2/<snapshot>`. It may be empty; otherwise it is `/`-separated
/// segments of printable ASCII, none of them empty, `.` or `..` (no path traversal, no absolute
/// path), without backslashes, `?`, `#`, `@` or `%`, at most 1 024 characters in all.
pub fn check_backup_prefix(value: &str) -> Result<(), Invalid> {
    if value.len() > MAX_URL_LEN {
        return Err(invalid!("must be at most {MAX_URL_LEN} characters"));
    }
    if let Some(bad) = value
        .chars()
        .find(|&c| !c.is_ascii_graphic() || matches!(c, '\\' | '?' | '#' | '@' | '%'))
    {
        return Err(invalid!(
            "must be printable ASCII without {bad:?} (no whitespace, control characters, '\\', '?', '#', '@' or '%')"
        ));
    }
    if value.is_empty() {
        return Ok(());
    }
    for segment in value.split('/') {
        match segment {
            "" => {
                return Err(
                    "must not start or end with '/' or contain empty path segments ('//')".into(),
                );
            }
            "." | ".." => return Err("must not contain '.' or '..' path segments".into()),
            _ => {}
        }
    }
    Ok(())
}

fn check_bucket(bucket: &str) -> Result<(), Invalid> {
    if bucket.len() < 3 || bucket.len() > 63 {
        return Err("must be 3 to 63 characters".into());
    }
    if !bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return Err("must consist of lower-case letters, digits, '-' and '.'".into());
    }
    if bucket.contains("..") || !bucket.as_bytes()[0].is_ascii_alphanumeric() {
        return Err("must start with a letter or digit and not contain '..'".into());
    }
    Ok(())
}

/// Checks free text such as a reason or an actor name: at most 512 bytes, no control
/// characters, and none of the invisible characters that change how the text around them is
/// shown (see [`is_invisible_format`]): history is read in terminals, where a right-to-left
/// override can make `ringd/a` appear as someone else.
pub fn check_text(value: &str) -> Result<(), Invalid> {
    if value.len() > MAX_TEXT_LEN {
        return Err(invalid!("must be at most {MAX_TEXT_LEN} bytes"));
    }
    if value.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    if let Some(c) = value.chars().find(|&c| is_invisible_format(c)) {
        return Err(invalid!(
            "must not contain invisible formatting characters such as U+{:04X} (bidirectional controls, zero-width characters)",
            u32::from(c)
        ));
    }
    Ok(())
}

/// `text` made to pass [`check_text`] within `max_bytes` (at least 3): control and invisible
/// formatting characters become spaces (an error message may hold line breaks), then it is
/// trimmed and cut on a character boundary with `...` when longer. For words a host or a driver
/// puts into a command (a migration note, a control plane's problem).
pub fn fit_text(text: &str, max_bytes: usize) -> String {
    let clean: String = text
        .chars()
        .map(|c| {
            if c.is_control() || is_invisible_format(c) {
                ' '
            } else {
                c
            }
        })
        .collect();
    let clean = clean.trim();
    if clean.len() <= max_bytes {
        return clean.to_string();
    }
    let end = clean.floor_char_boundary(max_bytes.saturating_sub(3));
    format!("{}...", &clean[..end])
}

/// Invisible formatting characters: the Unicode bidirectional embeddings, overrides, isolates
/// and marks (the "Trojan Source" characters), zero-width characters, invisible operators and
/// the byte-order mark.
pub fn is_invisible_format(c: char) -> bool {
    matches!(
        c,
        '\u{061c}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{feff}'
    )
}

/// Checks a DNS TTL in seconds: from [`MIN_TTL_S`] (1) to [`MAX_TTL_S`] (one day).
pub fn check_ttl(ttl_s: u32) -> Result<(), Invalid> {
    if !(MIN_TTL_S..=MAX_TTL_S).contains(&ttl_s) {
        return Err(invalid!(
            "TTL {ttl_s} s must be from {MIN_TTL_S} to {MAX_TTL_S} seconds"
        ));
    }
    Ok(())
}

/// Checks that `name` lies strictly below `zone`: both must be DNS names (see
/// [`check_dns_name`]; upper-case letters are accepted and compared without case, as DNS does),
/// and the name's last labels must be the zone's labels. Labels are compared whole, so
/// `evilexample.com` is not inside `example.com`, and the apex (`example.com` itself) is not
/// below it either.
pub fn check_name_in_zone(name: &str, zone: &str) -> Result<(), Invalid> {
    if name.len() > MAX_DNS_NAME_LEN || zone.len() > MAX_DNS_NAME_LEN {
        return Err(invalid!(
            "name and zone must be at most {MAX_DNS_NAME_LEN} characters"
        ));
    }
    let zone = zone.to_ascii_lowercase();
    check_dns_name(&zone).map_err(|why| invalid!("zone {zone:?}: {why}"))?;
    let name = name.to_ascii_lowercase();
    check_dns_name(&name)?;
    if name == zone {
        return Err(invalid!(
            "is the apex of zone {zone}; only names below the apex are accepted"
        ));
    }
    // Both are valid DNS names, so their labels contain no dots: a match of "." + zone at the
    // end is a match of whole labels.
    match name.strip_suffix(&zone) {
        Some(rest) if rest.ends_with('.') => Ok(()),
        _ => Err(invalid!("is not inside zone {zone}")),
    }
}

/// Runs `check` on `value` and names `field` in the error.
pub fn require(
    field: &str,
    value: &str,
    check: fn(&str) -> Result<(), Invalid>,
) -> Result<(), CommandError> {
    check(value).map_err(|why| CommandError::invalid(field, value, why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_words_are_made_to_pass_the_text_check() {
        // A multi-line error (etcd's, a restore's) would be refused by check_text: made one
        // line instead of being lost.
        let fitted = fit_text("etcd exited:\npanic: no space\u{202e}", 512);
        assert_eq!(fitted, "etcd exited: panic: no space");
        assert!(check_text(&fitted).is_ok());
        // Cut on a character boundary, within the bound, marked.
        let long = "é".repeat(300); // 600 bytes
        let cut = fit_text(&long, 511);
        assert!(cut.len() <= 511 && cut.ends_with("..."), "{}", cut.len());
        assert!(check_text(&cut).is_ok());
        assert_eq!(fit_text("ok", 511), "ok");
    }

    #[test]
    fn labels() {
        for ok in ["a", "zone-a", "a1", "0", &"x".repeat(63)] {
            assert_eq!(check_label(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "A",
            "-a",
            "a-",
            "a_b",
            "a.b",
            "ä",
            &"x".repeat(64),
            "a b",
        ] {
            assert!(check_label(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn dns_names() {
        for ok in ["cp-a.ring.example.com", "a", "x.y"] {
            assert_eq!(check_dns_name(ok), Ok(()), "{ok}");
        }
        let long = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(63),
        ]
        .join(".");
        for bad in ["", "a..b", ".a", "a.", "A.b", "a_b.c", &long] {
            assert!(check_dns_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn addresses() {
        for ok in [
            "127.0.0.1:7400",
            "[::1]:1",
            "ringd-a.garden.svc:7400",
            "localhost:65535",
        ] {
            assert_eq!(check_address(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "127.0.0.1",
            "127.0.0.1:0",
            "127.0.0.1:65536",
            "127.0.0.1:x",
            "300.0.0.1:80",
            "::1:80",
            "[::g]:80",
            "bad_host:80",
            ":80",
        ] {
            assert!(check_address(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn backup_urls() {
        for ok in [
            "s3://bucket/prefix",
            "s3://my.bucket-1",
            "gs://bucket/a/b/",
            "az://container/x",
            "file:///var/lib/backups",
            "s3://bucket/",
            "s3://bucket/a/",
            "file:///",
        ] {
            assert_eq!(check_backup_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "bucket/prefix",
            "http://bucket/x",
            "s3://b/x",
            "s3://bucket/../other",
            "s3://bucket/a/./b",
            "s3://bucket/a//b",
            "s3://bucket/a//",
            "file://relative/path",
            "file:///var/../etc",
            "s3://bucket/a\\b",
            "s3://bucket/a b",
            "s3://key:secret@bucket/x",
            "s3://bucket/x?secret=1",
            "s3://bucket/%2e%2e/other",
            "file:///var/%2E%2E/etc",
            "s3://bucket/caf\u{e9}",
            "s3://bucket/a\u{202e}b",
            "s3://bucket/a\tb",
            "s3://bucket//",
            "file:////etc",
        ] {
            assert!(check_backup_url(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn backup_prefixes() {
        for ok in [
            "",
            "etcd-main",
            "shoot--garden--ring-a--5f3c/etcd-main",
            "a/b.c/d_e/v2",
            "..a/b..",
        ] {
            assert_eq!(check_backup_prefix(ok), Ok(()), "{ok}");
        }
        for bad in [
            "/abs",
            "trailing/",
            "a//b",
            "..",
            "a/../b",
            "./a",
            "a/.",
            "a\\..\\b",
            "a b",
            "a\nb",
            "%2e%2e",
            "user@host",
            "caf\u{e9}",
            &"x".repeat(MAX_URL_LEN + 1),
        ] {
            assert!(check_backup_prefix(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn ttls() {
        for ok in [MIN_TTL_S, 60, 300, MAX_TTL_S] {
            assert_eq!(check_ttl(ok), Ok(()), "{ok}");
        }
        for bad in [0, MAX_TTL_S + 1, u32::MAX] {
            assert!(check_ttl(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn names_in_zones() {
        for (name, zone) in [
            ("cp-a.example.com", "example.com"),
            ("a.b.c.example.com", "example.com"),
            ("CP-A.Example.COM", "example.com"),
            ("cp-a.example.com", "EXAMPLE.com"),
            ("x.com", "com"),
        ] {
            assert_eq!(check_name_in_zone(name, zone), Ok(()), "{name} in {zone}");
        }
        for (name, zone) in [
            // A suffix is not a label: evilexample.com is another zone.
            ("evilexample.com", "example.com"),
            ("cp.evilexample.com", "example.com"),
            // The apex, in any case.
            ("example.com", "example.com"),
            ("Example.Com", "example.com"),
            // Outside, or above.
            ("cp.example.org", "example.com"),
            ("com", "example.com"),
            ("example.com.evil.org", "example.com"),
            // Not names at all.
            ("cp..example.com", "example.com"),
            ("cp.example.com.", "example.com"),
            ("*.example.com", "example.com"),
            ("cp_a.example.com", "example.com"),
            ("", "example.com"),
            ("cp.example.com", ""),
            ("cp.example.com", "example..com"),
        ] {
            assert!(
                check_name_in_zone(name, zone).is_err(),
                "{name:?} accepted in {zone:?}"
            );
        }
    }

    #[test]
    fn text() {
        assert_eq!(check_text("planned maintenance"), Ok(()));
        assert_eq!(
            check_text("ringctl:jane@laptop, \u{e9}t\u{e9} 2026"),
            Ok(())
        );
        assert!(check_text("line\nbreak").is_err());
        // Found by the command_validation fuzz target: a right-to-left override was accepted.
        for invisible in [
            "\u{202e}evil",
            "a\u{200b}b",
            "\u{2066}x\u{2069}",
            "\u{feff}x",
        ] {
            assert!(check_text(invisible).is_err(), "{invisible:?} accepted");
        }
        assert!(check_text(&"x".repeat(513)).is_err());
    }
}
