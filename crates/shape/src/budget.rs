//! Byte budgets: the head and the tail of a stream around a counting tombstone.
//!
//! A stream's shaped text arrives in blocks of any size (a 50 MB line has no line break to wait
//! for), so the budget is enforced on bytes first: the first bytes fill a head buffer, every later
//! byte goes through a ring buffer that keeps only the most recent ones. Both are sized from the
//! budget, so memory does not depend on the input. At the end the allowance for the stream is
//! known (it shares the budget with the other stream) and the kept text is cut from those buffers:
//! on UTF-8 boundaries always, and on line boundaries when one is near enough, with a tombstone
//! between head and tail that counts the line breaks and bytes left out.

use ring0_core::observation::{Truncation, TruncationReason};

use crate::screen::floor_char_boundary;

/// Longest tombstone line, with the line break before and after it.
pub(crate) const TOMBSTONE_BYTES_MAX: usize = 96;

/// Head and tail of one stream's shaped text.
pub(crate) struct StreamBudget {
    head: Vec<u8>,
    head_cap: usize,
    /// Set once a byte did not fit in the head; from then on everything goes to the tail.
    head_closed: bool,
    tail: TailRing,
    pub total_bytes: u64,
    pub total_lines: u64,
}

/// The kept text of a stream and what was cut.
pub(crate) struct CutStream {
    pub text: String,
    pub truncation: Option<Truncation>,
}

impl StreamBudget {
    /// Buffers for a stream that may be given up to `head_cap + tail_cap` bytes.
    pub fn new(head_cap: usize, tail_cap: usize) -> Self {
        Self {
            head: Vec::new(),
            head_cap,
            head_closed: false,
            tail: TailRing::new(tail_cap),
            total_bytes: 0,
            total_lines: 0,
        }
    }

    /// Adds shaped text (valid UTF-8) containing `newlines` line breaks.
    pub fn push(&mut self, mut block: &[u8], newlines: u64) {
        self.total_bytes += block.len() as u64;
        self.total_lines += newlines;
        if !self.head_closed {
            let room = self.head_cap - self.head.len();
            let take = floor_char_boundary(block, room);
            self.head.extend_from_slice(&block[..take]);
            block = &block[take..];
            if !block.is_empty() {
                self.head_closed = true;
            }
        }
        if !block.is_empty() {
            self.tail.push(block);
        }
    }

    /// Bytes of memory held.
    pub fn buffered_bytes(&self) -> usize {
        self.head.capacity() + self.tail.buf.capacity()
    }

    /// Whether everything pushed is still held (head and ring together).
    fn complete(&self) -> bool {
        self.total_bytes == (self.head.len() + self.tail.len()) as u64 && !self.tail.wrapped
    }

    /// Bytes the stream needs to be shown whole, if it can be.
    pub fn whole_len(&self) -> Option<usize> {
        self.complete().then_some(self.total_bytes as usize)
    }

    /// Cuts the stream to `allowance` bytes (tombstone included) with `head_percent` of the kept
    /// text from the head.
    pub fn cut(&self, allowance: usize, head_percent: u8, reason: TruncationReason) -> CutStream {
        if let Some(len) = self.whole_len()
            && len <= allowance
        {
            let mut text = self.head.clone();
            text.extend(self.tail.contents());
            return CutStream {
                text: into_string(text),
                truncation: None,
            };
        }
        let keep = allowance.saturating_sub(TOMBSTONE_BYTES_MAX);
        let head_want = keep * usize::from(head_percent) / 100;
        let tail_want = keep - head_want;

        // Head: a prefix of the head buffer, pulled back to the last line break in its second half.
        let mut head = &self.head[..floor_char_boundary(&self.head, head_want)];
        if !head.ends_with(b"\n")
            && let Some(nl) = memchr::memrchr(b'\n', head)
            && nl + 1 >= head.len() / 2
        {
            head = &head[..nl + 1];
        }

        // Tail: a suffix of what is held after the head, pushed forward to the first line break
        // in its first half.
        let held: Vec<u8> = if self.complete() {
            let mut v = self.head[head.len()..].to_vec();
            v.extend(self.tail.contents());
            v
        } else {
            self.tail.contents().collect()
        };
        let mut from = held.len().saturating_sub(tail_want);
        while from < held.len() && (held[from] as i8) < -0x40 {
            from += 1;
        }
        let mut tail = &held[from..];
        let starts_line = from > 0 && held[from - 1] == b'\n';
        if !starts_line
            && let Some(nl) = memchr::memchr(b'\n', tail)
            && nl < tail.len() / 2
        {
            tail = &tail[nl + 1..];
        }

        let head_lines = memchr::memchr_iter(b'\n', head).count() as u64;
        let tail_lines = memchr::memchr_iter(b'\n', tail).count() as u64;
        let omitted_bytes = self.total_bytes - head.len() as u64 - tail.len() as u64;
        let omitted_lines = self.total_lines - head_lines - tail_lines;
        let truncation = Truncation {
            reason,
            head_bytes: head.len() as u64,
            head_lines,
            tail_bytes: tail.len() as u64,
            tail_lines,
            omitted_bytes,
            omitted_lines,
        };
        let mut text = Vec::with_capacity(allowance);
        text.extend_from_slice(head);
        if !head.is_empty() && !head.ends_with(b"\n") {
            text.push(b'\n');
        }
        text.extend_from_slice(tombstone(omitted_lines, omitted_bytes).as_bytes());
        text.extend_from_slice(tail);
        CutStream {
            text: into_string(text),
            truncation: Some(truncation),
        }
    }
}

