//! Throughput of the whole shaper against `strip-ansi-escapes` and `anstream`'s byte stripper,
//! measured on the same input in the same run, plus peak memory on a long stream and the token
//! reduction on the capture corpus.
//!
//! `cargo bench -p ring0-shape` (release profile). Inputs, all fed in 64 KiB chunks to each
//! contender:
//! - (a) plain text: log-like lines of varied length, 256 MiB;
//! - (b) heavy escape/progress output: cargo- and pip-style progress frames with colours and
//!   `\r`/`CSI K` redraws, interleaved with coloured lines, 256 MiB;
//! - (c) 1 GB of short lines, generated chunk by chunk and never held whole
//!   (`RING0_SHAPE_BENCH_C_BYTES` overrides the size).
//!
//! The baselines only strip escapes; the shaper also collapses redraws, neutralizes framing,
//! extracts diagnostics, keeps head and tail within the budget and counts tokens. Each figure is
//! the best of `RING0_SHAPE_BENCH_RUNS` (default 3) runs. `RING0_SHAPE_BENCH_PROFILE=a|b|c` only
//! runs the shaper on that input, for a profiler.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ring0_shape::{ExitInfo, ShapeConfig, Stream, StreamShaper};

const CHUNK: usize = 64 * 1024;
const MIB: usize = 1024 * 1024;

fn main() {
    let runs: usize = env_or("RING0_SHAPE_BENCH_RUNS", 3);
    let c_bytes: usize = env_or("RING0_SHAPE_BENCH_C_BYTES", 1_000_000_000);
    if let Ok(which) = std::env::var("RING0_SHAPE_BENCH_PROFILE") {
        let input = match which.as_str() {
            "a" => plain_text(256 * MIB),
            "b" => progress_output(256 * MIB),
            _ => short_line_chunks().concat().repeat(64),
        };
        let (t, _) = time_best(runs, || shape_all(&input));
        println!(
            "{which}: {:.2} GB/s",
            input.len() as f64 / 1e9 / t.as_secs_f64()
        );
        return;
    }
    println!(
        "ring0-shape benchmark: best of {runs} runs, 64 KiB chunks, GB = 10^9 bytes, {} time\n",
        if cpu_time().is_some() {
            "on-CPU"
        } else {
            "wall"
        }
    );

    // (c) first, so the process's peak memory reflects the long stream and not the other inputs.
    let hwm_start = vm_hwm_kib();
    let chunks_c = short_line_chunks();
    let (c_time, c_peak_buffers) = time_best(runs, || {
        let mut shaper = StreamShaper::new(ShapeConfig::default()).expect("default config");
        let mut peak = 0;
        let mut fed = 0;
        let mut i = 0;
        while fed < c_bytes {
            let chunk = &chunks_c[i % chunks_c.len()];
            let take = chunk.len().min(c_bytes - fed);
            shaper.push(Stream::Stdout, &chunk[..take]);
            fed += take;
            i += 1;
            if i % 1024 == 0 {
                peak = peak.max(shaper.buffered_bytes());
            }
        }
        peak = peak.max(shaper.buffered_bytes());
        black_box(shaper.finish(ExitInfo::exited(0)));
        peak
    });
    let hwm_after_c = vm_hwm_kib();
    let c_strip = time_best(runs, || {
        let mut fed = 0;
        let mut i = 0;
        let mut out = 0;
        while fed < c_bytes {
            let chunk = &chunks_c[i % chunks_c.len()];
            let take = chunk.len().min(c_bytes - fed);
            out += strip_ansi_escapes::strip(&chunk[..take]).len();
            fed += take;
            i += 1;
        }
        out
    })
    .0;
    let c_anstream = time_best(runs, || {
        let mut stripper = anstream::adapter::StripBytes::new();
        let mut fed = 0;
        let mut i = 0;
        let mut out = 0;
        while fed < c_bytes {
            let chunk = &chunks_c[i % chunks_c.len()];
            let take = chunk.len().min(c_bytes - fed);
            out += stripper
                .strip_next(&chunk[..take])
                .map(<[u8]>::len)
                .sum::<usize>();
            fed += take;
            i += 1;
        }
        out
    })
    .0;

    let plain = plain_text(256 * MIB);
    let heavy = progress_output(256 * MIB);
    println!(
        "{:<34} {:>11} {:>11} {:>11} {:>9} {:>9}",
        "input", "shaper", "strip-ansi", "anstream", "vs strip", "vs anstr"
    );
    for (name, input) in [
        ("(a) plain text, 256 MiB", &plain),
        ("(b) escapes/progress, 256 MiB", &heavy),
    ] {
        let shaper = time_best(runs, || shape_all(input)).0;
        let strip = time_best(runs, || strip_all(input)).0;
        let anstream = time_best(runs, || anstream_all(input)).0;
        row(name, input.len(), shaper, strip, anstream);
    }
    row(
        &format!("(c) short lines, {} GB", c_bytes as f64 / 1e9),
        c_bytes,
        c_time,
        c_strip,
        c_anstream,
    );

    println!();
    println!(
        "(c) peak memory: process VmHWM {:.1} MiB (was {:.1} MiB before (c), +{:.1} MiB); \
         shaper buffers at most {:.2} MiB",
        hwm_after_c as f64 / 1024.0,
        hwm_start as f64 / 1024.0,
        (hwm_after_c - hwm_start) as f64 / 1024.0,
        c_peak_buffers as f64 / MIB as f64,
    );
    println!();
    token_reduction();
    println!();
    redaction(&plain);
}

