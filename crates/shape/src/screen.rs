//! The line model: what a person would see in the terminal's scrollback.
//!
//! Terminal programs redraw: a progress bar prints a line, returns the carriage (`\r`) and prints
//! it again; a multi-line display moves the cursor up (`CSI A`), erases lines (`CSI K`, `CSI 2K`)
//! and prints them again. Passed through as bytes, every frame reaches the model. The screen keeps
//! the last [`SCREEN_LINES_MAX`] lines editable, applies those edits to them, and hands older lines
//! on as finished text, so each redrawn line collapses to its final state.
//!
//! No library does this for a stream with bounded memory (terminal emulators keep a full grid and
//! a scrollback of fixed width), so it is written here: a contiguous byte buffer of the editable
//! lines, their start offsets, and a cursor. Appending at the end of the bottom line — the
//! overwhelmingly common case — is a `memcpy`; edits elsewhere splice the small window.
//!
//! Columns count characters; wide characters and tabs count as one column. Inputs are valid UTF-8
//! without control characters other than `\n` and `\t` (the sanitizer guarantees it).

use std::collections::VecDeque;

use crate::config::{LINE_BYTES_MAX, SCREEN_LINES_MAX};

/// Lines beyond the editable window collected before they are handed on in one block.
const FLUSH_BATCH_LINES: usize = 448;
/// Bytes in the window that trigger handing finished lines on, whatever their count: twice the
/// most the editable lines can hold, so each byte is moved at most about once more.
const FLUSH_BATCH_BYTES: usize = 2 * SCREEN_LINES_MAX * LINE_BYTES_MAX;

/// Receives finished text: whole lines (each ending in `\n`), except that a line longer than
/// [`LINE_BYTES_MAX`] and the unterminated last line arrive without one.
pub(crate) trait LineSink {
    fn lines(&mut self, block: &[u8], newlines: u64);
}

/// Cursor column: at the end of the line, or at a character column with, when known, its byte
/// offset in the line (so a redraw of a long line does not count characters from its start for
/// every piece of text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Col {
    End,
    At(usize, Option<usize>),
}

/// The editable window of a terminal screen.
pub(crate) struct Screen {
    /// The window's lines; every line but the last ends in `\n`.
    buf: Vec<u8>,
    /// Byte offset of each line in `buf`; never empty, `starts[0] == 0`.
    starts: VecDeque<usize>,
    /// Cursor line, an index into `starts`.
    row: usize,
    col: Col,
    /// Bytes dropped because a redrawn line above the bottom outgrew [`LINE_BYTES_MAX`].
    pub clipped_bytes: u64,
}

impl Default for Screen {
    fn default() -> Self {
        Self {
            buf: Vec::new(),
            starts: VecDeque::from([0]),
            row: 0,
            col: Col::End,
            clipped_bytes: 0,
        }
    }
}

impl Screen {
    fn bottom(&self) -> usize {
        self.starts.len() - 1
    }

    /// Byte range of line `r` without its `\n`.
    fn line_range(&self, r: usize) -> (usize, usize) {
        let start = self.starts[r];
        let end = if r + 1 < self.starts.len() {
            self.starts[r + 1] - 1
        } else {
            self.buf.len()
        };
        (start, end)
    }

    /// Writes text at the cursor. `text` is valid UTF-8 and may contain `\n` and `\t`; `ascii`
    /// says it has no multi-byte characters (a hint only, for speed).
    pub fn text<S: LineSink>(&mut self, mut text: &[u8], ascii: bool, sink: &mut S) {
        while !text.is_empty() {
            let Some(i) = find_newline(text) else {
                self.write(text, ascii, sink);
                return;
            };
            if self.col == Col::End && self.row == self.bottom() {
                let taken = self.append_lines(text);
                if taken > 0 {
                    text = &text[taken..];
                    self.flush_if_full(sink);
                    continue;
                }
            }
            self.write(&text[..i], ascii, sink);
            self.newline(sink);
            text = &text[i + 1..];
        }
    }