/// The line that stands for what was cut.
pub(crate) fn tombstone(lines: u64, bytes: u64) -> String {
    format!(
        "[… {} {} and {} {} omitted …]\n",
        group(lines),
        if lines == 1 {
            "line break"
        } else {
            "line breaks"
        },
        group(bytes),
        if bytes == 1 { "byte" } else { "bytes" },
    )
}

/// `4182041` → `4,182,041`.
pub(crate) fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn into_string(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(s) => s,
        // Cuts are made on character boundaries of valid text; this is a programming error, and
        // the lossy conversion keeps the output valid rather than losing it.
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// The most recent `cap` bytes of a stream.
struct TailRing {
    buf: Vec<u8>,
    cap: usize,
    /// Next write position once full.
    pos: usize,
    /// Bytes have been overwritten.
    wrapped: bool,
}

impl TailRing {
    fn new(cap: usize) -> Self {
        Self {
            buf: Vec::new(),
            cap,
            pos: 0,
            wrapped: false,
        }
    }

    fn len(&self) -> usize {
        self.buf.len()
    }

    fn push(&mut self, mut data: &[u8]) {
        if self.cap == 0 {
            self.wrapped = true;
            return;
        }
        if data.len() >= self.cap {
            // Only the last `cap` bytes can survive.
            if !self.buf.is_empty() || data.len() > self.cap {
                self.wrapped = true;
            }
            data = &data[data.len() - self.cap..];
            self.buf.clear();
            self.buf.extend_from_slice(data);
            self.pos = 0;
            return;
        }
        if self.buf.len() < self.cap {
            let room = self.cap - self.buf.len();
            let take = room.min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
            if data.is_empty() {
                return;
            }
        }
        self.wrapped = true;
        // Full: overwrite the oldest bytes.
        let first = (self.cap - self.pos).min(data.len());
        self.buf[self.pos..self.pos + first].copy_from_slice(&data[..first]);
        let rest = &data[first..];
        self.buf[..rest.len()].copy_from_slice(rest);
        self.pos = (self.pos + data.len()) % self.cap;
    }

    /// Oldest to newest.
    fn contents(&self) -> impl Iterator<Item = u8> + '_ {
        let (a, b) = self.buf.split_at(self.pos);
        b.iter().chain(a.iter()).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect()
    }

    #[test]
    fn a_stream_within_its_allowance_is_kept_whole() {
        let mut b = StreamBudget::new(100, 200);
        b.push(b"hello\nworld\n", 2);
        let cut = b.cut(300, 30, TruncationReason::StreamBudget);
        assert_eq!(cut.text, "hello\nworld\n");
        assert!(cut.truncation.is_none());
    }

    #[test]
    fn a_long_stream_keeps_head_and_tail_around_a_counting_tombstone() {
        let input = lines(10_000);
        let mut b = StreamBudget::new(300, 700);
        for chunk in input.chunks(333) {
            b.push(chunk, memchr::memchr_iter(b'\n', chunk).count() as u64);
        }
        let cut = b.cut(1000, 30, TruncationReason::StreamBudget);
        let t = cut.truncation.unwrap();
        assert!(cut.text.len() <= 1000);
        assert!(cut.text.starts_with("line 0\n"));
        assert!(cut.text.ends_with("line 9999\n"));
        assert_eq!(
            t.head_bytes + t.omitted_bytes + t.tail_bytes,
            input.len() as u64
        );
        assert_eq!(t.head_lines + t.omitted_lines + t.tail_lines, 10_000);
        assert!(cut.text.contains(&format!(
            "[… {} line breaks and {} bytes omitted …]",
            group(t.omitted_lines),
            group(t.omitted_bytes)
        )));
    }

    #[test]
    fn a_single_huge_line_is_cut_on_character_boundaries() {
        let line = "é".repeat(100_000);
        let mut b = StreamBudget::new(300, 700);
        b.push(line.as_bytes(), 0);
        let cut = b.cut(1000, 30, TruncationReason::StreamBudget);
        assert!(cut.text.len() <= 1000);
        assert!(cut.text.starts_with("éé"));
        assert!(cut.text.ends_with("éé"));
        let t = cut.truncation.unwrap();
        assert_eq!(
            t.head_bytes + t.omitted_bytes + t.tail_bytes,
            line.len() as u64
        );
    }

    #[test]
    fn thousands_are_grouped_in_the_tombstone() {
        assert_eq!(
            tombstone(48_195, 4_182_041),
            "[… 48,195 line breaks and 4,182,041 bytes omitted …]\n"
        );
    }
}