/// Throughput of secret redaction alone (one pass over a whole text): plain text, and the same
/// text with a token every 4 KiB.
fn redaction(plain: &[u8]) {
    let redactor = ring0_shape::Redactor::new(["host-marked-secret-value"]).expect("redactor");
    let text = String::from_utf8_lossy(&plain[..64 * MIB]).into_owned();
    let mut seeded = String::with_capacity(text.len() + text.len() / 64);
    for (i, piece) in text.as_bytes().chunks(4096).enumerate() {
        seeded.push_str(std::str::from_utf8(piece).unwrap_or(""));
        if i % 2 == 0 {
            seeded.push_str(" ghp_0123456789abcdefghijABCDEFGHIJ012345\n");
        } else {
            seeded.push_str(" host-marked-secret-value\n");
        }
    }
    for (name, input) in [
        ("plain text, 64 MiB", &text),
        ("a secret every 4 KiB", &seeded),
    ] {
        let (t, n) = time_best(3, || redactor.redact(input).1);
        println!(
            "redaction, {name:<24} {:>6.2} GB/s ({n} redacted)",
            input.len() as f64 / 1e9 / t.as_secs_f64()
        );
    }
}

fn row(name: &str, bytes: usize, shaper: Duration, strip: Duration, anstream: Duration) {
    let gbps = |d: Duration| bytes as f64 / 1e9 / d.as_secs_f64();
    println!(
        "{:<34} {:>6.2} GB/s {:>6.2} GB/s {:>6.2} GB/s {:>8.2}× {:>8.2}×",
        name,
        gbps(shaper),
        gbps(strip),
        gbps(anstream),
        strip.as_secs_f64() / shaper.as_secs_f64(),
        anstream.as_secs_f64() / shaper.as_secs_f64(),
    );
}

fn shape_all(input: &[u8]) -> usize {
    let mut shaper = StreamShaper::new(ShapeConfig::default()).expect("default config");
    for chunk in input.chunks(CHUNK) {
        shaper.push(Stream::Stdout, chunk);
    }
    shaper.finish(ExitInfo::exited(0)).text.len()
}

fn strip_all(input: &[u8]) -> usize {
    input
        .chunks(CHUNK)
        .map(|c| strip_ansi_escapes::strip(c).len())
        .sum()
}

fn anstream_all(input: &[u8]) -> usize {
    let mut stripper = anstream::adapter::StripBytes::new();
    input
        .chunks(CHUNK)
        .map(|c| stripper.strip_next(c).map(<[u8]>::len).sum::<usize>())
        .sum()
}

/// Best time of `runs` runs. On a machine shared with other work, wall time measures the queue
/// as much as the code, so the time counted is this thread's time on a CPU
/// (`/proc/thread-self/schedstat`), falling back to wall time where that is unavailable.
fn time_best<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..runs.max(1) {
        let cpu_start = cpu_time();
        let start = Instant::now();
        let out = black_box(f());
        let wall = start.elapsed();
        let took = match (cpu_start, cpu_time()) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => wall,
        };
        best = best.min(took);
        last = Some(out);
    }
    (best, last.expect("at least one run"))
}