    /// The common case in bulk: whole lines appended at the bottom, exactly as [`Self::write`]
    /// then [`Self::newline`] would, line by line, add them. Stops before a line that would reach
    /// the line limit and after the line that fills the window; returns the bytes taken.
    fn append_lines(&mut self, text: &[u8]) -> usize {
        let base = self.buf.len();
        let mut line_len = base - self.starts[self.row];
        let mut taken = 0;
        for nl in memchr::memchr_iter(b'\n', text) {
            if line_len + (nl - taken) > LINE_BYTES_MAX {
                break;
            }
            taken = nl + 1;
            line_len = 0;
            self.starts.push_back(base + taken);
            if self.window_full(base + taken) {
                break;
            }
        }
        if taken > 0 {
            self.buf.extend_from_slice(&text[..taken]);
            self.row = self.starts.len() - 1;
        }
        taken
    }

    fn window_full(&self, buf_len: usize) -> bool {
        self.starts.len() > SCREEN_LINES_MAX + FLUSH_BATCH_LINES || buf_len > FLUSH_BATCH_BYTES
    }

    fn flush_if_full<S: LineSink>(&mut self, sink: &mut S) {
        if self.window_full(self.buf.len()) {
            self.flush_old(sink);
        }
    }

    /// Line feed: the cursor moves to the start of the next line; at the bottom a new line opens
    /// and old lines beyond the window are handed on.
    pub fn newline<S: LineSink>(&mut self, sink: &mut S) {
        if self.row < self.bottom() {
            self.row += 1;
            self.col = Col::At(0, Some(0));
            return;
        }
        self.buf.push(b'\n');
        self.starts.push_back(self.buf.len());
        self.row += 1;
        self.col = Col::End;
        self.flush_if_full(sink);
    }

    /// Carriage return: back to column 0 of the same line.
    pub fn carriage_return(&mut self) {
        self.col = Col::At(0, Some(0));
    }

    /// Backspace: one column left, stopping at column 0.
    pub fn backspace(&mut self) {
        let c = self.column();
        self.col = Col::At(c.saturating_sub(1), None);
    }

    /// Cursor up (`CSI n A`), stopping at the oldest editable line.
    pub fn cursor_up(&mut self, n: usize) {
        let c = self.column();
        self.row = self.row.saturating_sub(n);
        self.col = Col::At(c, None);
    }

    /// Cursor down (`CSI n B`), stopping at the bottom line.
    pub fn cursor_down(&mut self, n: usize) {
        let c = self.column();
        self.row = (self.row.saturating_add(n)).min(self.bottom());
        self.col = Col::At(c, None);
    }

    /// Cursor forward (`CSI n C`).
    pub fn cursor_forward(&mut self, n: usize) {
        let c = self.column();
        self.col = Col::At(c.saturating_add(n).min(LINE_BYTES_MAX), None);
    }

    /// Cursor back (`CSI n D`).
    pub fn cursor_back(&mut self, n: usize) {
        let c = self.column();
        self.col = Col::At(c.saturating_sub(n), None);
    }

    /// Cursor to a column (`CSI n G`, 0-based here).
    pub fn cursor_column(&mut self, c: usize) {
        self.col = Col::At(c.min(LINE_BYTES_MAX), None);
    }

    /// Erase in line (`CSI n K`): 0 cursor to end, 1 start to cursor, 2 the whole line.
    pub fn erase_line(&mut self, mode: u16) {
        let (start, end) = self.line_range(self.row);
        match mode {
            0 => {
                if let Col::At(c, _) = self.col {
                    let off = char_offset(&self.buf[start..end], c);
                    if off.is_some_and(|o| start + o < end) {
                        let cut = start + off.unwrap_or(0);
                        self.splice(self.row, cut, end, &[]);
                    }
                }
            }
            1 => {
                let c = self.column();
                let line = &self.buf[start..end];
                let chars = char_count(line);
                let n = (c + 1).min(chars);
                let byte_end = char_offset(line, n).unwrap_or(line.len());
                let spaces = vec![b' '; n];
                self.splice(self.row, start, start + byte_end, &spaces);
                self.col = Col::At(c, None);
            }
            2 => {
                let c = self.column();
                self.splice(self.row, start, end, &[]);
                self.col = Col::At(c, (c == 0).then_some(0));
            }
            _ => {}
        }
    }

    /// Erase in display (`CSI n J`). Only 0 (cursor to the end of the screen) changes the text:
    /// clearing the whole screen leaves the scrollback a person would scroll back to.
    pub fn erase_display(&mut self, mode: u16) {
        if mode != 0 {
            return;
        }
        self.erase_line(0);
        if self.row < self.bottom() {
            // Drop the lines below the cursor line and its own line break.
            let (_, end) = self.line_range(self.row);
            self.buf.truncate(end);
            self.starts.truncate(self.row + 1);
        }
    }

