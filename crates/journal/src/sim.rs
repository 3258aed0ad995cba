//! placeholder
pub struct SimReport;
pub fn run_simulation(_seeds: u64) -> SimReport {
    SimReport
}