/// This thread's time on a CPU.
fn cpu_time() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Deterministic pseudo-random numbers (xorshift), so every run sees the same input.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const WORDS: &[&str] = &[
    "request",
    "handled",
    "in",
    "ms",
    "user",
    "session",
    "opened",
    "cache",
    "miss",
    "for",
    "key",
    "writing",
    "block",
    "to",
    "disk",
    "ok",
    "the",
    "worker",
    "finished",
    "job",
    "with",
    "status",
    "retrying",
    "connection",
    "after",
    "timeout",
    "config",
    "loaded",
    "from",
    "path",
];

/// Log-like lines of 20–140 characters.
fn plain_text(size: usize) -> Vec<u8> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut out = Vec::with_capacity(size + 256);
    let mut n = 0u64;
    while out.len() < size {
        n += 1;
        out.extend_from_slice(
            format!("2026-11-30T12:{:02}:{:02} INFO ", n / 60 % 60, n % 60).as_bytes(),
        );
        let words = 2 + rng.below(18);
        for _ in 0..words {
            out.extend_from_slice(WORDS[rng.below(WORDS.len() as u64) as usize].as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(format!("id={}\n", rng.below(1_000_000)).as_bytes());
    }
    out.truncate(size);
    out
}

/// Cargo- and pip-style progress frames (colours, `\r`, `CSI K`) with coloured lines between.
fn progress_output(size: usize) -> Vec<u8> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut out = Vec::with_capacity(size + 512);
    let mut crate_n = 0u64;
    while out.len() < size {
        crate_n += 1;
        out.extend_from_slice(
            format!(
                "\x1b[1m\x1b[92m   Compiling\x1b[0m crate{crate_n} v0.{}.0\r\n",
                rng.below(20)
            )
            .as_bytes(),
        );
        for step in 0..(10 + rng.below(20)) {
            let done = (step % 30) as usize;
            out.extend_from_slice(
                format!(
                    "\x1b[1m\x1b[96m    Building\x1b[0m [{}>{}] {}/500: crate{}, crate{}\r\x1b[K",
                    "=".repeat(done),
                    " ".repeat(30 - done),
                    crate_n,
                    crate_n,
                    crate_n + 1
                )
                .as_bytes(),
            );
            let filled = (step % 40) as usize;
            out.extend_from_slice(
                format!(
                    "\x1b[2K   \x1b[38;5;197m{}\x1b[0m\x1b[38;5;237m{}\x1b[0m \x1b[32m{}.{}/12.4 MB\x1b[0m \x1b[31m{} MB/s\x1b[0m eta \x1b[36m0:00:0{}\x1b[0m\r",
                    "━".repeat(filled),
                    "━".repeat(40 - filled),
                    step / 3,
                    step % 10,
                    10 + rng.below(90),
                    rng.below(10)
                )
                .as_bytes(),
            );
        }
    }
    out.truncate(size);
    out
}

/// A set of 64 KiB chunks of short lines, cycled to make a long stream.
fn short_line_chunks() -> Vec<Vec<u8>> {
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    (0..16)
        .map(|c| {
            let mut chunk = Vec::with_capacity(CHUNK + 64);
            while chunk.len() < CHUNK {
                chunk.extend_from_slice(format!("{c}:{} ok\n", rng.below(100_000)).as_bytes());
            }
            chunk.truncate(CHUNK);
            chunk
        })
        .collect()
}

/// Peak resident set of this process (`VmHWM`), in KiB.
fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Raw → shaped o200k tokens for each capture of the test corpus.
fn token_reduction() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    entries.retain(|p: &std::path::PathBuf| p.extension().is_some_and(|x| x == "raw"));
    entries.sort();
    println!("token reduction on the capture corpus (o200k, raw → shaped text):");
    let (mut raw_total, mut shaped_total) = (0, 0);
    for path in entries {
        let raw = std::fs::read(&path).unwrap_or_default();
        let obs = ring0_shape::shape_bytes(&raw, &ShapeConfig::default()).expect("default config");
        let Some(t) = obs.tokens else { continue };
        raw_total += t.raw;
        shaped_total += t.shaped;
        println!(
            "  {:<22} {:>6} → {:>5} tokens  ({:>5.1}% fewer)",
            path.file_stem().unwrap_or_default().to_string_lossy(),
            t.raw,
            t.shaped,
            100.0 * (1.0 - t.shaped as f64 / t.raw.max(1) as f64)
        );
    }
    println!(
        "  {:<22} {:>6} → {:>5} tokens  ({:>5.1}% fewer)",
        "total",
        raw_total,
        shaped_total,
        100.0 * (1.0 - shaped_total as f64 / raw_total.max(1) as f64)
    );
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
