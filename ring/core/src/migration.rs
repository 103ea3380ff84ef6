//! The migration of a control plane's data when it moves (DESIGN.md "migration"): what the ring
//! records about it, step by step, so that status shows it and a new leader carries on where
//! the old one stopped.
//!
//! A move from host S to host D at epoch e starts a [`Migration`]:
//!
//! | step | who moves it on | meaning |
//! | --- | --- | --- |
//! | `fencing` | the ring | S may still serve; D waits (S stops and takes a final snapshot, or its lease runs out) |
//! | `handover` | the ring, when nobody fences any more | D may take over |
//! | `copying` | D reports | markers written; snapshots copied from S's location to D's |
//! | `restoring` | D reports | the newest verifiable snapshot restored into a fresh data dir |
//! | `starting` | D reports | restored; the control plane starts at D |
//! | `done` | the ring, when D reports it serving | DNS switches (rule 3) |
//!
//! D reports through its lease renewals ([`MigrationReport`]); the leader commits a report
//! when its step changes or, for the bytes copied, at most every
//! [`REPORT_INTERVAL_MS`]. Drivers that move no data (`none`, `exec`) report nothing: their
//! migrations go from `handover` to `done`.

use serde::{Deserialize, Serialize};

use super::error::CommandError;
use super::names::check_text;

/// Shortest interval between two committed progress reports of one migration that only differ
/// in bytes copied, in ms.
pub const REPORT_INTERVAL_MS: u64 = 1_000;

/// Most bytes of a migration note ([`note_text`]).
pub const MAX_NOTE_BYTES: usize = 400;

/// `text` made fit for a [`MigrationReport`] note ([`super::names::fit_text`] at
/// [`MAX_NOTE_BYTES`]).
pub fn note_text(text: &str) -> String {
    super::names::fit_text(text, MAX_NOTE_BYTES)
}

/// Where a migration stands; steps only move forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MigrationStep {
    /// A former host may still serve.
    Fencing,
    /// Nobody else serves: the new host may take over.
    Handover,
    /// The new host copies the backups.
    Copying,
    /// The new host restores a snapshot.
    Restoring,
    /// Restored; the control plane starts.
    Starting,
    /// The new host serves it.
    Done,
}

impl MigrationStep {
    /// The name status shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fencing => "fencing",
            Self::Handover => "handover",
            Self::Copying => "copying",
            Self::Restoring => "restoring",
            Self::Starting => "starting",
            Self::Done => "done",
        }
    }

    /// Whether a host may report this step (the others are the ring's to set).
    pub fn reportable(self) -> bool {
        matches!(self, Self::Copying | Self::Restoring | Self::Starting)
    }
}

impl std::fmt::Display for MigrationStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One migration, as committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Migration {
    /// The epoch of the move.
    pub epoch: u64,
    /// The member that served it before (none when nobody ever did).
    pub from: Option<String>,
    /// The new host.
    pub to: String,
    /// The backup location at `from` (URL).
    pub source: String,
    /// The backup location at `to` (URL).
    pub destination: String,
    /// Where it stands.
    pub step: MigrationStep,
    /// When the move was committed, Unix ms.
    pub started_unix_ms: u64,
    /// When it last changed, Unix ms.
    pub updated_unix_ms: u64,
    /// Bytes copied so far.
    #[serde(default)]
    pub bytes_copied: u64,
    /// The snapshot restored at the new host.
    #[serde(default)]
    pub restored: Option<String>,
    /// The data-loss window: the age of the restored snapshot when it was restored, ms (zero
    /// for a final snapshot).
    #[serde(default)]
    pub data_loss_window_ms: Option<u64>,
    /// The host's last note (a fallback to an older snapshot, a retry), if any.
    #[serde(default)]
    pub note: String,
}

/// What a new host reports about the migration it performs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationReport {
    /// The step it is in: `copying`, `restoring` or `starting`.
    pub step: Option<MigrationStep>,
    /// Bytes copied so far.
    #[serde(default)]
    pub bytes_copied: u64,
    /// The snapshot restored, once restored.
    #[serde(default)]
    pub restored: Option<String>,
    /// The restored snapshot's age when restored, ms.
    #[serde(default)]
    pub data_loss_window_ms: Option<u64>,
    /// A note for status and history.
    #[serde(default)]
    pub note: String,
}

impl MigrationReport {
    /// Syntax checks.
    pub fn validate(&self) -> Result<(), CommandError> {
        match self.step {
            Some(step) if step.reportable() => {}
            Some(step) => {
                return Err(CommandError::invalid(
                    "migration step",
                    step.as_str(),
                    "a host reports copying, restoring or starting",
                ));
            }
            None => {
                return Err(CommandError::invalid(
                    "migration step",
                    "",
                    "a report names its step",
                ));
            }
        }
        if !self.note.is_empty() {
            check_text(&self.note)
                .map_err(|why| CommandError::invalid("migration note", &self.note, why))?;
        }
        if let Some(name) = &self.restored {
            check_text(name)
                .map_err(|why| CommandError::invalid("restored snapshot", name, why))?;
        }
        Ok(())
    }
}

impl Migration {
    /// A migration that begins at `at_ms`: nothing copied or restored yet.
    pub fn begin(
        epoch: u64,
        from: Option<String>,
        to: String,
        source: String,
        destination: String,
        step: MigrationStep,
        at_ms: u64,
    ) -> Self {
        Self {
            epoch,
            from,
            to,
            source,
            destination,
            step,
            started_unix_ms: at_ms,
            updated_unix_ms: at_ms,
            bytes_copied: 0,
            restored: None,
            data_loss_window_ms: None,
            note: String::new(),
        }
    }

