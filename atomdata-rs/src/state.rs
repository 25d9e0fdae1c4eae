//! The loader's saved state: what a checkpoint records of the B streams to resume them
//! exactly.
//!
//! Format 2 (this loader's) is the corpus signature, the pack mode, the feature version, B
//! and the B positions: nothing else. A stream's context is not saved because it follows
//! from its position: the Atomizer forgets any state within [`HORIZON`] bytes (the atomizer
//! tests `every_state_is_forgotten_within_the_horizon`), so a stream warmed up on the 64
//! bytes before its position has exactly the context it had when it was saved.
//!
//! Format 1 (the loader's earlier JSON state) also held the B contexts. It is read here too,
//! in one place ([`BatchedByteStream::load_state`](crate::BatchedByteStream::load_state)):
//! its positions are loaded like format 2's, and each saved context must equal the one its
//! position gives, so a converted state resumes bit for bit or not at all.

use std::ops::Range;

use crate::atomizer::{Context, PackMode, FEATURE_VERSION};
use crate::corpus::{ByteCorpus, Signature};
use crate::error::{Error, Result};

/// The `format` of a saved loader state.
pub const STATE_FORMAT: &str = "atomdata.stream_state";
/// The version this loader writes (a state without a version is version 1).
pub const STATE_VERSION: u64 = 2;
/// The oldest version this loader reads.
pub const OLDEST_STATE_VERSION: u64 = 1;

/// Everything a saved state says besides the positions: which loader made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateHeader {
    pub format: String,
    pub version: u64,
    pub signature: Signature,
    pub pack_mode: String,
    pub feature_version: u64,
    /// The number of streams saved.
    pub b: u64,
}

/// A saved state: its header, the B positions (the corpus offset of each stream's next
/// byte) and, in format 1 only, the B contexts it recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedState {
    pub header: StateHeader,
    pub positions: Vec<i64>,
    /// Format 1's contexts (each the 7 values of [`Context::to_array`]); `None` in format 2.
    pub contexts: Option<Vec<Vec<i64>>>,
}

fn bad(msg: String) -> Error {
    Error::BadState(msg)
}

impl StateHeader {
    /// The header of a state this loader writes now.
    pub fn new(signature: Signature, mode: PackMode, b: usize) -> StateHeader {
        StateHeader {
            format: STATE_FORMAT.to_string(),
            version: STATE_VERSION,
            signature,
            pack_mode: mode.name().to_string(),
            feature_version: FEATURE_VERSION as u64,
            b: b as u64,
        }
    }

    /// Check that the state was saved by a loader like this one: its format and version,
    /// feature version, pack mode, B (`b`: the number of streams the run has) and corpus.
    /// The error says what differs and how to resume.
    pub fn check(&self, corpus: &ByteCorpus, b: usize, mode: PackMode) -> Result<()> {
        self.check_loader(corpus, mode)?;
        if self.b != b as u64 {
            return Err(bad(format!(
                "it has B = {} streams, this loader has B = {b}: resume with B = {}",
                self.b, self.b
            )));
        }
        Ok(())
    }

    /// [`StateHeader::check`] without B.
    fn check_loader(&self, corpus: &ByteCorpus, mode: PackMode) -> Result<()> {
        if self.format != STATE_FORMAT {
            return Err(bad(format!(
                "format is {:?}, expected {STATE_FORMAT:?}: it is not a loader state",
                self.format
            )));
        }
        if !(OLDEST_STATE_VERSION..=STATE_VERSION).contains(&self.version) {
            return Err(bad(format!(
                "it has version {}; this atomdata reads versions {OLDEST_STATE_VERSION} to \
                 {STATE_VERSION}: use the atomdata that saved it",
                self.version
            )));
        }
        if self.feature_version != FEATURE_VERSION as u64 {
            return Err(bad(format!(
                "it was saved with feature version {}, this loader computes feature version \
                 {FEATURE_VERSION}: the features would differ",
                self.feature_version
            )));
        }
        if self.pack_mode != mode.name() {
            return Err(bad(format!(
                "it was saved with pack mode {:?}, this loader uses {:?}: resume with \
                 pack_mode={:?}",
                self.pack_mode,
                mode.name(),
                self.pack_mode
            )));
        }
        if let Some(diff) = signature_difference(&self.signature, &corpus.signature()) {
            return Err(bad(format!(
                "it was saved on a different corpus ({diff}): resume with the same corpus \
                 (--data) or start a new run"
            )));
        }
        Ok(())
    }
}

