//! The Atomizer (docs/design.md#features-the-atomizer): byte + context state -> 320 features.
//!
//! The Python `atom_train.data.atomizer` module is the readable oracle; this module computes the
//! same features bit for bit, fast. The features of one byte are at most 17 ones in a
//! 320-float vector. [`Context::emit`] is the one definition of which ones; it feeds either
//! the dense row ([`Context::write_features`]) or the compact list of their indices
//! ([`Context::feature_ids`], ascending, padded with [`FEATURE_ID_PAD`]).

use crate::error::{Error, Result};

/// Length of a feature vector.
pub const FEATURE_DIM: usize = 320;
/// Version of the feature definition, recorded in every loader state.
pub const FEATURE_VERSION: u32 = 1;
/// Every part of the context forgets the reset state within this many bytes.
pub const HORIZON: usize = 64;
/// Slots per tick in the compact (ids) representation: one per feature block that can be on.
pub const FEATURE_IDS_PER_TICK: usize = 17;
/// Padding value of unused id slots (one past the last dim).
pub const FEATURE_ID_PAD: i16 = FEATURE_DIM as i16;

/// The indices of the dims that are 1.0, ascending, padded with [`FEATURE_ID_PAD`].
pub type FeatureIds = [i16; FEATURE_IDS_PER_TICK];

// Byte classes (docs/design.md#features-the-atomizer).
pub const CLS_NONE: u8 = 0;
pub const CLS_LOWER: u8 = 1;
pub const CLS_UPPER: u8 = 2;
pub const CLS_DIGIT: u8 = 3;
pub const CLS_SPACE: u8 = 4;
pub const CLS_NEWLINE: u8 = 5;
pub const CLS_PUNCT: u8 = 6;
pub const CLS_CONTROL: u8 = 7;
pub const CLS_LEAD: u8 = 8;
pub const CLS_CONT: u8 = 9;
pub const CLS_INVALID: u8 = 10;
pub const N_CLASSES: u8 = 11;

// First dim of each block.
const BYTE0: i16 = 0;
const CLS0: i16 = 256;
const PREV_CLS0: i16 = 267;
const NEED0: i16 = 278;
const VALIDITY0: i16 = 282;
const WORD_LEN0: i16 = 286;
const LINE_BUCKET0: i16 = 302;
const AFTER_STOP: i16 = 310;
const CAPITAL_AFTER_STOP: i16 = 311;
const BITS0: i16 = 312;

// Validity codes (dims 282..286).
const VALID_START: i16 = 0;
const VALID_CONT: i16 = 1;
const UNEXPECTED_CONT: i16 = 2;
const TRUNCATED: i16 = 3;

pub const WORD_LEN_CAP: u8 = 15;
pub const LINE_LEN_CAP: u8 = 64;
pub const SPACE_RUN_CAP: u8 = 64;

/// The two pack modes (docs/design.md#features-the-atomizer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PackMode {
    Utf8,
    Plain,
}

impl PackMode {
    pub const ALL: [PackMode; 2] = [PackMode::Utf8, PackMode::Plain];

    pub fn name(self) -> &'static str {
        match self {
            PackMode::Utf8 => "utf8",
            PackMode::Plain => "plain",
        }
    }
}

impl std::str::FromStr for PackMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "utf8" => Ok(PackMode::Utf8),
            "plain" => Ok(PackMode::Plain),
            _ => Err(Error::UnknownPackMode(s.to_string())),
        }
    }
}

/// The class of every byte value, computed once at compile time.
static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = class_of(b as u8);
        b += 1;
    }
    t
};

