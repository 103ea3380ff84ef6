//! `ring-chaos`: builds a ring of real `ringd` processes in network namespaces, one per zone,
//! breaks it the way zones break, and measures what clients see. See `chaos/README.md`.

mod model;
mod report;

// Not wired into a run yet: re-exported so the reports (and the model they use) count as used.
pub use report::{markdown_summary, summarize, write_reports};

fn main() {
    println!("ring-chaos: not wired yet");
}