impl SavedState {
    /// The B streams' positions, each checked to be an offset in `corpus`, and (format 1)
    /// the contexts of streams `streams`, checked to be contexts the Atomizer can reach.
    /// `contexts_at` gives the contexts the positions of `streams` have (the warm-up).
    pub(crate) fn resolve(
        &self,
        corpus: &ByteCorpus,
        mode: PackMode,
        streams: Range<usize>,
        contexts_at: impl FnOnce(&[u64]) -> Result<Vec<Context>>,
    ) -> Result<(Vec<u64>, Vec<Context>)> {
        let h = &self.header;
        self.header.check_loader(corpus, mode)?;
        let b = usize::try_from(h.b).unwrap_or(usize::MAX);
        if self.positions.len() != b {
            return Err(bad(format!(
                "positions has {} entries, not B = {}",
                self.positions.len(),
                h.b
            )));
        }
        if streams.end > b {
            return Err(bad(format!(
                "it has B = {} streams: streams {}..{} are not all in it",
                h.b, streams.start, streams.end
            )));
        }
        let size = corpus.size();
        let positions = self.positions[streams.clone()]
            .iter()
            .zip(streams.clone())
            .map(|(&p, i)| {
                u64::try_from(p).ok().filter(|&p| p < size).ok_or_else(|| {
                    bad(format!(
                        "positions[{i}] = {p} is not an offset in the corpus (0..{size})"
                    ))
                })
            })
            .collect::<Result<Vec<u64>>>()?;
        let contexts = contexts_at(&positions)?;
        match (h.version, &self.contexts) {
            (1, None) => {
                return Err(bad(
                    "the state has no \"contexts\": it is not a loader state".into(),
                ))
            }
            (1, Some(saved)) => {
                if saved.len() != b {
                    return Err(bad(format!(
                        "contexts has {} rows, not B = {}",
                        saved.len(),
                        h.b
                    )));
                }
                for (i, ctx) in streams.zip(&contexts) {
                    let row = &saved[i];
                    let got =
                        Context::from_values(row).map_err(|e| bad(format!("contexts[{i}] {e}")))?;
                    if got != *ctx {
                        return Err(bad(format!(
                            "contexts[{i}] = {row:?} is not the context the 64 bytes before \
                             positions[{i}] give ({:?}): it was not saved on this corpus",
                            ctx.to_array()
                        )));
                    }
                }
            }
            _ => {}
        }
        Ok((positions, contexts))
    }

    /// The state of all streams from the states of consecutive parts of them (the ranks'
    /// shares under torchrun), in order: their positions joined. The parts must come from
    /// loaders alike (one format and version, corpus, pack mode and feature version).
    pub fn join(parts: &[SavedState]) -> Result<SavedState> {
        let first = parts
            .first()
            .ok_or_else(|| Error::InvalidArgument("no loader states to join".into()))?;
        let mut positions = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let h = &part.header;
            let alike = StateHeader {
                b: first.header.b,
                ..h.clone()
            };
            if alike != first.header || part.contexts.is_some() {
                return Err(Error::InvalidArgument(format!(
                    "loader state {i} was not saved by a loader like state 0's (format, \
                     version, corpus, pack mode and feature version must be equal)"
                )));
            }
            if part.positions.len() as u64 != h.b {
                return Err(Error::InvalidArgument(format!(
                    "loader state {i} has B = {} and {} positions",
                    h.b,
                    part.positions.len()
                )));
            }
            positions.extend_from_slice(&part.positions);
        }
        Ok(SavedState {
            header: StateHeader {
                b: positions.len() as u64,
                ..first.header.clone()
            },
            positions,
            contexts: None,
        })
    }
}

/// What differs between two signatures, in words; `None` if they are equal.
pub fn signature_difference(saved: &[(String, u64)], here: &[(String, u64)]) -> Option<String> {
    let show = |s: Option<&(String, u64)>| match s {
        Some((name, size)) => format!("{name:?} ({size} bytes)"),
        None => "no shard".to_string(),
    };
    let i = (0..saved.len().max(here.len())).find(|&i| saved.get(i) != here.get(i))?;
    Some(format!(
        "the state has {} shards, this corpus {}; shard {i} is {} in the state, {} here",
        saved.len(),
        here.len(),
        show(saved.get(i)),
        show(here.get(i))
    ))
}
