//! The sanitizer: untrusted terminal bytes in, printable text and line-model edits out.
//!
//! Escape sequences (CSI, OSC including OSC 8 hyperlinks and OSC 52 clipboard writes, DCS, SOS,
//! PM, APC, other ESC sequences) are parsed by `vte`, the state machine of Paul Williams' DEC
//! parser, and never reach the output. The cursor movements and erasures that progress displays
//! use are applied to the [`Screen`]; everything else is dropped.
//!
//! Most output is plain text, so the sanitizer does not hand every byte to the parser: a word-at-a
//! -time scan finds the next byte that needs a decision and copies the plain run before it to the
//! screen in one call; only an `ESC` switches to the parser, which keeps the bytes until the
//! sequence ends. State carries across calls in both paths (an unfinished sequence in the parser,
//! an unfinished UTF-8 character here), and both paths decide every character the same way, so
//! any split of the input into chunks gives the same output.
//!
//! What is dropped: raw 8-bit C1 bytes and C1 characters, C0 controls other than `\n`, `\r`,
//! `\t` and backspace (which edit the line), DEL, and invisible or bidirectional-control
//! characters (counted separately). Invalid UTF-8 becomes U+FFFD, exactly as `vte` does it.
//!
//! The parser is used without its `std` feature: its OSC buffer then has a fixed size, so an
//! endless OSC 52 payload cannot grow memory.

use crate::screen::{LineSink, Screen};

const ESC: u8 = 0x1b;

/// Counts of what the sanitizer removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SanitizeStats {
    pub escapes: u64,
    pub controls: u64,
    pub invisible: u64,
}

/// Sanitizes one stream.
pub(crate) struct Sanitizer {
    parser: vte::Parser,
    /// The parser owns the stream until it reports it is back in its ground state.
    in_escape: bool,
    /// The last thing read was the ESC ending a string sequence (OSC, DCS), so a `\` that
    /// follows is its terminator, not a sequence of its own (only the escape count depends on
    /// it). Every other event clears it, in the fast path as in the parser's callbacks.
    after_string: bool,
    partial: [u8; 4],
    partial_len: usize,
    /// The end of a chunk held back from the parser (an unfinished UTF-8 character, ≤ 3 bytes).
    carry: Vec<u8>,
    /// Decode plain CSI sequences directly ([`plain_csi`]); off only to test against `vte`.
    csi_fast_path: bool,
    /// Text read across colour changes, written to the screen in one piece (always empty
    /// between calls).
    pending: Vec<u8>,
    pending_ascii: bool,
    pub stats: SanitizeStats,
}

impl Default for Sanitizer {
    fn default() -> Self {
        Self {
            parser: vte::Parser::default(),
            in_escape: false,
            after_string: false,
            partial: [0; 4],
            partial_len: 0,
            carry: Vec::new(),
            csi_fast_path: true,
            pending: Vec::new(),
            pending_ascii: true,
            stats: SanitizeStats::default(),
        }
    }
}

impl Sanitizer {
    /// Sanitizes a chunk, writing to `screen`, which hands finished lines to `sink`.
    pub fn push<S: LineSink>(&mut self, chunk: &[u8], screen: &mut Screen, sink: &mut S) {
        let joined;
        let mut bytes = chunk;
        if !self.carry.is_empty() {
            joined = [std::mem::take(&mut self.carry).as_slice(), chunk].concat();
            bytes = &joined;
        }
        while !bytes.is_empty() {
            if self.in_escape {
                // The parser is never handed a chunk ending inside a UTF-8 character: its own
                // resumption of such a character can skip the bytes after it, so those last bytes
                // wait here for the next chunk instead.
                let hold = incomplete_utf8_suffix(bytes);
                let feed = &bytes[..bytes.len() - hold];
                let mut perf = Perf {
                    screen,
                    sink,
                    stats: &mut self.stats,
                    after_string: &mut self.after_string,
                    done: false,
                    by_dispatch: false,
                };
                let n = self.parser.advance_until_terminated(&mut perf, feed);
                let (done, by_dispatch) = (perf.done, perf.by_dispatch);
                let last = n.checked_sub(1).map(|i| feed[i]);
                bytes = &bytes[n..];
                // A dispatch stops the parser right after the sequence, in its ground state.
                // Anything else that ended the call (a printed character, CAN or SUB) came from a
                // run of text the parser read in its ground state, which it ends after an invalid
                // sequence (ground), at an ESC it consumes (in a sequence again) or at the end of
                // what it was given (perhaps holding the start of a character). In the last two
                // cases it stays in charge.
                let parser_busy = !by_dispatch && (n == feed.len() || last == Some(ESC));
                if done && !parser_busy {
                    self.in_escape = false;
                } else if n == feed.len() && hold > 0 {
                    self.carry.extend_from_slice(bytes);
                    return;
                }
                continue;
            }
            if self.partial_len > 0 {
                self.after_string = false;
                let n = self.resume_partial(bytes, screen, sink);
                bytes = &bytes[n..];
                continue;
            }
            if bytes[0] != ESC {
                self.after_string = false;
            }
            let n = self.ground(bytes, screen, sink);
            bytes = &bytes[n..];
            if bytes.first() == Some(&ESC) {
                self.in_escape = true;
            }
        }
    }

