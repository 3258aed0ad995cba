//! The journal's deterministic simulation as a stand-alone command (the same report as
//! `ring0 journal sim`): `cargo run --release -p ring0-journal --example sim -- 100000`.
//! Exits non-zero when any property was violated.

fn main() {
    let seeds = match std::env::args().nth(1).map(|s| s.parse::<u64>()) {
        None => 2_000,
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            eprintln!("usage: sim [SEEDS]: {e}");
            std::process::exit(2);
        }
    };
    let report = ring0_journal::run_simulation(seeds);
    print!("{report}");
    if report.violations > 0 {
        std::process::exit(1);
    }
}
