//! Certificates the ring refuses although its CA signed them: revoked by an operator
//! (`ringctl certs revoke`), held in the replicated state, so every member refuses them once it
//! applied the revocation, and a restart, `ringd recover` or a snapshot restore keeps them.
//!
//! A certificate is named by its issuer (the issuer's distinguished name as the TLS layer
//! prints it) and its serial number (lower-case hex without leading zeros, as [`serial`]
//! normalizes it): the pair X.509 makes unique, and what a CRL lists. The list is bounded
//! ([`MAX_REVOKED`]); a certificate that expired needs no entry any more, so an operator
//! removes old ones with `ringctl certs unrevoke`.

use serde::{Deserialize, Serialize};

use crate::error::CommandError;
use crate::names::{check_text, require};

/// Most revoked certificates the ring holds.
pub const MAX_REVOKED: usize = 1_024;
/// Most hex digits of a serial number (RFC 5280: at most 20 octets).
pub const MAX_SERIAL_HEX: usize = 40;
/// Most bytes of an issuer's name.
pub const MAX_ISSUER_LEN: usize = 512;

/// A revoked certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// Its issuer's distinguished name.
    pub issuer: String,
    /// Its serial number ([`serial`]'s form).
    pub serial: String,
    /// Whom it speaks for (`member:b`, `admin:alice`), when the revoker knew; empty otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subject: String,
    /// Why, in the operator's words.
    pub reason: String,
    /// When it was revoked (Unix ms, the proposer's clock).
    pub at_ms: u64,
    /// Who revoked it.
    pub actor: String,
}

impl Revocation {
    /// Whether this names the certificate `serial` of `issuer`.
    pub fn names(&self, issuer: &str, serial: &str) -> bool {
        self.serial == serial && self.issuer == issuer
    }
}

/// A serial number written as an operator may (`0x` prefix, colons or spaces between bytes,
/// either case) in the form the ring keeps: lower-case hex without leading zeros (`0` for
/// zero).
pub fn serial(text: &str) -> Result<String, CommandError> {
    let trimmed = text.trim();
    let digits: String = trimmed
        .strip_prefix("0x")
        .or_else(|| trimmed.strip_prefix("0X"))
        .unwrap_or(trimmed)
        .chars()
        .filter(|c| !matches!(c, ':' | ' '))
        .collect();
    let invalid = |why: &str| CommandError::invalid("serial number", text, why.to_string());
    if digits.is_empty() {
        return Err(invalid("is empty"));
    }
    if !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(invalid(
            "must be hexadecimal (as `openssl x509 -serial` or `ringctl certs check` print it)",
        ));
    }
    let significant = digits.trim_start_matches('0').to_ascii_lowercase();
    if significant.len() > MAX_SERIAL_HEX {
        return Err(invalid(&format!(
            "has more than {MAX_SERIAL_HEX} hex digits (20 octets, RFC 5280's limit)"
        )));
    }
    Ok(if significant.is_empty() {
        "0".into()
    } else {
        significant
    })
}

/// The hex of a serial number's big-endian bytes, in [`serial`]'s form.
pub fn serial_of_bytes(bytes: &[u8]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let significant = hex.trim_start_matches('0');
    if significant.is_empty() {
        "0".into()
    } else {
        significant.into()
    }
}

/// Checks a revocation's issuer, serial (already in [`serial`]'s form), subject and reason.
pub fn validate(
    issuer: &str,
    serial_hex: &str,
    subject: &str,
    reason: &str,
) -> Result<(), CommandError> {
    if issuer.trim().is_empty() || issuer.len() > MAX_ISSUER_LEN {
        return Err(CommandError::invalid(
            "issuer",
            issuer,
            format!("must be 1 to {MAX_ISSUER_LEN} bytes"),
        ));
    }
    require("issuer", issuer, check_text)?;
    if serial(serial_hex)? != serial_hex {
        return Err(CommandError::invalid(
            "serial number",
            serial_hex,
            "must be lower-case hex without leading zeros",
        ));
    }
    require("subject", subject, check_text)?;
    require("reason", reason, check_text)?;
    if reason.trim().is_empty() {
        return Err(CommandError::invalid(
            "reason",
            reason,
            "must say why (it is shown to whoever presents the certificate)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serials_are_read_as_operators_write_them() {
        for (text, want) in [
            ("1A2B", "1a2b"),
            ("0x001a2b", "1a2b"),
            ("00:1A:2B", "1a2b"),
            (" 1a 2b ", "1a2b"),
            ("0", "0"),
            ("0000", "0"),
        ] {
            assert_eq!(serial(text).unwrap(), want, "{text}");
        }
        for bad in ["", "0x", "12g4", "-1", "1a2b\n3"] {
            let err = serial(bad).unwrap_err();
            assert!(matches!(err, CommandError::Invalid { .. }), "{bad}: {err}");
        }
        // 20 octets pass, 21 do not (leading zeros do not count).
        assert!(serial(&"ab".repeat(20)).is_ok());
        assert!(serial(&format!("0000{}", "ab".repeat(20))).is_ok());
        assert!(serial(&"ab".repeat(21)).is_err());
        assert_eq!(serial_of_bytes(&[0, 0x1a, 0x2b]), "1a2b");
        assert_eq!(serial_of_bytes(&[0]), "0");
    }

    #[test]
    fn a_revocation_needs_an_issuer_a_normal_serial_and_a_reason() {
        assert!(validate("CN=garden-ring CA", "1a2b", "member:b", "key leaked").is_ok());
        for (issuer, serial, reason) in [
            ("", "1a", "why"),
            ("CN=x", "01a", "why"),
            ("CN=x", "1A", "why"),
            ("CN=x", "1a", " "),
            ("CN=x", "1a", "bad\u{202e}"),
            ("CN=\u{0}", "1a", "why"),
        ] {
            assert!(
                validate(issuer, serial, "", reason).is_err(),
                "{issuer:?} {serial:?} {reason:?}"
            );
        }
    }
}