    /// Ends the stream: an unfinished UTF-8 character becomes U+FFFD; an unfinished escape
    /// sequence is dropped.
    pub fn finish<S: LineSink>(&mut self, screen: &mut Screen, sink: &mut S) {
        if self.partial_len > 0 {
            self.partial_len = 0;
            on_char('\u{FFFD}', screen, sink, &mut self.stats);
        }
        if self.in_escape {
            // The parser may hold an unfinished UTF-8 character from text it printed; an ESC
            // makes it emit U+FFFD for it (as it does mid-stream) and prints nothing else.
            let mut perf = Perf {
                screen,
                sink,
                stats: &mut self.stats,
                after_string: &mut self.after_string,
                done: false,
                by_dispatch: false,
            };
            let carry = std::mem::take(&mut self.carry);
            self.parser.advance(&mut perf, &carry);
            self.parser.advance(&mut perf, &[ESC]);
        }
        self.in_escape = false;
        self.parser = vte::Parser::default();
    }

    /// The fast path: processes bytes until an `ESC` (not consumed) or the end.
    fn ground<S: LineSink>(&mut self, bytes: &[u8], screen: &mut Screen, sink: &mut S) -> usize {
        let n = bytes.len();
        let mut run_start = 0;
        let mut run_ascii = true;
        let mut i = 0;
        while i < n {
            i = scan_plain_ascii(bytes, i);
            if i == n {
                break;
            }
            let b = bytes[i];
            if b < 0x80 {
                let run = &bytes[run_start..i];
                if b == ESC {
                    match plain_csi(&bytes[i..]).filter(|_| self.csi_fast_path) {
                        Some((len, action, first, second)) => {
                            self.stats.escapes += 1;
                            self.after_string = false;
                            if edits_screen(action) {
                                self.emit(run, run_ascii, screen, sink);
                                apply_csi(screen, action, first, second);
                            } else {
                                // A colour change: the text on both sides is one piece.
                                self.stage(run, run_ascii);
                            }
                            run_ascii = true;
                            i += len;
                            run_start = i;
                            continue;
                        }
                        None => {
                            self.emit(run, run_ascii, screen, sink);
                            return i;
                        }
                    }
                }
                self.emit(run, run_ascii, screen, sink);
                run_ascii = true;
                on_control(b, screen, sink, &mut self.stats);
                i += 1;
                run_start = i;
                continue;
            }
            match decode(&bytes[i..]) {
                Decoded::Char(c, len) if !needs_decision(c) => {
                    run_ascii = false;
                    i += len;
                    // Stay here while the text is non-ASCII (a bar of box-drawing characters).
                    while let Some(&lead) = bytes.get(i) {
                        if lead < 0x80 {
                            break;
                        }
                        if let Some(len) = common_three_byte(bytes, i) {
                            // A bar repeats one character: compare whole characters after it.
                            let ch = &bytes[i..i + len];
                            i += len;
                            while bytes.get(i..i + len) == Some(ch) {
                                i += len;
                            }
                            continue;
                        }
                        match plain_multibyte_len(&bytes[i..]) {
                            Some(len) => i += len,
                            None => break,
                        }
                    }
                }
                Decoded::Char(c, len) => {
                    self.emit(&bytes[run_start..i], run_ascii, screen, sink);
                    run_ascii = true;
                    on_char(c, screen, sink, &mut self.stats);
                    i += len;
                    run_start = i;
                }
                Decoded::Invalid(len) => {
                    self.emit(&bytes[run_start..i], run_ascii, screen, sink);
                    run_ascii = true;
                    on_invalid(b, len, screen, sink, &mut self.stats);
                    i += len;
                    run_start = i;
                }
                Decoded::Incomplete => {
                    self.emit(&bytes[run_start..i], run_ascii, screen, sink);
                    let rest = &bytes[i..];
                    self.partial[..rest.len()].copy_from_slice(rest);
                    self.partial_len = rest.len();
                    return n;
                }
            }
        }
        self.emit(&bytes[run_start..n], run_ascii, screen, sink);
        n
    }