    /// Bytes of memory held.
    pub fn buffered_bytes(&self) -> usize {
        self.buf.capacity() + self.starts.capacity() * std::mem::size_of::<usize>()
    }

    /// Hands every line on, the unterminated last one included, and empties the screen.
    pub fn finish<S: LineSink>(&mut self, sink: &mut S) {
        if !self.buf.is_empty() {
            sink.lines(&self.buf, (self.starts.len() - 1) as u64);
        }
        self.buf.clear();
        self.starts.clear();
        self.starts.push_back(0);
        self.row = 0;
        self.col = Col::End;
    }

    /// The cursor's column as a number.
    fn column(&self) -> usize {
        match self.col {
            Col::At(c, _) => c,
            Col::End => {
                let (s, e) = self.line_range(self.row);
                char_count(&self.buf[s..e])
            }
        }
    }

    /// Writes text without line breaks at the cursor.
    ///
    /// [`Self::write_one`] is the reference behaviour, one character at a time; this does the same
    /// in bulk whenever no limit can be reached, and falls back to it otherwise, so the result
    /// never depends on how the text was split into calls.
    fn write<S: LineSink>(&mut self, text: &[u8], ascii: bool, sink: &mut S) {
        if text.is_empty() {
            return;
        }
        let (c, known) = match self.col {
            Col::End => return self.append(text, sink),
            Col::At(c, known) => (c, known),
        };
        let (start, end) = self.line_range(self.row);
        let line_len = end - start;
        // The cursor's byte offset, or how far past the end of the line it is.
        let (off, pad) = match known {
            Some(off) => (off, 0),
            None => {
                let line = &self.buf[start..end];
                match char_offset(line, c) {
                    Some(o) => (o, 0),
                    None => (line_len, c - char_count(line)),
                }
            }
        };
        if line_len + pad + text.len() > LINE_BYTES_MAX {
            for ch in Chars(text) {
                self.write_one(ch, sink);
            }
            return;
        }
        if pad > 0 {
            let spaces = vec![b' '; pad];
            self.splice(self.row, end, end, &spaces);
        }
        let (start, end) = self.line_range(self.row);
        let at = start + off + pad;
        let text_chars = if ascii { text.len() } else { char_count(text) };
        // The bytes of the characters the text replaces, unless the line ends first.
        match char_offset(&self.buf[at..end], text_chars) {
            Some(n) if at + n < end => {
                self.splice(self.row, at, at + n, text);
                self.col = Col::At(c + text_chars, Some(at - start + text.len()));
            }
            _ => {
                self.splice(self.row, at, end, text);
                self.col = Col::End;
            }
        }
    }

    /// Writes one character at the cursor: the reference behaviour near the line limit. A
    /// character that would grow a line past [`LINE_BYTES_MAX`] is dropped and counted, except at
    /// the end of the bottom line, where the line is handed on as a piece first.
    fn write_one<S: LineSink>(&mut self, ch: &[u8], sink: &mut S) {
        let c = match self.col {
            Col::End => return self.append(ch, sink),
            Col::At(c, _) => c,
        };
        let (start, end) = self.line_range(self.row);
        let line = &self.buf[start..end];
        let line_chars = char_count(line);
        let pad = c.saturating_sub(line_chars);
        let at = start + char_offset(line, c).unwrap_or(end - start);
        let replace = if c < line_chars {
            char_len(self.buf[at])
        } else {
            0
        };
        if (end - start) + pad + ch.len() - replace > LINE_BYTES_MAX {
            self.clipped_bytes += ch.len() as u64;
            return;
        }
        if pad > 0 {
            let spaces = vec![b' '; pad];
            self.splice(self.row, end, end, &spaces);
        }
        let (start, end) = self.line_range(self.row);
        let at = start + char_offset(&self.buf[start..end], c).unwrap_or(end - start);
        self.splice(self.row, at, at + replace, ch);
        let (_, end) = self.line_range(self.row);
        self.col = if at + ch.len() == end {
            Col::End
        } else {
            Col::At(c + 1, None)
        };
    }