const fn class_of(b: u8) -> u8 {
    match b {
        b'a'..=b'z' => CLS_LOWER,
        b'A'..=b'Z' => CLS_UPPER,
        b'0'..=b'9' => CLS_DIGIT,
        b' ' | b'\t' => CLS_SPACE,
        b'\n' | b'\r' => CLS_NEWLINE,
        0x21..=0x7E => CLS_PUNCT,
        0x00..=0x7F => CLS_CONTROL,
        0xC2..=0xF4 => CLS_LEAD,
        0x80..=0xBF => CLS_CONT,
        _ => CLS_INVALID,
    }
}

/// Continuation bytes each byte announces: 1-3 for UTF-8 lead bytes, else 0.
static LEAD_NEED: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0xC2;
    while b <= 0xF4 {
        t[b] = utf8_need(b as u8);
        b += 1;
    }
    t
};

/// [`line_bucket`] of every `line_len` 0..=64.
static LINE_BUCKET: [u8; LINE_LEN_CAP as usize + 1] = {
    let mut t = [0u8; LINE_LEN_CAP as usize + 1];
    let mut n = 0;
    while n <= LINE_LEN_CAP as usize {
        t[n] = line_bucket(n as u8);
        n += 1;
    }
    t
};

/// The class of byte `b` (1-10; 0 is only ever a `prev_cls`).
#[inline]
pub fn byte_class(b: u8) -> u8 {
    CLASS[b as usize]
}

#[inline]
fn is_letter_like(cls: u8) -> bool {
    matches!(cls, CLS_LOWER | CLS_UPPER | CLS_LEAD | CLS_CONT)
}

/// Bucket of `line_len`: 0, 1, 2-3, 4-7, 8-15, 16-31, 32-63, 64 -> 0..7.
#[inline]
pub const fn line_bucket(line_len: u8) -> u8 {
    if line_len >= LINE_LEN_CAP {
        7
    } else {
        (8 - line_len.leading_zeros()) as u8 // bit length: 0 -> 0, 1 -> 1, 2-3 -> 2, ...
    }
}

/// The context state carried from byte to byte. Field order is the order of the
/// `contexts` rows in a saved loader state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Context {
    pub prev_cls: u8,
    /// UTF-8 continuation bytes still expected, 0-3.
    pub need: u8,
    /// Lead byte of the sequence in progress (0 when `need` == 0).
    pub lead: u8,
    /// Consecutive letter-like bytes before this one, capped at 15.
    pub word_len: u8,
    /// Bytes since the last `\n`, capped at 64.
    pub line_len: u8,
    pub after_stop: u8,
    /// Whitespace bytes since the last non-whitespace byte, capped at 64.
    pub space_run: u8,
}

impl Default for Context {
    fn default() -> Self {
        Context::RESET
    }
}

impl Context {
    /// The reset state (start of a string).
    pub const RESET: Context = Context {
        prev_cls: CLS_NONE,
        need: 0,
        lead: 0,
        word_len: 0,
        line_len: LINE_LEN_CAP,
        after_stop: 1,
        space_run: SPACE_RUN_CAP,
    };

    /// The field names, in the order of [`Context::to_array`].
    pub const FIELDS: [&'static str; 7] = [
        "prev_cls",
        "need",
        "lead",
        "word_len",
        "line_len",
        "after_stop",
        "space_run",
    ];

    pub fn to_array(self) -> [u8; 7] {
        [
            self.prev_cls,
            self.need,
            self.lead,
            self.word_len,
            self.line_len,
            self.after_stop,
            self.space_run,
        ]
    }