    /// Keeps a piece of text that continues after a colour change.
    fn stage(&mut self, run: &[u8], ascii: bool) {
        if !run.is_empty() {
            self.pending.extend_from_slice(run);
            self.pending_ascii &= ascii;
        }
    }

    /// Writes the staged text and `run` to the screen.
    fn emit<S: LineSink>(&mut self, run: &[u8], ascii: bool, screen: &mut Screen, sink: &mut S) {
        if self.pending.is_empty() {
            if !run.is_empty() {
                screen.text(run, ascii, sink);
            }
            return;
        }
        self.pending.extend_from_slice(run);
        screen.text(&self.pending, self.pending_ascii && ascii, sink);
        self.pending.clear();
        self.pending_ascii = true;
    }

    /// Completes a UTF-8 character left unfinished by the previous chunk; returns the bytes of
    /// `bytes` consumed (possibly none, when the next byte shows the character was invalid).
    fn resume_partial<S: LineSink>(
        &mut self,
        bytes: &[u8],
        screen: &mut Screen,
        sink: &mut S,
    ) -> usize {
        let old = self.partial_len;
        let take = bytes.len().min(4 - old);
        let mut tmp = [0u8; 4];
        tmp[..old].copy_from_slice(&self.partial[..old]);
        tmp[old..old + take].copy_from_slice(&bytes[..take]);
        match decode(&tmp[..old + take]) {
            Decoded::Char(c, len) => {
                self.partial_len = 0;
                on_char(c, screen, sink, &mut self.stats);
                len - old
            }
            Decoded::Invalid(len) => {
                self.partial_len = 0;
                on_invalid(tmp[0], len, screen, sink, &mut self.stats);
                len.saturating_sub(old)
            }
            Decoded::Incomplete => {
                self.partial[old..old + take].copy_from_slice(&bytes[..take]);
                self.partial_len += take;
                take
            }
        }
    }
}

/// The parser's callbacks.
struct Perf<'a, S> {
    screen: &'a mut Screen,
    sink: &'a mut S,
    stats: &'a mut SanitizeStats,
    after_string: &'a mut bool,
    /// The parser is back in its ground state (or was, while reading a run of text).
    done: bool,
    /// `done` came from a dispatched sequence.
    by_dispatch: bool,
}

impl<S: LineSink> vte::Perform for Perf<'_, S> {
    fn terminated(&self) -> bool {
        self.done
    }

    fn print(&mut self, c: char) {
        on_char(c, self.screen, self.sink, self.stats);
        *self.after_string = false;
        self.done = true;
    }

    fn execute(&mut self, byte: u8) {
        on_control(byte, self.screen, self.sink, self.stats);
        *self.after_string = false;
        // CAN and SUB abort a sequence and return the parser to ground.
        if byte == 0x18 || byte == 0x1a {
            self.done = true;
        }
    }

    fn hook(&mut self, _: &vte::Params, _: &[u8], _: bool, _: char) {
        self.stats.escapes += 1;
        *self.after_string = false;
    }

    fn unhook(&mut self) {
        *self.after_string = true;
    }

    fn osc_dispatch(&mut self, _: &[&[u8]], bell_terminated: bool) {
        self.stats.escapes += 1;
        if bell_terminated {
            self.done = true;
            self.by_dispatch = true;
        } else {
            *self.after_string = true;
        }
    }

    fn csi_dispatch(&mut self, params: &vte::Params, intermediates: &[u8], ignore: bool, c: char) {
        self.stats.escapes += 1;
        self.done = true;
        self.by_dispatch = true;
        *self.after_string = false;
        if ignore || !intermediates.is_empty() {
            return;
        }
        let mut it = params.iter().map(|p| p.first().copied().unwrap_or(0));
        let first = it.next().unwrap_or(0);
        let second = it.next();
        apply_csi(self.screen, c, first, second);
    }

    fn esc_dispatch(&mut self, _: &[u8], _: bool, byte: u8) {
        if !(byte == b'\\' && *self.after_string) {
            self.stats.escapes += 1;
        }
        *self.after_string = false;
        self.done = true;
        self.by_dispatch = true;
    }
}