    /// Appends at the end of the cursor line.
    fn append<S: LineSink>(&mut self, mut text: &[u8], sink: &mut S) {
        let (start, end) = self.line_range(self.row);
        if self.row != self.bottom() {
            if (end - start) + text.len() <= LINE_BYTES_MAX {
                self.splice(self.row, end, end, text);
                return;
            }
            for ch in Chars(text) {
                let (start, end) = self.line_range(self.row);
                if (end - start) + ch.len() <= LINE_BYTES_MAX {
                    self.splice(self.row, end, end, ch);
                } else {
                    self.clipped_bytes += ch.len() as u64;
                }
            }
            return;
        }
        // Bottom line: a line longer than the limit is handed on in pieces.
        loop {
            let (start, end) = self.line_range(self.row);
            let room = LINE_BYTES_MAX - (end - start);
            if text.len() <= room {
                self.buf.extend_from_slice(text);
                return;
            }
            let cut = floor_char_boundary(text, room);
            self.buf.extend_from_slice(&text[..cut]);
            text = &text[cut..];
            self.flush_all(sink);
        }
    }

    /// Replaces `buf[from..to]` (inside line `row`) with `with`, shifting later line starts.
    fn splice(&mut self, row: usize, from: usize, to: usize, with: &[u8]) {
        let removed = to - from;
        if removed == with.len() {
            self.buf[from..to].copy_from_slice(with);
            return;
        }
        if to == self.buf.len() {
            // At the end of the window (the bottom line): no bytes to move.
            self.buf.truncate(from);
            self.buf.extend_from_slice(with);
        } else if with.len() > removed {
            let grow = with.len() - removed;
            let old_len = self.buf.len();
            self.buf.resize(old_len + grow, 0);
            self.buf.copy_within(to..old_len, to + grow);
            self.buf[from..from + with.len()].copy_from_slice(with);
        } else {
            let shrink = removed - with.len();
            self.buf.copy_within(to.., from + with.len());
            self.buf.truncate(self.buf.len() - shrink);
            self.buf[from..from + with.len()].copy_from_slice(with);
        }
        let grow = with.len() as isize - removed as isize;
        for s in self.starts.iter_mut().skip(row + 1) {
            *s = (*s as isize + grow) as usize;
        }
    }

    /// Hands on lines older than the editable window (never the cursor line).
    fn flush_old<S: LineSink>(&mut self, sink: &mut S) {
        let keep_from = self
            .starts
            .len()
            .saturating_sub(SCREEN_LINES_MAX)
            .min(self.row);
        if keep_from == 0 {
            return;
        }
        let cut = self.starts[keep_from];
        sink.lines(&self.buf[..cut], keep_from as u64);
        self.buf.drain(..cut);
        self.starts.drain(..keep_from);
        for s in self.starts.iter_mut() {
            *s -= cut;
        }
        self.row -= keep_from;
    }

    /// Hands on everything, the bottom line as a piece without a line break (it reached
    /// [`LINE_BYTES_MAX`]); the next text starts a new piece.
    fn flush_all<S: LineSink>(&mut self, sink: &mut S) {
        sink.lines(&self.buf, (self.starts.len() - 1) as u64);
        self.buf.clear();
        self.starts.clear();
        self.starts.push_back(0);
        self.row = 0;
        self.col = Col::End;
    }
}

/// The first line break; short texts (most pieces between escape sequences) are scanned
/// directly, where setting up a vector search costs more than it saves.
#[inline]
fn find_newline(text: &[u8]) -> Option<usize> {
    if text.len() < 32 {
        text.iter().position(|&b| b == b'\n')
    } else {
        memchr::memchr(b'\n', text)
    }
}

/// Iterates the characters of valid UTF-8 as byte slices.
struct Chars<'a>(&'a [u8]);

impl<'a> Iterator for Chars<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let first = *self.0.first()?;
        let n = char_len(first).min(self.0.len());
        let (ch, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(ch)
    }
}

/// Length of the UTF-8 sequence a lead byte starts.
fn char_len(lead: u8) -> usize {
    match lead {
        0..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    }
}

/// Characters in valid UTF-8.
fn char_count(s: &[u8]) -> usize {
    let words = s.chunks_exact(8);
    let rest = words.remainder();
    let mut count = 0;
    for w in words {
        count += 8 - continuation_bytes(w);
    }
    count + rest.iter().filter(|&&b| is_char_start(b)).count()
}

/// Continuation bytes (`10xxxxxx`) in an 8-byte word: bit 7 set and bit 6 clear, counted for
/// all eight bytes at once.
#[inline]
fn continuation_bytes(w: &[u8]) -> usize {
    let mut arr = [0u8; 8];
    arr.copy_from_slice(w);
    let x = u64::from_le_bytes(arr);
    (x & !(x << 1) & 0x8080_8080_8080_8080).count_ones() as usize
}

