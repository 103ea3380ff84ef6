//! The RFC 2136 DNS UPDATE builder: validated record changes in, one atomic UPDATE message out.
//!
//! ```
//! use std::net::Ipv4Addr;
//! use garden_ring::dns::update::{Change, RecordValue, UpdateBuilder};
//!
//! let builder = UpdateBuilder::new("ring.example.com").unwrap();
//! let changes = [
//!     Change::new("cp-a.ring.example.com", 60, RecordValue::A(Ipv4Addr::new(10, 0, 1, 20))),
//!     Change::new("old.ring.example.com", 0, RecordValue::Delete),
//! ];
//! let bytes = builder.build(0x1234, &changes).unwrap();
//! assert!(bytes.len() < 512);
//!
//! // A name outside the zone never reaches the wire.
//! let evil = [Change::new("cp-a.evilring.example.com", 60, RecordValue::Delete)];
//! assert!(builder.build(1, &evil).is_err());
//! ```
//!
//! Every change replaces what the ring manages at its name: the A, AAAA and CNAME record sets
//! are deleted (RFC 2136 2.5.2, "delete an RRset": class ANY, TTL 0, no data), then the new
//! record is added (2.5.1, class IN). [`RecordValue::Delete`] only deletes. Other types at the
//! name (TXT, MX, ...) are left alone; a CNAME next to them is refused by the server.
//!
//! Checked before anything is built, each with its own [`UpdateError`]:
//! - the zone is a DNS name ([`check_dns_name`]);
//! - the batch has 1 to [`MAX_DNS_UPDATE_CHANGES`] changes, and no name twice (without case);
//! - every name lies inside the zone, compared label by label and without case
//!   ([`check_name_in_zone`]); the apex itself only with [`UpdateBuilder::allow_apex`], and
//!   never for a CNAME (the apex has SOA and NS records, which a CNAME cannot sit next to);
//! - the TTL is from [`MIN_TTL_S`](crate::core::limits::MIN_TTL_S) to
//!   [`MAX_TTL_S`](crate::core::limits::MAX_TTL_S) ([`check_ttl`]; not checked for a delete);
//! - an address is not unspecified (`0.0.0.0`, `::`), broadcast or multicast;
//! - a CNAME target is a DNS name and not the name itself;
//! - the encoded message is at most [`MAX_DNS_UPDATE_BYTES`].
//!
//! Names are written in lower case, as fully qualified names.

use std::collections::BTreeMap;
use std::net::IpAddr;

use hickory_proto::op::{Message, MessageType, OpCode, Query, UpdateMessage};
use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use crate::core::error::shorten;
use crate::core::limits::{MAX_DNS_NAME_LEN, MAX_DNS_UPDATE_BYTES, MAX_DNS_UPDATE_CHANGES};
use crate::core::names::{check_dns_name, check_name_in_zone, check_ttl};

/// The record types an update replaces at a name, in the order their sets are deleted.
pub const MANAGED_TYPES: [RecordType; 3] = [RecordType::A, RecordType::AAAA, RecordType::CNAME];

pub use crate::core::dns_records::RecordValue;

/// One change in a batch: the records at `name` become `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The owner name, inside the zone, without the trailing dot.
    pub name: String,
    /// TTL of the new record, in seconds (ignored for [`RecordValue::Delete`]).
    pub ttl_s: u32,
    /// The new record.
    pub value: RecordValue,
}

impl Change {
    /// A change of `name` to `value` with a TTL of `ttl_s` seconds.
    pub fn new(name: impl Into<String>, ttl_s: u32, value: RecordValue) -> Self {
        Self {
            name: name.into(),
            ttl_s,
            value,
        }
    }
}

