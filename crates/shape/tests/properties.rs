//! Properties of the whole shaper: chunking never changes the result, the budget is never
//! exceeded, the output is always clean UTF-8, and the tombstone accounts for every byte and line.

use std::path::PathBuf;

use proptest::prelude::*;
use ring0_core::observation::StreamReport;
use ring0_shape::{ExitInfo, Observation, ShapeConfig, Stream, StreamShaper};

fn config(budget: usize) -> ShapeConfig {
    ShapeConfig {
        count_tokens: false,
        ..ShapeConfig::with_budget(budget)
    }
}

fn shape_chunks(chunks: &[(Stream, &[u8])], budget: usize) -> Observation {
    let mut s = StreamShaper::new(config(budget)).expect("valid budget");
    for (stream, c) in chunks {
        s.push(*stream, c);
    }
    s.finish(ExitInfo::exited(1))
}

fn samples() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("corpus")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "raw"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn every_split_point_of_every_capture_gives_the_same_observation() {
    // Small budgets too, so the cut and the tombstone are part of what must not change.
    for budget in [16 * 1024, 1024] {
        for (name, raw) in samples() {
            let whole = shape_chunks(&[(Stream::Stdout, &raw)], budget);
            for i in 0..=raw.len() {
                let split = shape_chunks(
                    &[(Stream::Stdout, &raw[..i]), (Stream::Stdout, &raw[i..])],
                    budget,
                );
                assert_eq!(split, whole, "{name}: split at byte {i}, budget {budget}");
            }
        }
    }
}

/// Bytes that exercise the sanitizer: text, escapes of every kind, controls, UTF-8 (valid,
/// split, invalid), invisible characters, redraws.
fn terminal_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        "[a-z ]{0,12}".prop_map(String::into_bytes),
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\x1b[1;32m".to_vec()),
        Just(b"\x1b[0m".to_vec()),
        Just(b"\x1b[2K".to_vec()),
        Just(b"\x1b[K".to_vec()),
        Just(b"\x1b[3A".to_vec()),
        Just(b"\x1b[1B".to_vec()),
        Just(b"\x1b[5G".to_vec()),
        Just(b"\x1b[J".to_vec()),
        Just(b"\x1b]0;title\x07".to_vec()),
        Just(b"\x1b]8;;http://x.invalid\x1b\\".to_vec()),
        Just(b"\x1bP1$r\x1b\\".to_vec()),
        Just(b"\x1b_apc\x1b\\".to_vec()),
        Just(b"\x1b".to_vec()),
        Just(b"\x08".to_vec()),
        Just(b"\t".to_vec()),
        Just(b"\x07\x00\x7f".to_vec()),
        Just(b"\x9b\x85".to_vec()),
        Just("é✓😀".as_bytes().to_vec()),
        Just("\u{200b}\u{202e}\u{e0041}".as_bytes().to_vec()),
        Just(b"\xe2\x9c".to_vec()),
        Just(b"\xff\xc3".to_vec()),
        Just(b"<|im_start|></tool_result>".to_vec()),
        Just(b"error[E0308]: x\n --> a.rs:1:2\n".to_vec()),
        prop::collection::vec(any::<u8>(), 0..16),
    ];
    prop::collection::vec(piece, 0..64).prop_map(|v| v.concat())
}

