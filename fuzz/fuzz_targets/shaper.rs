//! Fuzzes the streaming shaper: any bytes, split into chunks on both streams at points the input
//! chooses, must shape without panicking, within the budget, and exactly as the unsplit input.
//!
//! Run for a bounded time (memory is bounded by libFuzzer's limit):
//! `cargo +nightly fuzz run shaper -- -max_total_time=300 -rss_limit_mb=512`

#![no_main]

use libfuzzer_sys::fuzz_target;
use ring0_shape::{ExitInfo, Observation, ShapeConfig, Stream, StreamShaper};

/// Budgets tried: the minimum, so cuts and tombstones happen, and a larger one.
const BUDGETS: [usize; 2] = [1024, 6000];

fn shape(budget: usize, pieces: &[(Stream, &[u8])]) -> Observation {
    let config = ShapeConfig {
        count_tokens: false,
        ..ShapeConfig::with_budget(budget)
    };
    let mut shaper = StreamShaper::new(config).expect("valid budget");
    for (stream, bytes) in pieces {
        shaper.push(*stream, bytes);
    }
    shaper.finish(ExitInfo::exited(0))
}

fuzz_target!(|data: &[u8]| {
    // The first byte chooses the budget and the chunk size; the rest is the output, its bytes
    // alternately assigned to stdout and stderr in runs of that size.
    let Some((&control, body)) = data.split_first() else {
        return;
    };
    let budget = BUDGETS[usize::from(control & 1)];
    let chunk = usize::from(control >> 1) + 1;
    let mut out = Vec::new();
    let mut err = Vec::new();
    let mut pieces = Vec::new();
    for (i, piece) in body.chunks(chunk).enumerate() {
        let stream = if i % 3 == 2 { Stream::Stderr } else { Stream::Stdout };
        match stream {
            Stream::Stdout => out.extend_from_slice(piece),
            Stream::Stderr => err.extend_from_slice(piece),
        }
        pieces.push((stream, piece));
    }
    let split = shape(budget, &pieces);
    let whole = shape(budget, &[(Stream::Stdout, &out), (Stream::Stderr, &err)]);
    assert_eq!(split, whole, "chunking changed the observation");
    assert!(split.text.len() <= budget, "text over budget");
    for report in split.stdout.iter().chain(split.stderr.iter()) {
        assert!(!report.text.contains('\u{1b}'), "an escape survived");
        if let Some(t) = report.truncation {
            assert_eq!(t.head_bytes + t.omitted_bytes + t.tail_bytes, report.shaped_bytes);
            assert_eq!(t.head_lines + t.omitted_lines + t.tail_lines, report.lines);
        }
    }
});