    /// A context from saved values, checking every value is one the Atomizer can reach.
    pub fn from_values(v: &[i64]) -> std::result::Result<Context, String> {
        if v.len() != 7 {
            return Err(format!(
                "has {} values, expected 7 ({})",
                v.len(),
                Context::FIELDS.join(", ")
            ));
        }
        let ranges: [(i64, i64); 7] = [
            (0, N_CLASSES as i64 - 1),
            (0, 3),
            (0, 0xF4),
            (0, WORD_LEN_CAP as i64),
            (0, LINE_LEN_CAP as i64),
            (0, 1),
            (0, SPACE_RUN_CAP as i64),
        ];
        for (i, (&x, (lo, hi))) in v.iter().zip(ranges).enumerate() {
            if x < lo || x > hi {
                return Err(format!(
                    "{} = {x} is outside {lo}..={hi}",
                    Context::FIELDS[i]
                ));
            }
        }
        let c = Context {
            prev_cls: v[0] as u8,
            need: v[1] as u8,
            lead: v[2] as u8,
            word_len: v[3] as u8,
            line_len: v[4] as u8,
            after_stop: v[5] as u8,
            space_run: v[6] as u8,
        };
        let lead_ok = if c.need == 0 {
            c.lead == 0
        } else {
            byte_class(c.lead) == CLS_LEAD && c.need <= utf8_need(c.lead)
        };
        if !lead_ok {
            return Err(format!(
                "need = {} and lead = {:#04x} do not go together (lead is 0 when need is 0, \
                 else a UTF-8 lead byte announcing at least `need` continuations)",
                c.need, c.lead
            ));
        }
        Ok(c)
    }

    /// Advance the state past byte `b` (the same in both pack modes).
    ///
    /// Written as selects rather than branches: on text the byte classes are unpredictable,
    /// and the loader runs this once per byte per stream.
    #[inline]
    pub fn advance(&mut self, b: u8) {
        let c = byte_class(b);
        let is_space = c == CLS_SPACE || c == CLS_NEWLINE;
        self.prev_cls = c;
        // A lead byte sets `need`, a continuation counts it down, anything else clears it.
        let need = if c == CLS_CONT {
            self.need.saturating_sub(1)
        } else {
            LEAD_NEED[b as usize]
        };
        self.lead = match (need, c) {
            (0, _) => 0, // so that equal streams have equal states
            (_, CLS_LEAD) => b,
            _ => self.lead,
        };
        self.need = need;
        let word_len = (self.word_len + 1).min(WORD_LEN_CAP);
        self.word_len = if is_letter_like(c) { word_len } else { 0 };
        let line_len = (self.line_len + 1).min(LINE_LEN_CAP);
        self.line_len = if b == b'\n' { 0 } else { line_len };
        let space_run = (self.space_run + 1).min(SPACE_RUN_CAP);
        self.space_run = if is_space { space_run } else { 0 };
        // Whitespace keeps `after_stop` and sets it when the run reaches 64 bytes; any other
        // byte sets it iff it ends a sentence.
        let stop = matches!(b, b'.' | b'!' | b'?');
        let long_run = space_run == SPACE_RUN_CAP;
        self.after_stop = if is_space {
            self.after_stop | long_run as u8
        } else {
            stop as u8
        };
    }

    /// Tell `sink` which features of byte `b` are 1.0, given this (the previous) state, in
    /// ascending order. The single definition of the feature layout.
    #[inline(always)]
    pub fn emit<S: FeatureSink>(&self, b: u8, mode: PackMode, sink: &mut S) {
        let c = byte_class(b);
        sink.one(BYTE0 + b as i16);
        sink.one(CLS0 + c as i16);
        sink.one(PREV_CLS0 + self.prev_cls as i16);
        let cont = c == CLS_CONT;
        let in_sequence = self.need > 0;
        let utf8 = mode == PackMode::Utf8;
        if utf8 {
            let validity = match (cont, in_sequence) {
                (false, false) => VALID_START,
                (true, true) => VALID_CONT,
                (true, false) => UNEXPECTED_CONT,
                (false, true) => TRUNCATED,
            };
            sink.one(NEED0 + self.need as i16);
            sink.one(VALIDITY0 + validity);
        }
        sink.one(WORD_LEN0 + self.word_len as i16);
        sink.one(LINE_BUCKET0 + LINE_BUCKET[self.line_len as usize] as i16);
        let stop = self.after_stop != 0;
        sink.maybe(stop, AFTER_STOP);
        sink.maybe(stop && c == CLS_UPPER, CAPITAL_AFTER_STOP);
        // utf8: the lead byte's bits on a continuation inside a sequence, else none.
        sink.bits(match (utf8, cont && in_sequence) {
            (false, _) => b,
            (true, true) => self.lead,
            (true, false) => 0,
        });
    }