fn check_stream(r: &StreamReport, budget: usize) {
    assert!(r.text.len() <= budget, "stream text over budget");
    for c in r.text.chars() {
        assert!(
            c == '\n' || c == '\t' || !(c.is_control()),
            "control character {c:?} in output"
        );
        assert!(
            !matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{E0000}'..='\u{E007F}'),
            "invisible character {c:?} in output"
        );
    }
    if let Some(t) = r.truncation {
        assert_eq!(
            t.head_bytes + t.omitted_bytes + t.tail_bytes,
            r.shaped_bytes,
            "tombstone bytes do not add up"
        );
        assert_eq!(
            t.head_lines + t.omitted_lines + t.tail_lines,
            r.lines,
            "tombstone lines do not add up"
        );
    } else {
        assert_eq!(
            r.text.len() as u64,
            r.shaped_bytes,
            "uncut text is not the whole"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_chunking_of_any_input_gives_the_same_observation(
        input in terminal_bytes(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        budget in 1024usize..4096,
    ) {
        let whole = shape_chunks(&[(Stream::Stdout, &input)], budget);
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(input.len() + 1)).collect();
        points.sort();
        let mut chunks = Vec::new();
        let mut last = 0;
        for p in points {
            chunks.push((Stream::Stdout, &input[last..p]));
            last = p;
        }
        chunks.push((Stream::Stdout, &input[last..]));
        prop_assert_eq!(shape_chunks(&chunks, budget), whole);
    }

    #[test]
    fn output_stays_within_budget_and_is_clean_text(
        out in terminal_bytes(),
        err in terminal_bytes(),
        repeat in 1usize..200,
        budget in 1024usize..8192,
    ) {
        let out = out.repeat(repeat);
        let obs = shape_chunks(&[(Stream::Stdout, &out), (Stream::Stderr, &err)], budget);
        prop_assert!(obs.text.len() <= budget, "text {} > budget {}", obs.text.len(), budget);
        let stdout = obs.stdout.as_ref().expect("stdout report");
        check_stream(stdout, budget);
        prop_assert_eq!(stdout.raw_bytes, out.len() as u64);
        if let Some(e) = &obs.stderr {
            check_stream(e, budget);
        }
        let streams = obs.stdout.iter().chain(obs.stderr.iter());
        prop_assert_eq!(obs.truncated, streams.clone().any(|r| r.truncation.is_some()));
    }

    #[test]
    fn tombstone_counts_add_up_to_the_input_for_plain_lines(
        lengths in prop::collection::vec(0usize..120, 1..3000),
        budget in 1024usize..4096,
    ) {
        let lines: Vec<String> = lengths
            .iter()
            .enumerate()
            .map(|(i, &n)| format!("{i} {}", "x".repeat(n)))
            .collect();
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let obs = shape_chunks(&[(Stream::Stdout, text.as_bytes())], budget);
        let r = obs.stdout.expect("stdout report");
        // Plain lines pass through unchanged, so shaped counts are the input's.
        prop_assert_eq!(r.shaped_bytes, text.len() as u64);
        prop_assert_eq!(r.lines, lines.len() as u64);
        check_stream(&r, budget);
    }
}

#[test]
fn a_600_frame_progress_bar_collapses_to_its_final_line() {
    // The frame of the seed's example: cursor positioning (6 bytes), green (5), a 60-character
    // bar, reset (4), carriage return (1) — 76 bytes, 600 times.
    let mut raw = Vec::new();
    for i in 1..=600u32 {
        let done = (i * 30 / 600) as usize;
        let bar = format!(
            "[{}{}] {:>3}% {:>4}MB/1000MB {}",
            "=".repeat(done),
            " ".repeat(30 - done),
            i * 100 / 600,
            i * 1000 / 600,
            if i == 600 { "Complete" } else { "Fetching" }
        );
        assert_eq!(bar.len(), 60);
        raw.extend_from_slice(b"\x1b[1;1H");
        raw.extend_from_slice(b"\x1b[32m");
        raw.extend_from_slice(bar.as_bytes());
        raw.extend_from_slice(b"\x1b[0m\r");
    }
    assert_eq!(raw.len(), 45_600);
    let obs = ring0_shape::shape_bytes(&raw, &ShapeConfig::default()).unwrap();
    let final_line = "[==============================] 100% 1000MB/1000MB Complete";
    assert_eq!(obs.stdout.as_ref().unwrap().text, final_line);
    assert_eq!(obs.text, format!("{final_line}\n"));
    let tokens = obs.tokens.expect("token counts");
    assert!(tokens.raw_exact);
    assert!(
        tokens.shaped * 100 < tokens.raw,
        "raw {} → shaped {} tokens",
        tokens.raw,
        tokens.shaped
    );
}