/// Length of an unfinished UTF-8 character at the end of `b` (0 to 3 bytes).
fn incomplete_utf8_suffix(b: &[u8]) -> usize {
    for k in 1..=b.len().min(3) {
        let first = b[b.len() - k];
        if first & 0xc0 == 0x80 {
            continue;
        }
        return match std::str::from_utf8(&b[b.len() - k..]) {
            Err(e) if e.valid_up_to() == 0 && e.error_len().is_none() => k,
            _ => 0,
        };
    }
    0
}

/// Applies a control sequence without intermediates: the cursor movements and erasures
/// redrawing displays use. Everything else (colours, modes, scrolling) does not change the text.
fn apply_csi(s: &mut Screen, action: char, first: u16, second: Option<u16>) {
    let count = usize::from(first.max(1));
    match action {
        'A' => s.cursor_up(count),
        'B' => s.cursor_down(count),
        'C' => s.cursor_forward(count),
        'D' => s.cursor_back(count),
        'E' => {
            s.cursor_down(count);
            s.carriage_return();
        }
        'F' => {
            s.cursor_up(count);
            s.carriage_return();
        }
        'G' => s.cursor_column(count - 1),
        // Absolute positioning: the row has no meaning in a scrollback, the column does.
        'H' | 'f' => s.cursor_column(usize::from(second.unwrap_or(1).max(1)) - 1),
        'K' => s.erase_line(first),
        'J' => s.erase_display(first),
        _ => {}
    }
}

/// Whether a control sequence's action changes the text (see [`apply_csi`]).
fn edits_screen(action: char) -> bool {
    matches!(action, 'A'..='H' | 'J' | 'K' | 'f')
}

/// Digits a parameter of a [`plain_csi`] sequence may have (so it cannot overflow).
const PLAIN_CSI_DIGITS_MAX: usize = 4;
/// Parameters a [`plain_csi`] sequence may have (well below the parser's limit of 32).
const PLAIN_CSI_PARAMS_MAX: usize = 16;

/// The common control sequence `ESC [ digits ; digits … final`, complete in `b` (which starts
/// with ESC): returns its length, action and first two parameters exactly as `vte` would
/// dispatch them. Anything else — intermediates, private markers, sub-parameters, controls inside,
/// long parameters, a sequence cut by the end of the chunk — returns `None` and goes to `vte`.
///
/// Written by hand for speed: colour and erase sequences are most of the bytes of progress
/// output, and decoding this one form directly is several times faster than the general state
/// machine. A test checks it against `vte` on generated sequences.
#[inline]
fn plain_csi(b: &[u8]) -> Option<(usize, char, u16, Option<u16>)> {
    if b.get(1) != Some(&b'[') {
        return None;
    }
    let mut params = [0u16; 2];
    let mut n_params = 0usize;
    let mut digits = 0usize;
    let mut value = 0u16;
    let mut i = 2;
    loop {
        let c = *b.get(i)?;
        match c {
            b'0'..=b'9' => {
                digits += 1;
                if digits > PLAIN_CSI_DIGITS_MAX {
                    return None;
                }
                value = value * 10 + u16::from(c - b'0');
            }
            b';' => {
                if n_params < 2 {
                    params[n_params] = value;
                }
                n_params += 1;
                if n_params >= PLAIN_CSI_PARAMS_MAX {
                    return None;
                }
                value = 0;
                digits = 0;
            }
            0x40..=0x7e => {
                if n_params < 2 {
                    params[n_params] = value;
                }
                n_params += 1;
                let second = (n_params >= 2).then_some(params[1]);
                return Some((i + 1, c as char, params[0], second));
            }
            _ => return None,
        }
        i += 1;
    }
}

/// One character decided: kept, or dropped and counted.
fn on_char<S: LineSink>(c: char, screen: &mut Screen, sink: &mut S, stats: &mut SanitizeStats) {
    if c == '\u{7f}' || ('\u{80}'..='\u{9f}').contains(&c) {
        stats.controls += 1;
    } else if is_invisible(c) {
        stats.invisible += 1;
    } else {
        let mut buf = [0u8; 4];
        let s = c.encode_utf8(&mut buf);
        screen.text(s.as_bytes(), c.is_ascii(), sink);
    }
}

/// One control byte: a line edit, a tab kept as text, or dropped and counted.
fn on_control<S: LineSink>(b: u8, screen: &mut Screen, sink: &mut S, stats: &mut SanitizeStats) {
    match b {
        b'\n' => screen.newline(sink),
        b'\r' => screen.carriage_return(),
        0x08 => screen.backspace(),
        b'\t' => screen.text(b"\t", true, sink),
        _ => stats.controls += 1,
    }
}