    /// The indices of the features of byte `b` that are 1.0, given this (the previous)
    /// state; ascending, padded with [`FEATURE_ID_PAD`].
    #[inline]
    pub fn feature_ids(&self, b: u8, mode: PackMode) -> FeatureIds {
        let mut sink = IdsSink {
            ids: [FEATURE_ID_PAD; FEATURE_IDS_PER_TICK],
            n: 0,
        };
        self.emit(b, mode, &mut sink);
        sink.ids
    }

    /// Write the 320 features of byte `b`, given this (the previous) state, into `row`.
    #[inline]
    pub fn write_features(&self, b: u8, mode: PackMode, row: &mut [f32; FEATURE_DIM]) {
        row.fill(0.0);
        self.emit(b, mode, &mut DenseSink(row));
    }
}

/// Receives the features that are 1.0 (see [`Context::emit`]).
pub trait FeatureSink {
    /// Feature `id` is 1.0.
    fn one(&mut self, id: i16);
    /// Feature `id` is 1.0 if `on` (a sink may implement this without a branch).
    #[inline(always)]
    fn maybe(&mut self, on: bool, id: i16) {
        if on {
            self.one(id);
        }
    }
    /// Features 312 + i are 1.0 for the bits i of `value` that are set (none when 0).
    fn bits(&mut self, value: u8);
}

struct IdsSink {
    ids: FeatureIds,
    n: usize,
}

impl FeatureSink for IdsSink {
    #[inline(always)]
    fn one(&mut self, id: i16) {
        self.ids[self.n] = id;
        self.n += 1;
    }

    #[inline(always)]
    fn maybe(&mut self, on: bool, id: i16) {
        // Write the id or the pad at slot n; advance n only if on.
        self.ids[self.n] = if on { id } else { FEATURE_ID_PAD };
        self.n += on as usize;
    }

    #[inline(always)]
    fn bits(&mut self, value: u8) {
        // Branch-free: write every bit's id (or the pad) at slot n, advance n if the bit is
        // set. Slots stay in bounds: at most 9 ids come before the bits.
        for bit in 0..8 {
            let on = value >> bit & 1 != 0;
            if let Some(slot) = self.ids.get_mut(self.n) {
                *slot = if on { BITS0 + bit } else { FEATURE_ID_PAD };
            }
            self.n += on as usize;
        }
    }
}

/// Writes the ones into a (zeroed) dense row.
pub struct DenseSink<'a>(pub &'a mut [f32; FEATURE_DIM]);

/// The 8 bits of every byte value as floats, bit 0 first: one copy instead of 8 branches.
static BIT_FLOATS: [[f32; 8]; 256] = {
    let mut t = [[0.0f32; 8]; 256];
    let mut v = 0;
    while v < 256 {
        let mut bit = 0;
        while bit < 8 {
            t[v][bit] = ((v >> bit) & 1) as f32;
            bit += 1;
        }
        v += 1;
    }
    t
};

impl FeatureSink for DenseSink<'_> {
    #[inline(always)]
    fn one(&mut self, id: i16) {
        self.0[id as usize] = 1.0;
    }

    #[inline(always)]
    fn maybe(&mut self, on: bool, id: i16) {
        self.0[id as usize] = on as u8 as f32; // the row is zeroed: writing 0.0 is harmless
    }

    #[inline(always)]
    fn bits(&mut self, value: u8) {
        self.0[BITS0 as usize..].copy_from_slice(&BIT_FLOATS[value as usize]);
    }
}