/// Why no UPDATE message was built. `index` is the position of the offending change in the
/// batch; quoted input is cut to 80 bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpdateError {
    /// The zone is not a DNS name.
    #[error("invalid zone {zone:?}: {why}")]
    Zone {
        /// The zone as given.
        zone: String,
        /// What is wrong with it.
        why: String,
    },
    /// The batch is empty.
    #[error("an update needs at least one change")]
    Empty,
    /// The batch is larger than [`MAX_DNS_UPDATE_CHANGES`].
    #[error("{count} changes in one update; at most {max} are allowed")]
    TooManyChanges {
        /// Changes in the batch.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A name is not a DNS name, not inside the zone, or the apex where that is not allowed.
    #[error("change {index}: name {name:?} {why}")]
    Name {
        /// Position in the batch.
        index: usize,
        /// The name.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// Two changes name the same owner (compared without case).
    #[error("changes {first} and {second} both change {name:?}; one change per name")]
    DuplicateName {
        /// Position of the first.
        first: usize,
        /// Position of the second.
        second: usize,
        /// The name, in lower case.
        name: String,
    },
    /// The TTL is out of bounds.
    #[error("change {index} ({name}): {why}")]
    Ttl {
        /// Position in the batch.
        index: usize,
        /// The name.
        name: String,
        /// The TTL given.
        ttl_s: u32,
        /// What is wrong with it.
        why: String,
    },
    /// The address cannot be a service address.
    #[error("change {index} ({name}): address {address} {why}")]
    Address {
        /// Position in the batch.
        index: usize,
        /// The name.
        name: String,
        /// The address given.
        address: IpAddr,
        /// What is wrong with it.
        why: String,
    },
    /// The CNAME target is not a DNS name, or is the name itself.
    #[error("change {index} ({name}): CNAME target {target:?} {why}")]
    CnameTarget {
        /// Position in the batch.
        index: usize,
        /// The name.
        name: String,
        /// The target given.
        target: String,
        /// What is wrong with it.
        why: String,
    },
    /// The encoded message is larger than [`MAX_DNS_UPDATE_BYTES`]; split the batch.
    #[error("the update message is {bytes} bytes; at most {max} fit (split the batch)")]
    TooLarge {
        /// Encoded size, or a lower bound when encoding stopped at the DNS maximum.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// The DNS library refused to encode a message that passed every check: a bug here.
    #[error("cannot encode the update message: {0}")]
    Encode(String),
}

/// Builds UPDATE messages for one zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateBuilder {
    /// The zone apex, lower case, without the trailing dot.
    zone: String,
    /// The same, fully qualified, as hickory writes it.
    zone_name: Name,
    /// Whether changes may name the apex itself.
    allow_apex: bool,
}

impl UpdateBuilder {
    /// A builder for `zone` (its apex, like `ring.example.com`; upper case is accepted and
    /// written in lower case). Changes at the apex itself are refused unless
    /// [`allow_apex`](Self::allow_apex) is set.
    pub fn new(zone: &str) -> Result<Self, UpdateError> {
        let zone_error = |why: String| UpdateError::Zone {
            zone: shorten(zone),
            why,
        };
        if zone.len() > MAX_DNS_NAME_LEN {
            return Err(zone_error(format!(
                "must be at most {MAX_DNS_NAME_LEN} characters"
            )));
        }
        let lower = zone.to_ascii_lowercase();
        check_dns_name(&lower).map_err(|why| zone_error(why.into()))?;
        let zone_name = fqdn(&lower)?;
        Ok(Self {
            zone: lower,
            zone_name,
            allow_apex: false,
        })
    }

    /// Allows (or not) changes of the zone apex itself (not CNAMEs, which cannot live there).
    pub fn allow_apex(self, allow: bool) -> Self {
        Self {
            allow_apex: allow,
            ..self
        }
    }

    /// The zone apex, lower case.
    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// Checks a batch without building anything (see the [module docs](self)).
    pub fn validate(&self, changes: &[Change]) -> Result<(), UpdateError> {
        if changes.is_empty() {
            return Err(UpdateError::Empty);
        }
        if changes.len() > MAX_DNS_UPDATE_CHANGES {
            return Err(UpdateError::TooManyChanges {
                count: changes.len(),
                max: MAX_DNS_UPDATE_CHANGES,
            });
        }
        let mut seen = BTreeMap::new();
        for (index, change) in changes.iter().enumerate() {
            let name = self.check_change(index, change)?;
            if let Some(first) = seen.insert(name.clone(), index) {
                return Err(UpdateError::DuplicateName {
                    first,
                    second: index,
                    name,
                });
            }
        }
        Ok(())
    }

    /// The unsigned UPDATE message for `changes`, with message id `id`. A signer adds its TSIG
    /// record to it and then calls [`encode`].
    pub fn message(&self, id: u16, changes: &[Change]) -> Result<Message, UpdateError> {
        self.validate(changes)?;
        let mut message = Message::new(id, MessageType::Query, OpCode::Update);
        let mut zone = Query::query(self.zone_name.clone(), RecordType::SOA);
        zone.set_query_class(DNSClass::IN);
        message.add_zone(zone);
        for change in changes {
            let owner = fqdn(&change.name.to_ascii_lowercase())?;
            for record_type in MANAGED_TYPES {
                let mut delete = Record::update0(owner.clone(), 0, record_type);
                delete.dns_class = DNSClass::ANY;
                message.add_update(delete);
            }
            let data = match &change.value {
                RecordValue::A(address) => RData::A(A(*address)),
                RecordValue::Aaaa(address) => RData::AAAA(AAAA(*address)),
                RecordValue::Cname(target) => {
                    RData::CNAME(CNAME(fqdn(&target.to_ascii_lowercase())?))
                }
                RecordValue::Delete => continue,
            };
            message.add_update(Record::from_rdata(owner, change.ttl_s, data));
        }
        Ok(message)
    }

    /// The encoded, unsigned UPDATE message for `changes`, with message id `id`.
    pub fn build(&self, id: u16, changes: &[Change]) -> Result<Vec<u8>, UpdateError> {
        encode(&self.message(id, changes)?)
    }

    /// Checks one change; returns its name in lower case.
    fn check_change(&self, index: usize, change: &Change) -> Result<String, UpdateError> {
        let name_error = |why: String| UpdateError::Name {
            index,
            name: shorten(&change.name),
            why,
        };
        if change.name.len() > MAX_DNS_NAME_LEN {
            return Err(name_error(format!(
                "must be at most {MAX_DNS_NAME_LEN} characters"
            )));
        }
        let name = change.name.to_ascii_lowercase();
        let at_apex = name == self.zone;
        if !(at_apex && self.allow_apex) {
            check_name_in_zone(&name, &self.zone).map_err(|why| name_error(why.into()))?;
        }
        if change.value == RecordValue::Delete {
            return Ok(name);
        }
        check_ttl(change.ttl_s).map_err(|why| UpdateError::Ttl {
            index,
            name: name.clone(),
            ttl_s: change.ttl_s,
            why: why.into(),
        })?;
        let address_error = |address: IpAddr, why: &str| UpdateError::Address {
            index,
            name: name.clone(),
            address,
            why: why.into(),
        };
        match &change.value {
            RecordValue::A(address) => {
                let why = if address.is_unspecified() {
                    Some("is unspecified")
                } else if address.is_broadcast() {
                    Some("is the broadcast address")
                } else if address.is_multicast() {
                    Some("is a multicast address")
                } else {
                    None
                };
                if let Some(why) = why {
                    return Err(address_error(IpAddr::V4(*address), why));
                }
            }
            RecordValue::Aaaa(address) => {
                let why = if address.is_unspecified() {
                    Some("is unspecified")
                } else if address.is_multicast() {
                    Some("is a multicast address")
                } else {
                    None
                };
                if let Some(why) = why {
                    return Err(address_error(IpAddr::V6(*address), why));
                }
            }
            RecordValue::Cname(target) => {
                let target_error = |why: String| UpdateError::CnameTarget {
                    index,
                    name: name.clone(),
                    target: shorten(target),
                    why,
                };
                if at_apex {
                    return Err(target_error(
                        "cannot be set at the zone apex (a CNAME cannot sit next to SOA and NS)"
                            .into(),
                    ));
                }
                if target.len() > MAX_DNS_NAME_LEN {
                    return Err(target_error(format!(
                        "must be at most {MAX_DNS_NAME_LEN} characters"
                    )));
                }
                let target = target.to_ascii_lowercase();
                check_dns_name(&target).map_err(|why| target_error(why.into()))?;
                if target == name {
                    return Err(target_error("points at itself".into()));
                }
            }
            RecordValue::Delete => {}
        }
        Ok(name)
    }
}

/// Encodes a built (and possibly signed) UPDATE message, refusing one larger than
/// [`MAX_DNS_UPDATE_BYTES`].
pub fn encode(message: &Message) -> Result<Vec<u8>, UpdateError> {
    let bytes = message.to_vec().map_err(|e| match e {
        // hickory stops at the DNS maximum of 65 535 bytes.
        hickory_proto::ProtoError::MaxBufferSizeExceeded(max) => UpdateError::TooLarge {
            bytes: max,
            max: MAX_DNS_UPDATE_BYTES,
        },
        other => UpdateError::Encode(other.to_string()),
    })?;
    if bytes.len() > MAX_DNS_UPDATE_BYTES {
        return Err(UpdateError::TooLarge {
            bytes: bytes.len(),
            max: MAX_DNS_UPDATE_BYTES,
        });
    }
    Ok(bytes)
}

/// A checked, lower-case name without the trailing dot, as a fully qualified hickory name.
fn fqdn(name: &str) -> Result<Name, UpdateError> {
    Name::from_ascii(format!("{name}."))
        .map_err(|e| UpdateError::Encode(format!("name {:?}: {e}", shorten(name))))
}

#[cfg(test)]
mod tests;
