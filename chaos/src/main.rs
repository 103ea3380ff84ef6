//! `ring-chaos`: builds a ring of real `ringd` processes in network namespaces, one per zone,
//! breaks it the way zones break, and measures what clients see. See `chaos/README.md`.

mod model;
mod report;

fn main() {
    println!("ring-chaos: not wired yet");
}