/// An invalid UTF-8 sequence: a lone byte in the C1 range is a raw 8-bit control (dropped),
/// anything else becomes U+FFFD — the same decision `vte` makes.
fn on_invalid<S: LineSink>(
    first: u8,
    len: usize,
    screen: &mut Screen,
    sink: &mut S,
    stats: &mut SanitizeStats,
) {
    if len == 1 && (0x80..=0x9f).contains(&first) {
        stats.controls += 1;
    } else {
        on_char('\u{FFFD}', screen, sink, stats);
    }
}

/// Zero-width, bidirectional-control and tag characters: invisible to a reader, visible to a
/// model, and a known way to hide instructions in text.
pub(crate) fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{061C}'
        | '\u{200B}'..='\u{200F}'
        | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{2069}'
        | '\u{FEFF}'
        | '\u{E0000}'..='\u{E007F}')
}

/// Non-ASCII characters the fast path must not copy: C1 controls and invisible characters.
fn needs_decision(c: char) -> bool {
    ('\u{80}'..='\u{9f}').contains(&c) || is_invisible(c)
}

enum Decoded {
    Char(char, usize),
    Invalid(usize),
    Incomplete,
}

/// Decodes the character at the start of `b` (non-empty) the way `std::str::from_utf8` sees it.
fn decode(b: &[u8]) -> Decoded {
    if let Some((c, len)) = decode_valid(b) {
        return Decoded::Char(c, len);
    }
    decode_slow(b)
}

/// Length of the valid multi-byte character at the start of `b` if it needs no decision (not a C1
/// control, not invisible), decided on the bytes without building the character; `None` sends it
/// to the general path. Agrees with [`decode`] and [`needs_decision`] (tested over every
/// character).
#[inline]
fn plain_multibyte_len(b: &[u8]) -> Option<usize> {
    let cont = |x: u8| x & 0xc0 == 0x80;
    let lead = *b.first()?;
    let b1 = *b.get(1)?;
    match lead {
        0xc2..=0xdf => {
            let decision = (lead == 0xc2 && b1 <= 0x9f) || (lead == 0xd8 && b1 == 0x9c);
            (cont(b1) && !decision).then_some(2)
        }
        0xe0..=0xef => {
            let b2 = *b.get(2)?;
            let second_ok = match lead {
                0xe0 => (0xa0..=0xbf).contains(&b1),
                0xed => (0x80..=0x9f).contains(&b1),
                _ => cont(b1),
            };
            let decision = (lead == 0xe2
                && ((b1 == 0x80 && matches!(b2, 0x8b..=0x8f | 0xaa..=0xae))
                    || (b1 == 0x81 && matches!(b2, 0xa0..=0xa4 | 0xa6..=0xa9))))
                || (lead == 0xef && b1 == 0xbb && b2 == 0xbf);
            (second_ok && cont(b2) && !decision).then_some(3)
        }
        0xf0..=0xf4 => {
            let (b2, b3) = (*b.get(2)?, *b.get(3)?);
            let second_ok = match lead {
                0xf0 => (0x90..=0xbf).contains(&b1),
                0xf4 => (0x80..=0x8f).contains(&b1),
                _ => cont(b1),
            };
            let decision = lead == 0xf3 && b1 == 0xa0 && (b2 == 0x80 || b2 == 0x81);
            (second_ok && cont(b2) && cont(b3) && !decision).then_some(4)
        }
        _ => None,
    }
}

/// The most common non-ASCII text in tool output — three-byte characters such as box drawing,
/// block elements and arrows — checked in one step: leads E1–EC and EE–EF (no overlong or
/// surrogate forms), except the lead E2 with 80/81 (where the invisible characters are) and
/// EF BB (the byte-order mark). Agrees with [`plain_multibyte_len`] where it answers.
#[inline(always)]
fn common_three_byte(b: &[u8], i: usize) -> Option<usize> {
    let (lead, b1, b2) = (*b.get(i)?, *b.get(i + 1)?, *b.get(i + 2)?);
    let lead_ok = matches!(lead, 0xe1..=0xec | 0xee..=0xef);
    let cont = (b1 & 0xc0 == 0x80) && (b2 & 0xc0 == 0x80);
    let special = (lead == 0xe2 && b1 <= 0x81) || (lead == 0xef && b1 == 0xbb);
    (lead_ok && cont && !special).then_some(3)
}