fn is_char_start(b: u8) -> bool {
    (b as i8) >= -0x40
}

/// Byte offset of character `n`, or `None` if the text has fewer characters.
fn char_offset(s: &[u8], n: usize) -> Option<usize> {
    if n == 0 {
        return Some(0);
    }
    // Whole words while they hold fewer than the characters still to skip, then byte by byte.
    let mut seen = 0;
    let mut i = 0;
    while i + 8 <= s.len() {
        let starts = 8 - continuation_bytes(&s[i..i + 8]);
        if seen + starts > n {
            break;
        }
        seen += starts;
        i += 8;
    }
    while i < s.len() {
        if is_char_start(s[i]) {
            if seen == n {
                return Some(i);
            }
            seen += 1;
        }
        i += 1;
    }
    (seen == n).then_some(s.len())
}

/// The largest character boundary of valid UTF-8 `s` not after `max`.
pub(crate) fn floor_char_boundary(s: &[u8], max: usize) -> usize {
    if max >= s.len() {
        return s.len();
    }
    let mut i = max;
    while i > 0 && !is_char_start(s[i]) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Collect(Vec<u8>);
    impl LineSink for Collect {
        fn lines(&mut self, block: &[u8], _: u64) {
            self.0.extend_from_slice(block);
        }
    }

    fn run(f: impl FnOnce(&mut Screen, &mut Collect)) -> String {
        let mut s = Screen::default();
        let mut c = Collect::default();
        f(&mut s, &mut c);
        s.finish(&mut c);
        String::from_utf8(c.0).unwrap()
    }

    #[test]
    fn carriage_return_rewrites_the_line_from_column_zero() {
        let out = run(|s, c| {
            s.text(b"50% done", true, c);
            s.carriage_return();
            s.text(b"100%", true, c);
        });
        assert_eq!(out, "100%done");
    }

    #[test]
    fn erase_to_end_after_carriage_return_leaves_only_the_new_text() {
        let out = run(|s, c| {
            s.text(b"downloading 10%", true, c);
            s.carriage_return();
            s.erase_line(0);
            s.text(b"done\n", true, c);
        });
        assert_eq!(out, "done\n");
    }

    #[test]
    fn cursor_up_and_erase_line_redraw_a_multi_line_display() {
        let out = run(|s, c| {
            s.text(b"a: 0%\nb: 0%\n", true, c);
            s.cursor_up(2);
            s.erase_line(2);
            s.text(b"a: 100%\n", true, c);
            s.erase_line(2);
            s.text(b"b: 100%\n", true, c);
        });
        assert_eq!(out, "a: 100%\nb: 100%\n");
    }

    #[test]
    fn overwriting_multibyte_text_replaces_whole_characters() {
        let out = run(|s, c| {
            s.text("ééé".as_bytes(), false, c);
            s.carriage_return();
            s.text(b"ab", true, c);
        });
        assert_eq!(out, "abé");
    }

    #[test]
    fn backspace_moves_left_so_the_next_character_overwrites() {
        let out = run(|s, c| {
            s.text(b"cat", true, c);
            s.backspace();
            s.text(b"r", true, c);
        });
        assert_eq!(out, "car");
    }

    #[test]
    fn character_offsets_agree_with_the_standard_library() {
        let text = "a━b█cé😀d ━━━━━━━━ xyz ééééééééé";
        let bytes = text.as_bytes();
        let starts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        for (n, &at) in starts.iter().enumerate() {
            assert_eq!(char_offset(bytes, n), Some(at), "char {n}");
        }
        assert_eq!(char_offset(bytes, starts.len()), Some(bytes.len()));
        assert_eq!(char_offset(bytes, starts.len() + 1), None);
        assert_eq!(char_count(bytes), text.chars().count());
    }

    #[test]
    fn a_line_longer_than_the_limit_is_passed_on_in_pieces_without_loss() {
        let long = vec![b'x'; LINE_BYTES_MAX * 3 + 5];
        let out = run(|s, c| s.text(&long, true, c));
        assert_eq!(out.len(), long.len());
    }

    #[test]
    fn cursor_up_beyond_the_window_stops_at_the_oldest_editable_line() {
        let out = run(|s, c| {
            s.text(b"one\n", true, c);
            s.cursor_up(1000);
            s.text(b"ONE", true, c);
        });
        assert_eq!(out, "ONE\n");
    }
}
