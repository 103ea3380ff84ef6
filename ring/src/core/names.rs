//! Syntax checks for everything an operator names: member and control-plane names, zones, DNS
//! names, addresses, backup locations and free text. Each check returns the reason a value is
//! wrong, in words an operator can act on; [`CommandError::invalid`] wraps it with the field.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::error::CommandError;
use super::limits::{MAX_ADDRESS_LEN, MAX_DNS_NAME_LEN, MAX_LABEL_LEN, MAX_TEXT_LEN, MAX_URL_LEN};

/// Checks a DNS-1123 label (Kubernetes object names): 1 to 63 characters of `a-z`, `0-9` and
/// `-`, starting and ending with a letter or digit.
pub fn check_label(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > MAX_LABEL_LEN {
        return Err(format!("must be at most {MAX_LABEL_LEN} characters"));
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
pub fn check_dns_name(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > MAX_DNS_NAME_LEN {
        return Err(format!("must be at most {MAX_DNS_NAME_LEN} characters"));
    }
    if value.ends_with('.') {
        return Err("must not end with '.' (write the name without the root dot)".into());
    }
    for label in value.split('.') {
        check_label(label).map_err(|why| format!("label {label:?} {why}"))?;
    }
    Ok(())
}

/// Checks a `host:port` address. The host is an IPv4 address, a bracketed IPv6 address
/// (`[::1]:7400`) or a DNS name; the port is 1 to 65535.
pub fn check_address(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > MAX_ADDRESS_LEN {
        return Err(format!("must be at most {MAX_ADDRESS_LEN} characters"));
    }
    let (host, port) = if let Some(rest) = value.strip_prefix('[') {
        let (v6, port) = rest
            .split_once("]:")
            .ok_or("must be [IPv6]:port when the host is an IPv6 address")?;
        v6.parse::<Ipv6Addr>()
            .map_err(|_| format!("{v6:?} is not an IPv6 address"))?;
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
        Ok(0) | Err(_) => return Err(format!("port {port:?} must be a number from 1 to 65535")),
        Ok(_) => {}
    }
    if let Some(host) = host {
        let looks_numeric = host.bytes().all(|b| b.is_ascii_digit() || b == b'.');
        if looks_numeric {
            host.parse::<Ipv4Addr>()
                .map_err(|_| format!("{host:?} is not an IPv4 address"))?;
        } else {
            check_dns_name(&host.to_ascii_lowercase())
                .map_err(|why| format!("host {host:?}: {why}"))?;
        }
    }
    Ok(())
}

/// Checks a backup location URL: `s3://bucket[/prefix]`, `gs://bucket[/prefix]`,
/// `az://container[/prefix]` or `file:///absolute/path`. Prefix segments must not be empty,
/// `.` or `..` (no path traversal), and no control characters or backslashes are accepted.
pub fn check_backup_url(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > MAX_URL_LEN {
        return Err(format!("must be at most {MAX_URL_LEN} characters"));
    }
    if value
        .chars()
        .any(|c| c.is_control() || c == '\\' || c.is_whitespace())
    {
        return Err("must not contain whitespace, control characters or backslashes".into());
    }
    if value.contains(['?', '#', '@']) {
        return Err(
            "must not contain '?', '#' or '@' (credentials and options belong in the config, not the URL)"
                .into(),
        );
    }
    let (scheme, rest) = value
        .split_once("://")
        .ok_or("must be a URL like s3://bucket/prefix or file:///path")?;
    let path = match scheme {
        "s3" | "gs" | "az" => {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            check_bucket(bucket).map_err(|why| format!("bucket {bucket:?} {why}"))?;
            prefix.trim_end_matches('/')
        }
        "file" => rest
            .strip_prefix('/')
            .ok_or("file:// URLs must name an absolute path, like file:///var/lib/backups")?
            .trim_end_matches('/'),
        other => {
            return Err(format!(
                "scheme {other:?} is not supported (use s3, gs, az or file)"
            ));
        }
    };
    if path.is_empty() {
        return Ok(());
    }
    for segment in path.split('/') {
        match segment {
            "" => return Err("must not contain empty path segments ('//')".into()),
            "." | ".." => return Err("must not contain '.' or '..' path segments".into()),
            _ => {}
        }
    }
    Ok(())
}

fn check_bucket(bucket: &str) -> Result<(), String> {
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

/// Checks free text such as a reason or an actor name: at most 512 bytes, no control characters.
pub fn check_text(value: &str) -> Result<(), String> {
    if value.len() > MAX_TEXT_LEN {
        return Err(format!("must be at most {MAX_TEXT_LEN} bytes"));
    }
    if value.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

/// Runs `check` on `value` and names `field` in the error.
pub fn require(
    field: &str,
    value: &str,
    check: fn(&str) -> Result<(), String>,
) -> Result<(), CommandError> {
    check(value).map_err(|why| CommandError::invalid(field, value, why))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            "file://relative/path",
            "file:///var/../etc",
            "s3://bucket/a\\b",
            "s3://bucket/a b",
            "s3://key:secret@bucket/x",
            "s3://bucket/x?secret=1",
        ] {
            assert!(check_backup_url(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn text() {
        assert_eq!(check_text("planned maintenance"), Ok(()));
        assert!(check_text("line\nbreak").is_err());
        assert!(check_text(&"x".repeat(513)).is_err());
    }
}