    /// Applies `report` at `at_ms`; refuses a step that goes back. Returns what changed, for
    /// history.
    pub fn apply(&mut self, report: &MigrationReport, at_ms: u64) -> Result<String, CommandError> {
        let step = report.step.unwrap_or(self.step);
        if step < self.step || !step.reportable() || self.step == MigrationStep::Fencing {
            return Err(CommandError::MigrationStepOutOfOrder {
                step: self.step.to_string(),
                reported: step.to_string(),
            });
        }
        let mut detail = vec![format!("migration {step}")];
        if report.bytes_copied != self.bytes_copied {
            detail.push(format!("{} bytes copied", report.bytes_copied));
        }
        if report.restored.is_some() && report.restored != self.restored {
            detail.push(format!(
                "restored {}",
                report.restored.as_deref().unwrap_or_default()
            ));
        }
        if let Some(window) = report.data_loss_window_ms {
            detail.push(format!("data-loss window {window} ms"));
        }
        if !report.note.is_empty() {
            detail.push(report.note.clone());
        }
        self.step = step;
        self.bytes_copied = report.bytes_copied.max(self.bytes_copied);
        if report.restored.is_some() {
            self.restored = report.restored.clone();
        }
        if report.data_loss_window_ms.is_some() {
            self.data_loss_window_ms = report.data_loss_window_ms;
        }
        if !report.note.is_empty() {
            self.note = report.note.clone();
        }
        self.updated_unix_ms = at_ms;
        Ok(detail.join(", "))
    }

    /// Whether `report` says something the ring should commit at `now_ms`: a new step, a
    /// restored snapshot, a note, or bytes after [`REPORT_INTERVAL_MS`].
    pub fn worth_committing(&self, report: &MigrationReport, now_ms: u64) -> bool {
        let Some(step) = report.step else {
            return false;
        };
        if step < self.step || self.step == MigrationStep::Fencing {
            return false;
        }
        step != self.step
            || (report.restored.is_some() && report.restored != self.restored)
            || (report.data_loss_window_ms.is_some()
                && report.data_loss_window_ms != self.data_loss_window_ms)
            || (!report.note.is_empty() && report.note != self.note)
            || (report.bytes_copied > self.bytes_copied
                && now_ms.saturating_sub(self.updated_unix_ms) >= REPORT_INTERVAL_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn migration() -> Migration {
        Migration {
            epoch: 2,
            from: Some("a".into()),
            to: "b".into(),
            source: "s3://a/x".into(),
            destination: "s3://b/x".into(),
            step: MigrationStep::Handover,
            started_unix_ms: 1_000,
            updated_unix_ms: 1_000,
            bytes_copied: 0,
            restored: None,
            data_loss_window_ms: None,
            note: String::new(),
        }
    }

    fn report(step: MigrationStep, bytes: u64) -> MigrationReport {
        MigrationReport {
            step: Some(step),
            bytes_copied: bytes,
            ..MigrationReport::default()
        }
    }

    #[test]
    fn notes_are_cleaned_and_bounded() {
        assert_eq!(note_text(" a\nb\u{200b}c "), "a b c");
        let long = "é".repeat(MAX_NOTE_BYTES);
        let note = note_text(&long);
        assert!(note.len() <= MAX_NOTE_BYTES && note.ends_with("..."));
        let report = MigrationReport {
            step: Some(MigrationStep::Restoring),
            note: note_text(&format!("{long}\n\u{202e}")),
            ..MigrationReport::default()
        };
        report.validate().unwrap();
    }

    #[test]
    fn steps_only_move_forward() {
        let mut m = migration();
        m.apply(&report(MigrationStep::Copying, 10), 2_000).unwrap();
        m.apply(&report(MigrationStep::Restoring, 20), 3_000)
            .unwrap();
        let err = m
            .apply(&report(MigrationStep::Copying, 30), 4_000)
            .unwrap_err();
        assert!(err.to_string().contains("too late"), "{err}");
        assert_eq!(m.step, MigrationStep::Restoring);
        assert_eq!(m.bytes_copied, 20);
        let mut fencing = migration();
        fencing.step = MigrationStep::Fencing;
        assert!(
            fencing
                .apply(&report(MigrationStep::Copying, 1), 1)
                .is_err()
        );
    }

    #[test]
    fn bytes_alone_are_committed_at_most_every_interval() {
        let mut m = migration();
        m.apply(&report(MigrationStep::Copying, 10), 2_000).unwrap();
        assert!(!m.worth_committing(&report(MigrationStep::Copying, 20), 2_500));
        assert!(m.worth_committing(&report(MigrationStep::Copying, 20), 3_000));
        assert!(m.worth_committing(&report(MigrationStep::Restoring, 10), 2_001));
        assert!(!m.worth_committing(&report(MigrationStep::Copying, 10), 9_000));
    }

    #[test]
    fn hosts_report_only_their_steps() {
        for step in [
            MigrationStep::Fencing,
            MigrationStep::Handover,
            MigrationStep::Done,
        ] {
            assert!(report(step, 0).validate().is_err(), "{step}");
        }
        assert!(MigrationReport::default().validate().is_err());
        let mut bad = report(MigrationStep::Copying, 0);
        bad.note = "a\u{0}b".into();
        assert!(bad.validate().is_err());
        assert!(report(MigrationStep::Starting, 0).validate().is_ok());
    }
}