/// The common case: a complete, valid multi-byte sequence, checked by hand against the UTF-8
/// table (RFC 3629) so the standard decoder only runs on the rare invalid or cut sequence.
#[inline]
fn decode_valid(b: &[u8]) -> Option<(char, usize)> {
    let cont = |i: usize| b.get(i).copied().filter(|&x| x & 0xc0 == 0x80);
    let lead = *b.first()?;
    let (len, second_ok) = match lead {
        0xc2..=0xdf => (2, (0x80..=0xbf)),
        0xe0 => (3, (0xa0..=0xbf)),
        0xe1..=0xec | 0xee..=0xef => (3, (0x80..=0xbf)),
        0xed => (3, (0x80..=0x9f)),
        0xf0 => (4, (0x90..=0xbf)),
        0xf1..=0xf3 => (4, (0x80..=0xbf)),
        0xf4 => (4, (0x80..=0x8f)),
        _ => return None,
    };
    let second = b.get(1).copied().filter(|x| second_ok.contains(x))?;
    let mut code = match len {
        2 => u32::from(lead & 0x1f),
        3 => u32::from(lead & 0x0f),
        _ => u32::from(lead & 0x07),
    };
    code = (code << 6) | u32::from(second & 0x3f);
    for i in 2..len {
        code = (code << 6) | u32::from(cont(i)? & 0x3f);
    }
    Some((char::from_u32(code)?, len))
}

fn decode_slow(b: &[u8]) -> Decoded {
    let w = &b[..b.len().min(4)];
    let valid = match std::str::from_utf8(w) {
        Ok(s) => s,
        Err(e) if e.valid_up_to() > 0 => match std::str::from_utf8(&w[..e.valid_up_to()]) {
            Ok(s) => s,
            Err(_) => return Decoded::Invalid(1),
        },
        Err(e) => {
            return match e.error_len() {
                Some(n) => Decoded::Invalid(n),
                None => Decoded::Incomplete,
            };
        }
    };
    match valid.chars().next() {
        Some(c) => Decoded::Char(c, c.len_utf8()),
        None => Decoded::Incomplete,
    }
}

/// Bytes that are always plain text: printable ASCII, newline and tab.
const fn plain_table() -> [bool; 256] {
    let mut t = [false; 256];
    let mut i = 0x20;
    while i < 0x7f {
        t[i] = true;
        i += 1;
    }
    t[b'\n' as usize] = true;
    t[b'\t' as usize] = true;
    t
}
static PLAIN: [bool; 256] = plain_table();