/// Continuation bytes a UTF-8 lead byte (0xC2-0xF4) announces.
#[inline]
pub const fn utf8_need(lead: u8) -> u8 {
    match lead {
        0..=0xDF => 1,
        0xE0..=0xEF => 2,
        _ => 3,
    }
}

/// The context after warming up on `bytes` from the reset state.
pub fn warm_up(bytes: &[u8]) -> Context {
    let mut ctx = Context::RESET;
    for &b in bytes {
        ctx.advance(b);
    }
    ctx
}

/// Features of every byte of `data` from the reset state: float32 `[N, 320]`, row-major,
/// like the Python oracle's `Atomizer.encode_bytes`.
pub fn encode_bytes(data: &[u8], mode: PackMode) -> Vec<f32> {
    let mut out = vec![0.0f32; data.len() * FEATURE_DIM];
    let mut ctx = Context::RESET;
    for (&b, row) in data.iter().zip(out.chunks_exact_mut(FEATURE_DIM)) {
        let row: &mut [f32; FEATURE_DIM] = row.try_into().expect("chunk of FEATURE_DIM");
        ctx.write_features(b, mode, row);
        ctx.advance(b);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ones(data: &[u8], mode: PackMode) -> Vec<Vec<usize>> {
        encode_bytes(data, mode)
            .chunks(FEATURE_DIM)
            .map(|r| (0..FEATURE_DIM).filter(|&i| r[i] == 1.0).collect())
            .collect()
    }

    #[test]
    fn classes_follow_the_spec_table() {
        let expect = |range: std::ops::RangeInclusive<u8>, cls: u8| {
            for b in range {
                assert_eq!(byte_class(b), cls, "byte {b:#04x}");
            }
        };
        expect(b'a'..=b'z', CLS_LOWER);
        expect(b'A'..=b'Z', CLS_UPPER);
        expect(b'0'..=b'9', CLS_DIGIT);
        expect(0xC2..=0xF4, CLS_LEAD);
        expect(0x80..=0xBF, CLS_CONT);
        expect(0xF5..=0xFF, CLS_INVALID);
        expect(0xC0..=0xC1, CLS_INVALID);
        for b in [b' ', b'\t'] {
            assert_eq!(byte_class(b), CLS_SPACE);
        }
        for b in [b'\n', b'\r'] {
            assert_eq!(byte_class(b), CLS_NEWLINE);
        }
        for b in [0x00, 0x0B, 0x0C, 0x1F, 0x7F] {
            assert_eq!(byte_class(b), CLS_CONTROL, "byte {b:#04x}");
        }
        for b in *b"!/:@[`{~.,?" {
            assert_eq!(byte_class(b), CLS_PUNCT, "byte {b:#04x}");
        }
    }

    #[test]
    fn line_buckets() {
        let got: Vec<u8> = [0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64]
            .iter()
            .map(|&l| line_bucket(l))
            .collect();
        assert_eq!(got, [0, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7]);
    }

    #[test]
    fn first_byte_of_a_string() {
        // 'A' from the reset state: byte 65, cls upper, prev none, need 0, valid start,
        // word_len 0, line bucket 7 (line_len 64), after_stop, capital at sentence start.
        assert_eq!(
            ones(b"A", PackMode::Utf8)[0],
            [65, 258, 267, 278, 282, 286, 309, 310, 311]
        );
        // Plain: no need/validity; the bits of 'A' = 0b0100_0001 -> 312, 318.
        assert_eq!(
            ones(b"A", PackMode::Plain)[0],
            [65, 258, 267, 286, 309, 310, 311, 312, 318]
        );
    }

    #[test]
    fn utf8_sequences_show_the_lead_bits_and_validity() {
        // "é" = C3 A9, then a truncated sequence C3 'x', then a stray continuation.
        let f = ones(&[0xC3, 0xA9, 0xC3, b'x', 0xA9], PackMode::Utf8);
        // C3: lead (cls 8), valid start, need 0.
        assert!(f[0].contains(&(256 + 8)) && f[0].contains(&278) && f[0].contains(&282));
        // A9: continuation expected (need 1), bits of 0xC3 = 1100_0011 -> 312, 313, 318, 319.
        assert_eq!(
            f[1],
            [0xA9, 265, 275, 279, 283, 287, 309, 312, 313, 318, 319]
        );
        // 'x' after C3: truncated (validity 3), need 1 shown.
        assert!(f[3].contains(&285) && f[3].contains(&279));
        // A9 after 'x': unexpected continuation (validity 2), no bits.
        assert!(f[4].contains(&284) && f[4].iter().all(|&i| i < 312));
    }

    #[test]
    fn long_whitespace_runs_count_as_a_sentence_stop() {
        let mut data = b"word".to_vec();
        data.extend([b' '; 64]);
        data.push(b'X');
        let f = ones(&data, PackMode::Utf8);
        assert!(!f[4].contains(&310), "after 'word ' no stop yet");
        assert!(!f[4 + 63].contains(&310), "63 spaces are not a stop");
        assert!(f[4 + 64].contains(&310) && f[4 + 64].contains(&311));
    }

    #[test]
    fn saved_context_values_are_checked() {
        assert_eq!(
            Context::from_values(&[0, 0, 0, 0, 64, 1, 64]),
            Ok(Context::RESET)
        );
        assert!(Context::from_values(&[11, 0, 0, 0, 64, 1, 64]).is_err());
        assert!(Context::from_values(&[0, 1, 0, 0, 64, 1, 64]).is_err()); // need without lead
        assert!(Context::from_values(&[0, 2, 0xC3, 0, 64, 1, 64]).is_err()); // C3 needs 1
        assert!(Context::from_values(&[0, 0, 0, 0, 65, 1, 64]).is_err());
        assert!(Context::from_values(&[0, 0, 0, 0, 64, 1]).is_err());
        assert!(Context::from_values(&[8, 2, 0xE2, 1, 3, 0, 0]).is_ok());
    }

    #[test]
    fn pack_modes_have_their_names_both_ways() {
        assert_eq!(PackMode::Utf8.name(), "utf8");
        assert_eq!(PackMode::Plain.name(), "plain");
        for mode in PackMode::ALL {
            assert_eq!(mode.name().parse::<PackMode>().unwrap(), mode);
        }
        let err = "bytes".parse::<PackMode>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown pack mode 'bytes': use 'utf8' or 'plain'"
        );
    }

    #[test]
    fn word_length_counts_letter_like_bytes_and_restarts_after_others() {
        // "ab" then a space, a digit, a '.', then "é" (lead + continuation) and 'c'.
        let f = ones(b"ab 1.\xc3\xa9c", PackMode::Utf8);
        let word_len = |row: &Vec<usize>| -> usize {
            let d = row.iter().find(|&&i| (286..302).contains(&i)).unwrap();
            d - 286
        };
        let got: Vec<usize> = f.iter().map(word_len).collect();
        // The length before each byte: a 0, b 1, ' ' 2, '1' 0, '.' 0, C3 0, A9 1, c 2.
        assert_eq!(got, [0, 1, 2, 0, 0, 0, 1, 2]);
    }

    #[test]
    fn a_capital_is_marked_only_after_a_stop_and_only_capitals() {
        let f = ones(b"a.bX. C", PackMode::Utf8);
        // 'b' after '.': after_stop, lowercase: no capital mark; 'X' after 'b': neither.
        assert!(f[2].contains(&310) && !f[2].contains(&311));
        assert!(!f[3].contains(&310) && !f[3].contains(&311));
        // 'C' after ". ": both.
        assert!(f[6].contains(&310) && f[6].contains(&311));
    }

    #[test]
    fn a_long_whitespace_run_after_a_stop_keeps_the_stop() {
        let mut data = b"x.".to_vec();
        data.extend([b' '; 64]);
        data.push(b'X');
        let f = ones(&data, PackMode::Utf8);
        assert!(
            f.iter().skip(2).all(|row| row.contains(&310)),
            "the stop holds"
        );
        assert!(f[2 + 64].contains(&311));
    }

    #[test]
    fn only_continuations_inside_a_sequence_show_the_lead_bits() {
        // C3 then 'x' (the sequence is truncated): 'x' is in a sequence but no continuation.
        let f = ones(&[0xC3, b'x'], PackMode::Utf8);
        assert!(
            f[1].contains(&285) && f[1].iter().all(|&i| i < 312),
            "{:?}",
            f[1]
        );
    }

    #[test]
    fn three_and_four_byte_sequences_announce_their_continuations() {
        // "€" = E2 82 AC, "😀" = F0 9F 98 80, then 'a'.
        let data = [0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80, b'a'];
        let f = ones(&data, PackMode::Utf8);
        let need = |row: &Vec<usize>| row.iter().find(|&&i| (278..282).contains(&i)).unwrap() - 278;
        let got: Vec<usize> = f.iter().map(need).collect();
        assert_eq!(got, [0, 2, 1, 0, 3, 2, 1, 0]);
        assert!(
            f[7].contains(&282),
            "'a' after complete sequences is a valid start"
        );
        assert_eq!(
            [0xC2, 0xDF, 0xE0, 0xEF, 0xF0, 0xF4].map(utf8_need),
            [1, 1, 2, 2, 3, 3]
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn ids_are_ascending_padded_and_match_the_dense_row(
            data in proptest::collection::vec(any::<u8>(), 0..300),
            plain in any::<bool>(),
        ) {
            let mode = if plain { PackMode::Plain } else { PackMode::Utf8 };
            let dense = encode_bytes(&data, mode);
            let mut ctx = Context::RESET;
            for (i, &b) in data.iter().enumerate() {
                let ids = ctx.feature_ids(b, mode);
                let n = ids.iter().take_while(|&&id| id != FEATURE_ID_PAD).count();
                prop_assert!(ids[..n].windows(2).all(|w| w[0] < w[1]));
                prop_assert!(ids[n..].iter().all(|&id| id == FEATURE_ID_PAD));
                let row = &dense[i * FEATURE_DIM..(i + 1) * FEATURE_DIM];
                let on: Vec<i16> = (0..FEATURE_DIM as i16).filter(|&d| row[d as usize] == 1.0).collect();
                prop_assert_eq!(&on[..], &ids[..n]);
                prop_assert!(row.iter().all(|&x| x == 0.0 || x == 1.0));
                ctx.advance(b);
            }
        }

        /// The 64-byte horizon: any two states agree after the same 64 bytes.
        #[test]
        fn every_state_is_forgotten_within_the_horizon(
            prefix in proptest::collection::vec(any::<u8>(), 0..200),
            window in prop_oneof![
                proptest::collection::vec(
                    prop_oneof![Just(b' '), Just(b'\n'), Just(b'a'), Just(0xA9u8), any::<u8>()],
                    HORIZON..HORIZON + 1),
                // Runs of one byte (64 spaces, letters, continuations) hit every cap.
                any::<u8>().prop_map(|b| vec![b; HORIZON]),
            ],
        ) {
            let mut a = warm_up(&prefix);
            let mut b = Context::RESET;
            for &x in &window {
                a.advance(x);
                b.advance(x);
            }
            prop_assert_eq!(a, b);
        }

        #[test]
        fn reachable_states_pass_the_saved_state_check(
            data in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let ctx = warm_up(&data);
            let values: Vec<i64> = ctx.to_array().iter().map(|&v| v as i64).collect();
            prop_assert_eq!(Context::from_values(&values), Ok(ctx));
        }
    }
}