/// Index of the first byte at or after `i` that is not plain ASCII (printable, `\n`, `\t`),
/// eight bytes at a time. Written by hand: memchr searches for at most three bytes, and this
/// needs a class of them. Each mask below is exact per byte (no carries cross byte lanes).
fn scan_plain_ascii(b: &[u8], mut i: usize) -> usize {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    // High bit set in each byte of `x` that is zero.
    let zero = |x: u64| !(((x & LOW7) + LOW7) | x) & HI;
    while let Some(word) = b.get(i..i + 8) {
        let mut arr = [0u8; 8];
        arr.copy_from_slice(word);
        let w = u64::from_le_bytes(arr);
        let high = w & HI;
        // Bytes below 0x20 (for bytes under 0x80: adding 0x60 reaches bit 7 iff b >= 0x20).
        let below_space = !((w & LOW7) + LO * 0x60) & HI & !high;
        let allowed = zero(w ^ (LO * b'\n' as u64)) | zero(w ^ (LO * b'\t' as u64));
        let del = zero(w ^ (LO * 0x7f));
        let special = high | (below_space & !allowed) | del;
        if special != 0 {
            return i + (special.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < b.len() && PLAIN[b[i] as usize] {
        i += 1;
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

    fn sanitize_chunks(chunks: &[&[u8]]) -> (String, SanitizeStats) {
        let mut san = Sanitizer::default();
        let mut screen = Screen::default();
        let mut sink = Collect::default();
        for c in chunks {
            san.push(c, &mut screen, &mut sink);
        }
        san.finish(&mut screen, &mut sink);
        screen.finish(&mut sink);
        (String::from_utf8(sink.0).unwrap(), san.stats)
    }

    fn sanitize(input: &[u8]) -> String {
        sanitize_chunks(&[input]).0
    }

    #[test]
    fn colour_codes_are_removed_and_the_text_kept() {
        assert_eq!(sanitize(b"\x1b[1;31merror\x1b[0m: bad\n"), "error: bad\n");
    }

    #[test]
    fn osc_hyperlink_keeps_its_text_and_drops_the_target() {
        let input = b"see \x1b]8;;https://x.invalid/\x1b\\docs\x1b]8;;\x1b\\ now";
        assert_eq!(sanitize(input), "see docs now");
    }

    #[test]
    fn osc_52_clipboard_write_is_removed_whole() {
        let input = b"a\x1b]52;c;ZXZpbCBwYXlsb2Fk\x07b";
        assert_eq!(sanitize(input), "ab");
    }

    #[test]
    fn dcs_sos_pm_and_apc_strings_are_removed_whole() {
        let input = b"1\x1bPq#0;2;0;0;0\x1b\\2\x1bXsos\x1b\\3\x1b^pm\x1b\\4\x1b_apc\x1b\\5";
        assert_eq!(sanitize(input), "12345");
    }

    #[test]
    fn raw_c1_bytes_and_c0_controls_are_dropped_and_counted() {
        let (out, stats) = sanitize_chunks(&[b"a\x9bb\x07c\x00d\x7fe\tf"]);
        assert_eq!(out, "abcde\tf");
        assert_eq!(stats.controls, 4);
    }

    #[test]
    fn invisible_and_bidi_characters_are_removed_and_counted() {
        let input = "pay\u{200B}ment \u{202E}evil\u{202C} \u{2066}x\u{2069} tag\u{E0041}";
        let (out, stats) = sanitize_chunks(&[input.as_bytes()]);
        assert_eq!(out, "payment evil x tag");
        assert_eq!(stats.invisible, 6);
    }

    #[test]
    fn invalid_utf8_becomes_replacement_characters() {
        assert_eq!(sanitize(b"a\xffb\xe2\x28c"), "a\u{FFFD}b\u{FFFD}(c");
    }

    #[test]
    fn an_escape_split_across_chunks_is_still_removed() {
        let (out, _) = sanitize_chunks(&[b"ok \x1b[3", b"2mgreen\x1b", b"[0m done"]);
        assert_eq!(out, "ok green done");
    }

    #[test]
    fn a_character_split_across_chunks_is_kept_whole() {
        let (out, _) = sanitize_chunks(&[b"caf\xc3", b"\xa9 \xe2\x9c", b"\x93"]);
        assert_eq!(out, "café ✓");
    }

    #[test]
    fn every_split_point_gives_the_same_output() {
        let input: &[u8] = b"\x1b[32m\xe2\x9c\x93\x1b[0m ok\r\n\x1b]0;title\x07pro\x1b[2K\rgress 9\xe2\x80\x8b%\r100%\n\xf0\x9f\x98\x80 \xc3";
        let whole = sanitize(input);
        for i in 0..=input.len() {
            for j in i..=input.len() {
                let (split, _) = sanitize_chunks(&[&input[..i], &input[i..j], &input[j..]]);
                assert_eq!(split, whole, "split at {i},{j}");
            }
        }
    }

    #[test]
    fn text_after_an_ignored_sequence_is_split_invariant_up_to_the_next_escape() {
        // An over-long CSI is ignored without a callback; the parser then prints the following
        // text itself and consumes the next ESC, which must not be forgotten.
        let input: &[u8] = b"\x1b[$<[\x01\x00\x8a(2$\x8aF\n\x00\x1b?x";
        let whole = sanitize(input);
        assert_eq!(whole, "(2$F\nx");
        for i in 0..=input.len() {
            let (split, _) = sanitize_chunks(&[&input[..i], &input[i..]]);
            assert_eq!(split, whole, "split at {i}");
        }
    }

    #[test]
    fn an_unfinished_character_held_by_the_parser_at_the_end_becomes_a_replacement() {
        let input: &[u8] = b"\x1b[6/6C\xef\xbf\xbf\xf4";
        let whole = sanitize(input);
        assert_eq!(whole, "\u{FFFF}\u{FFFD}");
        for i in 0..=input.len() {
            let (split, _) = sanitize_chunks(&[&input[..i], &input[i..]]);
            assert_eq!(split, whole, "split at {i}");
        }
    }

    #[test]
    fn a_character_split_while_the_parser_is_in_charge_keeps_what_follows_it() {
        let input: &[u8] = b"\x1b\x1b\xef[-=_\xc9\x8a[\xd3x";
        let whole = sanitize(input);
        assert_eq!(whole, "\u{24a}[\u{FFFD}x");
        for i in 0..=input.len() {
            let (split, _) = sanitize_chunks(&[&input[..i], &input[i..]]);
            assert_eq!(split, whole, "split at {i}");
        }
    }

    #[test]
    fn a_cancel_inside_text_the_parser_reads_keeps_the_split_character_that_follows() {
        let input: &[u8] = b"\x1b[-=_\x1a\xf0\xf0";
        let whole = sanitize(input);
        assert_eq!(whole, "\u{FFFD}\u{FFFD}");
        for i in 0..=input.len() {
            let (split, _) = sanitize_chunks(&[&input[..i], &input[i..]]);
            assert_eq!(split, whole, "split at {i}");
        }
    }

    #[test]
    fn escape_counts_do_not_depend_on_chunking() {
        let input: &[u8] = b"-\x1b\xba]\x1b\x1a\xba\x01\xc1]\xba\xba\x1b\n\\x\x1b]0;t\x1b\\";
        let (whole, stats) = sanitize_chunks(&[input]);
        for i in 0..=input.len() {
            let split = sanitize_chunks(&[&input[..i], &input[i..]]);
            assert_eq!(split, (whole.clone(), stats), "split at {i}");
        }
    }

    #[test]
    fn an_endless_osc_payload_does_not_reach_the_output() {
        let mut input = b"x\x1b]52;c;".to_vec();
        input.extend(std::iter::repeat_n(b'A', 1 << 20));
        input.extend_from_slice(b"\x07y");
        assert_eq!(sanitize(&input), "xy");
    }
}
#[cfg(test)]
mod scan_tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Default)]
    struct Collect(Vec<u8>);
    impl LineSink for Collect {
        fn lines(&mut self, block: &[u8], _: u64) {
            self.0.extend_from_slice(block);
        }
    }

    fn run(input: &[u8], fast: bool) -> (Vec<u8>, SanitizeStats) {
        let mut san = Sanitizer {
            csi_fast_path: fast,
            ..Sanitizer::default()
        };
        let mut screen = Screen::default();
        let mut sink = Collect::default();
        san.push(input, &mut screen, &mut sink);
        san.finish(&mut screen, &mut sink);
        screen.finish(&mut sink);
        (sink.0, san.stats)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn the_plain_csi_decoder_agrees_with_vte(
            pieces in prop::collection::vec(
                prop_oneof![
                    Just(b"\x1b[".to_vec()),
                    "[0-9;]{0,24}".prop_map(String::into_bytes),
                    prop::sample::select(b"ABCDEFGHJKfmsu@~ ".to_vec()).prop_map(|b| vec![b]),
                    "[a-z\r\n]{0,6}".prop_map(String::into_bytes),
                    Just(b"\x1b]0;t\x1b\\".to_vec()),
                    Just(b":?<$\x07\x1b".to_vec()),
                    prop::collection::vec(any::<u8>(), 0..3),
                ],
                0..40,
            )
        ) {
            let input = pieces.concat();
            prop_assert_eq!(run(&input, true), run(&input, false));
        }
    }

    #[test]
    fn the_byte_level_check_agrees_with_decoding_for_every_character() {
        for cp in 0x80..=0x10ffffu32 {
            let Some(c) = char::from_u32(cp) else {
                continue;
            };
            let mut buf = [0u8; 4];
            let bytes = c.encode_utf8(&mut buf).as_bytes();
            let expected = (!needs_decision(c)).then_some(bytes.len());
            assert_eq!(plain_multibyte_len(bytes), expected, "U+{cp:04X}");
        }
    }

    #[test]
    fn the_three_byte_shortcut_agrees_with_the_full_check() {
        for lead in 0xe0..=0xefu8 {
            for b1 in 0..=0xffu8 {
                for b2 in 0..=0xffu8 {
                    let seq = [lead, b1, b2];
                    if let Some(len) = common_three_byte(&seq, 0) {
                        assert_eq!(plain_multibyte_len(&seq), Some(len), "{seq:x?}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_byte_level_check_refuses_every_invalid_two_byte_prefix() {
        for a in 0x80..=0xffu8 {
            for b in 0..=0xffu8 {
                let seq = [a, b, 0x80, 0x80];
                if let Some(len) = plain_multibyte_len(&seq) {
                    assert!(std::str::from_utf8(&seq[..len]).is_ok(), "{seq:x?}");
                }
            }
        }
    }

    #[test]
    fn the_word_scan_agrees_with_the_byte_table_on_every_byte_in_every_lane() {
        for lane in 0..8 {
            for b in 0..=255u8 {
                let mut buf = vec![b'a'; 16];
                buf[lane] = b;
                let expected = if PLAIN[b as usize] { 16 } else { lane };
                assert_eq!(scan_plain_ascii(&buf, 0), expected, "byte {b:#x} at {lane}");
            }
        }
    }
}
